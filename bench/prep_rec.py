"""Packing speed: our `prep_rec pack --workers 2` against `im2rec.py --pass-through --num-thread 2`, and `cat`.

    .venv/bin/python bench/prep_rec.py [--images 2000] [--rounds 5] [--cache DIR]

The input is a tree of ImageNet-like JPEGs (500x375, about 100 KB: upscaled Fashion-MNIST garments in smooth
colour over a woven texture), made once and kept in DIR. Every command runs as a user runs it, in a fresh
process, on im2rec's own .lst of the tree; `cat` of the same files to /dev/null is the floor. Both packers pay
the same ~2 s start-up (Python + `import mxnet`), which is noisy on a shared machine and says nothing about
packing, so each packer runs under a wrapper that imports the heavy modules, starts a clock and runs the packer
module as __main__: "pack" is that time, "wall" the whole process.
Each command is timed twice per round: warm, after every file was read once, and cold, after every file was
dropped from the page cache with posix_fadvise(DONTNEED) (the whole cache cannot be dropped here, but a file's
own pages can), which is how ImageNet is packed: 140 GB never sits in the cache. The previous outputs are
deleted before each command, and the order of the commands rotates from round to round. im2rec needs cv2
(opencv-python-headless). Prints images/s per round, then the medians; the last line is the ratios of the
medians of the pack times.
"""
import argparse
import filecmp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from rn50_mx import prep_rec

WIDTH, HEIGHT = 500, 375
# python -c RUN_TIMED TIME_FILE MODULE ARGS...: run MODULE as __main__ after the imports, writing its seconds.
RUN_TIMED = """
import runpy, sys, time
import cv2, mxnet, numpy, PIL.Image, tqdm
out, sys.argv = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
finally:
    with open(out, "w") as f:
        f.write(str(time.perf_counter() - start))
"""


def fabric_jpeg(images, i, rng):
    """One 500x375 RGB picture: garment i upscaled, coloured over a two-colour ramp, woven with a tiled
    16-pixel copy of another garment (saved at quality 95 this gives ~100 KB, like an ImageNet photo)."""
    garment = Image.fromarray(images[i]).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC)
    garment = np.asarray(garment, np.float32)[..., None] / 255
    tile = np.asarray(Image.fromarray(images[(7 * i + 1) % len(images)]).resize((16, 16), Image.Resampling.BILINEAR))
    weave = np.tile(tile, (HEIGHT // 16 + 1, WIDTH // 16 + 1))[:HEIGHT, :WIDTH, None].astype(np.float32) / 255
    colour, left, right = rng.uniform(40, 255, (3, 3))
    ramp = np.linspace(0, 1, WIDTH, dtype=np.float32)[None, :, None]
    rgb = (garment * colour + (1 - garment) * (left * (1 - ramp) + right * ramp)) * (0.4 + 0.6 * weave)
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


def make_tree(root, count):
    """`count` JPEGs in the 10 Fashion-MNIST class folders under root, unless a finished tree is there."""
    done = os.path.join(root, f".complete-{count}")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    images, labels = prep_rec.load_fashion_mnist("train")
    rng = np.random.RandomState(0)
    for name in prep_rec.FASHION_MNIST_CLASSES:
        os.makedirs(os.path.join(root, name))
    for i in range(count):
        path = os.path.join(root, prep_rec.FASHION_MNIST_CLASSES[labels[i]], f"{i:06d}.jpg")
        fabric_jpeg(images, i, rng).save(path, quality=95)
    open(done, "w").close()


def warm(paths):
    """Read every file once, so that the next command finds them all in the page cache."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass


def cold(paths):
    """Drop every file's pages from the page cache, so that the next command reads them from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def seconds(command, time_file):
    """(wall seconds, pack seconds) of one command; pack = wall for a command without RUN_TIMED."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if RUN_TIMED not in command:
        return wall, wall
    with open(time_file) as f:
        return wall, float(f.read())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "rn50-mx-bench-jpegs"))
    args = parser.parse_args()
    make_tree(args.cache, args.images)
    work = tempfile.mkdtemp(prefix="bench-prep-rec-")
    try:
        lst = os.path.join(work, "im2rec", "bench.lst")  # alone in its folder: im2rec packs every PREFIX*.lst
        os.makedirs(os.path.dirname(lst))
        subprocess.run([sys.executable, "-m", "mxnet.tools.im2rec", "--list", "--recursive", lst[:-4], args.cache],
                       check=True, stdout=subprocess.DEVNULL)
        paths = [os.path.join(args.cache, item.path) for item in prep_rec.read_lst(lst)]
        with open(os.path.join(work, "files"), "wb") as f:
            f.write(b"\0".join(os.fsencode(p) for p in paths))
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(f"{len(paths)} JPEGs of {WIDTH}x{HEIGHT}, {mb:.0f} MB ({mb / len(paths) * 1000:.0f} KB each), "
              f"in {args.cache}")
        clock = os.path.join(work, "seconds")
        timed = [sys.executable, "-c", RUN_TIMED, clock]
        ours = [*timed, "rn50_mx.prep_rec", "pack", args.cache, "--list", lst, "--no-progress"]
        commands = {  # name: (command, prefix of the .rec/.idx it writes)
            "ours --workers 2": ([*ours, os.path.join(work, "ours"), "--workers", "2"], os.path.join(work, "ours")),
            "ours --workers 1": ([*ours, os.path.join(work, "ours1"), "--workers", "1"], os.path.join(work, "ours1")),
            "im2rec --num-thread 2": ([*timed, "mxnet.tools.im2rec", "--pass-through", "--num-thread", "2",
                                       lst[:-4], args.cache], lst[:-4]),
            "cat": (["xargs", "-0", "-a", os.path.join(work, "files"), "cat"], None),
        }
        times = {(cache, name): [] for cache in ("warm", "cold") for name in commands}
        names = list(commands)
        for r in range(args.rounds):
            for cache, prepare in (("warm", warm), ("cold", cold)):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    command, prefix = commands[name]
                    for old in (f"{prefix}.rec", f"{prefix}.idx") if prefix else ():
                        if os.path.exists(old):
                            os.remove(old)
                    prepare(paths)
                    times[cache, name].append(seconds(command, clock))
                print(f"round {r + 1} {cache}: " + ", ".join(
                    f"{name} {len(paths) / times[cache, name][-1][1]:.0f}" for name in names) + " img/s")
            if r == 0:  # the two packers must have written the same bytes
                for ext in (".rec", ".idx"):
                    assert filecmp.cmp(os.path.join(work, "ours" + ext), lst[:-4] + ext, shallow=False)
    finally:
        shutil.rmtree(work)
    pack = {key: statistics.median(p for _, p in t) for key, t in times.items()}
    wall = {key: statistics.median(w for w, _ in t) for key, t in times.items()}
    for (cache, name), t in pack.items():
        print(f"median of {args.rounds}, {cache}: {name}: pack {t:.2f} s = {len(paths) / t:.0f} img/s "
              f"= {mb / t:.0f} MB/s; wall {wall[cache, name]:.2f} s")
    print("ratios of images/s (medians of pack time): " + "; ".join(
        f"{cache}: ours/im2rec {pack[cache, 'im2rec --num-thread 2'] / pack[cache, 'ours --workers 2']:.2f} "
        f"ours/cat {pack[cache, 'cat'] / pack[cache, 'ours --workers 2']:.2f}" for cache in ("warm", "cold")))

if __name__ == "__main__":
    main()
