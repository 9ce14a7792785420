"""ImageNet from its archives: `prep_rec imagenet` on the official archives, against the usual route (extract them,
sort val into class folders, then `prep_rec pack`) and against `cat` of the archives (the floor).

    .venv/bin/python -m bench.prep_imagenet [--classes 50] [--per-class 40] [--val 2000] [--rounds 3]
                                            [--read-mbps N]

The archives are ImageNet-shaped (tests/support/imagenet_archives.py: a tar of class tars, a flat val tar in shuffled
member order, the devkit, the odd files) and hold ImageNet-like JPEGs (500x375, ~110 KB, bench/prep_rec.py's
pictures); they are made once and kept in --cache. Every round times the three routes in a rotating order, each
after the archives (and anything the route reads) were dropped from the page cache with posix_fadvise(DONTNEED):
ImageNet's 155 GB never sits in the cache. The Python routes run under bench/prep_rec.py's wrapper, which starts
the clock after `import mxnet`: the ~2 s interpreter start says nothing about packing. The usual route is the
shell commands of DeepLearningExamples' and valprep.sh's recipe (tar -xf, then a mv per val image) followed by
`prep_rec pack` of train and val; its extra disk is the extracted tree. Prints each round, the medians, and last
the ratios.

Dropped from this machine's page cache, the archives still come from its host's cache at memory speed, so `cat`
is a memory copy here and every route is CPU-bound. --read-mbps N emulates a disk that reads N MB/s: each route
runs in a blkio cgroup (v1) whose reads from the archives' device are throttled to that rate (root only).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.prep_rec import RUN_TIMED, cold, fabric_jpeg
from rn50_mx import prep_rec
from tests.support import imagenet_archives as ia

EXTRACT = r"""set -euo pipefail
cd "$1"; archives=$2
mkdir train val
(cd train && tar -xf "$archives/ILSVRC2012_img_train.tar" &&
 for t in *.tar; do mkdir "${t%.tar}"; tar -xf "$t" -C "${t%.tar}"; rm "$t"; done)
(cd val && tar -xf "$archives/ILSVRC2012_img_val.tar" && bash "$3")
"""
OUTPUTS = {"ours": ("ours",), "usual": ("usual", "tree"), "cat": ()}  # what each route writes under the work folder


def make_archives(cache, classes, per_class, val):
    """The archives in cache, made once per size; returns ({val file: WNID}, images in all)."""
    done = os.path.join(cache, f"complete-{classes}-{per_class}-{val}.json")
    if not os.path.exists(done):
        wnids = ia.WNIDS + tuple(f"n02{i:06d}" for i in range(classes - len(ia.WNIDS)))
        images, _ = prep_rec.load_fashion_mnist("train")
        rng = np.random.RandomState(0)
        net = ia.make(wnids, per_class, val, picture=lambda i: fabric_jpeg(images, i % len(images), rng),
                      quality=96)
        shutil.rmtree(cache, ignore_errors=True)
        ia.write_archives(net, cache)
        with open(done, "w") as f:
            json.dump([net.val_class, sum(map(len, net.train.values())) + len(net.val)], f)
    with open(done) as f:
        return json.load(f)


def valprep(val_class, path):
    """valprep.sh for these archives: a mkdir per class and a mv per val image."""
    with open(path, "w") as f:
        f.writelines(f"mkdir -p {wnid}\n" for wnid in sorted(set(val_class.values())))
        f.writelines(f"mv {name} {wnid}/\n" for name, wnid in sorted(val_class.items()))


def throttled(read_mbps, path):
    """A command prefix that runs its command with reads from path's device limited to read_mbps (blkio cgroup),
    or [] for no limit."""
    if not read_mbps:
        return []
    group = "/sys/fs/cgroup/blkio/rn50-bench-prep"
    os.makedirs(group, exist_ok=True)
    device = os.stat(path).st_dev
    with open(os.path.join(group, "blkio.throttle.read_bps_device"), "w") as f:
        f.write(f"{os.major(device)}:{os.minor(device)} {int(read_mbps * 1e6)}")
    return ["bash", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "throttled"]


def timed(command, clock):
    """(wall seconds, seconds after the imports) of a python command under RUN_TIMED."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    with open(clock) as f:
        return wall, float(f.read())


def disk_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--val", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="ours: --workers (default: the command's 8)")
    parser.add_argument("--read-mbps", type=float, default=0, help="emulate a disk reading this many MB/s")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "rn50-mx-bench-imagenet"))
    args = parser.parse_args()
    val_class, images = make_archives(args.cache, args.classes, args.per_class, args.val)
    archives = [os.path.join(args.cache, name) for name in (ia.TRAIN_TAR, ia.VAL_TAR, ia.DEVKIT)]
    size = sum(map(os.path.getsize, archives))
    print(f"archives: {args.classes} classes, {images} images ({size / 1e6:.0f} MB, "
          f"{size / images / 1e3:.0f} KB per image) in {args.cache}; reads "
          + (f"throttled to {args.read_mbps:.0f} MB/s" if args.read_mbps else "not throttled"))
    work = tempfile.mkdtemp(prefix="bench-prep-imagenet-")
    clock = os.path.join(work, "seconds")
    limit = throttled(args.read_mbps, args.cache)
    python = [*limit, sys.executable, "-c", RUN_TIMED, clock]
    valprep(val_class, os.path.join(work, "valprep.sh"))
    times, extra = {"ours": [], "usual": [], "cat": []}, 0

    def ours():
        out = os.path.join(work, "ours")
        return timed([*python, "rn50_mx.prep_rec", "imagenet", args.cache, out, "--no-progress",
                      "--workers", str(args.workers)], clock)[1]

    def usual():
        nonlocal extra
        tree, out = os.path.join(work, "tree"), os.path.join(work, "usual")
        os.makedirs(tree)
        start = time.perf_counter()
        subprocess.run([*limit, "bash", "-c", EXTRACT, "extract", tree, args.cache, os.path.join(work, "valprep.sh")],
                       check=True)
        extract = time.perf_counter() - start
        extra = disk_bytes(tree)
        pack = [*python, "rn50_mx.prep_rec", "pack", "--no-progress", "--workers", str(args.workers)]
        train = timed([*pack, os.path.join(tree, "train"), os.path.join(out, "train")], clock)[1]
        val = timed([*pack, os.path.join(tree, "val"), os.path.join(out, "val"), "--classes-from",
                     os.path.join(out, "train.lst")], clock)[1]
        return extract + train + val

    def cat():
        start = time.perf_counter()
        subprocess.run([*limit, "cat", *archives], check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start

    routes = {"ours": ours, "usual": usual, "cat": cat}
    names = list(routes)
    try:
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                for old in OUTPUTS[name]:
                    shutil.rmtree(os.path.join(work, old), ignore_errors=True)
                subprocess.run(["sync"], check=True)
                cold(archives)
                times[name].append(routes[name]())
            print(f"round {r + 1}: " + ", ".join(f"{name} {times[name][-1]:.2f} s" for name in names), flush=True)
        for name in ("train.lst", "val.lst", "val.rec", "val.idx"):  # the same files by both routes (train's
            with open(os.path.join(work, "ours", name), "rb") as a, \
                    open(os.path.join(work, "usual", name), "rb") as b:  # records differ in its odd files)
                assert a.read() == b.read(), f"{name} differs"
    finally:
        shutil.rmtree(work)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in median.items():
        print(f"median of {args.rounds}: {name} {t:.2f} s = {size / t / 1e6:.0f} MB/s = {images / t:.0f} images/s")
    print(f"usual route's extra disk: {extra / 1e6:.0f} MB (the extracted tree; ours: none)")
    print(f"ratios of medians: ours/cat {median['ours'] / median['cat']:.2f} (bar <= 1.3); "
          f"usual/ours {median['usual'] / median['ours']:.2f} (bar >= 2)")


if __name__ == "__main__":
    main()
