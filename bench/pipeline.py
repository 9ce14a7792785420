"""Train input throughput: our DALI pipeline + iterator against MXNet's ImageRecordIter, side by side.

    .venv/bin/python bench/pipeline.py [--images 1200] [--batch 64] [--threads 2] [--rounds 7] [--sweep]

Same augmentation and the same worker threads for every contender: random-resized crop (area [0.05, 1],
aspect [3/4, 4/3]) to 224x224 with a bilinear filter, random mirror, ImageNet mean/std, float32 NCHW batches as
mx.nd on the CPU. ImageRecordIter resizes with OpenCV's bilinear filter, which does not antialias, so "ours"
runs with --dali-resize-antialias 0; "ours antialiased" is DALI's default filter (the reference's).
Contenders:
  ours              readers.mxnet -> fused decoders.image_random_crop -> experimental.warp_perspective (a pure
                    scale: plain bilinear, what rn50_mx/data/pipeline.py uses without antialiasing) -> crop_mirror_normalize -> our
                    DataIter
  ours non-fused    decoders.image -> random_resized_crop (DALI's resampling kernel, not antialiased)
  ours antialiased  the fused decode -> fn.resize with its default antialiasing
  ImageRecordIter   random_resized_crop=True, preprocess_threads=THREADS
--sweep adds prefetch depths 1 and 4 and one more thread.

"Resize alone" times the train resize by itself on one batch of crops that DALI decoded once (the same crops
for every variant, fed by external_source): fn.resize without antialiasing, data.stretch (the warp ours uses;
same values within 1 level) and fn.resize antialiased, in CPU-milliseconds per image, medians over the rounds.

The data: IMAGES ImageNet-like JPEGs, the same as bench/prep_rec.py makes (500x375, quality 95, ~100 KB:
coloured Fashion-MNIST photographs), packed with rn50_mx.prep_rec.pack and cached in $TMPDIR/rn50_mx_bench_pipeline.

Each round times every contender in turn; before its timed batches each contender first drains what its
workers prefetched while the others were being timed (a head start that would flatter it). The figures are
the medians over the rounds, in images/s and in images per CPU-second of the process. On cores shared with other
work the wall rates swing from round to round (OpenMP threads also spin while they wait, which costs
ImageRecordIter extra wall time there); the CPU rate hardly moves. Last line: images/s of each, and
ours / ImageRecordIter.
"""
import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1200, help="JPEGs in the benchmark .rec (>= 1000)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="decode/augment threads of every contender")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per contender and round")
    parser.add_argument("--drain", type=int, default=5, help="untimed batches first (ImageRecordIter prefetches 4)")
    parser.add_argument("--sweep", action="store_true", help="also time prefetch depths 1 and 4 and one more thread")
    return parser.parse_args(argv)


ARGS = parse_args()
# MXNet's CPU ImageRecordIter decodes on OpenMP threads, whatever preprocess_threads says, and MXNet starts with
# half the logical CPUs (1 thread on a 2-core machine): give it the same threads as ours before MXNet loads.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from nvidia.dali import fn  # noqa: E402
from nvidia.dali.pipeline import Pipeline  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rn50_mx import data, prep_rec  # noqa: E402
from rn50_mx.config import Settings  # noqa: E402
from prep_rec import make_tree  # noqa: E402  (bench/prep_rec.py, beside this file)

CACHE = os.path.join(tempfile.gettempdir(), "rn50_mx_bench_pipeline")
def make_rec(count):
    """PREFIX of a packed .rec of `count` ImageNet-like JPEGs (bench/prep_rec.py's tree), made once and cached."""
    prefix = os.path.join(CACHE, f"fabric{count}")
    if os.path.exists(prefix + ".idx"):  # pack publishes the .idx last
        return prefix
    root = os.path.join(CACHE, f"jpegs{count}")
    make_tree(root, count)
    print(prep_rec.pack(root, prefix, workers=2).line(""), file=sys.stderr)
    return prefix


def ours(prefix, args, **changes):
    """Our train iterator (rank 0 of 1) with ImageRecordIter's augmentation, unless `changes` say otherwise."""
    s = Settings(data_train=prefix + ".rec", batch_size=args.batch, image_shape="3,224,224", num_classes=10,
                 dali_threads=args.threads, min_random_area=0.05, max_random_area=1.0,
                 min_random_aspect_ratio=3 / 4, max_random_aspect_ratio=4 / 3, dtype="float32",
                 input_layout="NCHW", dali_resize_antialias=False)
    train, _ = data.make_iters(dataclasses.replace(s, **changes), 0, 1, 1, mx.cpu())
    return endless(train)


def image_record_iter(prefix, args):
    """MXNet's C++ record iterator with the same augmentation: OpenCV bilinear resize, no antialiasing."""
    return endless(mx.io.ImageRecordIter(
        path_imgrec=prefix + ".rec", path_imgidx=prefix + ".idx", data_shape=(3, 224, 224),
        batch_size=args.batch, shuffle=True, preprocess_threads=args.threads, ctx="cpu", dtype="float32",
        random_resized_crop=True, min_random_area=0.05, max_random_area=1.0, min_aspect_ratio=3 / 4,
        max_aspect_ratio=4 / 3, rand_mirror=True, inter_method=1,
        mean_r=data.MEAN[0], mean_g=data.MEAN[1], mean_b=data.MEAN[2],
        std_r=data.STD[0], std_g=data.STD[1], std_b=data.STD[2], verbose=True))


def resize_alone(prefix, args):
    """{variant: CPU-ms per image} of the train resize alone, on the same decoded random crops."""
    s = Settings(batch_size=args.batch, dali_resize_antialias=False)
    decode = Pipeline(batch_size=args.batch, num_threads=args.threads, device_id=None, seed=1)
    with decode:
        jpegs, _ = fn.readers.mxnet(path=[prefix + ".rec"], index_path=[prefix + ".idx"], random_shuffle=True)
        decode.set_outputs(fn.decoders.image_random_crop(jpegs, random_area=[0.05, 1.0]))
    decode.build()
    crops = [np.array(crop) for crop in decode.run()[0]]
    variants = {"fn.resize": lambda x: fn.resize(x, resize_x=224, resize_y=224, antialias=False),
                "ours (warp)": lambda x: data.stretch(x, 224, 224, s),
                "fn.resize antialiased": lambda x: fn.resize(x, resize_x=224, resize_y=224)}
    pipes = {}
    for name, resize in variants.items():
        pipes[name] = Pipeline(batch_size=args.batch, num_threads=args.threads, device_id=None)
        with pipes[name]:
            pipes[name].set_outputs(resize(fn.external_source(source=lambda: crops, batch=True, layout="HWC")))
        pipes[name].build()
        pipes[name].run()
    ms = {name: [] for name in pipes}
    for _ in range(args.rounds):
        for name, pipe in pipes.items():
            cpu = time.process_time()
            for _ in range(args.batches):
                pipe.run()
            ms[name].append((time.process_time() - cpu) * 1000 / (args.batches * args.batch))
    return {name: statistics.median(v) for name, v in ms.items()}


def contenders(prefix, args):
    """name -> endless batches of each contender."""
    runs = {"ours": ours(prefix, args),
            "ours non-fused": ours(prefix, args, dali_roi_decode=False),
            "ours antialiased": ours(prefix, args, dali_resize_antialias=True),
            "ImageRecordIter": image_record_iter(prefix, args)}
    if args.sweep:
        runs.update({"ours prefetch 1": ours(prefix, args, dali_prefetch_queue=1),
                     "ours prefetch 4": ours(prefix, args, dali_prefetch_queue=4),
                     f"ours {args.threads + 1} threads": ours(prefix, args, dali_threads=args.threads + 1)})
    return runs


def endless(it):
    """Batches across epochs, each waited for, so that a contender is timed until its data is really there."""
    while True:
        for batch in it:
            batch.data[0].wait_to_read()
            yield batch
        it.reset()


def measure(batches, args):
    """(images/s, images per CPU-second of this process) over args.batches batches, after draining the head start.

    The CPU rate hardly moves when other processes share the cores; the wall rate is what training sees."""
    for _ in range(args.drain):
        next(batches)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        next(batches)
    images = args.batches * args.batch
    return images / (time.perf_counter() - wall), images / (time.process_time() - cpu)


def main(args):
    prefix = make_rec(args.images)
    runs = contenders(prefix, args)
    rates = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, batches in runs.items():
            rates[name].append(measure(batches, args))
        print(f"round {r + 1}: " + ", ".join(f"{name} {v[-1][0]:.0f}" for name, v in rates.items()), flush=True)
    wall = {name: statistics.median(w for w, _ in v) for name, v in rates.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in rates.items()}
    print(f"{args.images} JPEGs, batch {args.batch}, {args.threads} threads, {args.rounds} rounds x {args.batches} "
          "batches; medians; images/s (images per CPU-second):")
    for name in runs:
        print(f"  {name:22s} {wall[name]:6.0f} ({cpu[name]:4.0f})  x{wall[name] / wall['ImageRecordIter']:.2f} "
              f"(x{cpu[name] / cpu['ImageRecordIter']:.2f}) of ImageRecordIter")
    resize = resize_alone(prefix, args)
    print("resize alone, CPU-ms per image: " + ", ".join(f"{name} {v:.3f}" for name, v in resize.items())
          + f"; fn.resize / ours {resize['fn.resize'] / resize['ours (warp)']:.2f}x")
    print(f"ours {wall['ours']:.0f} img/s, ours non-fused {wall['ours non-fused']:.0f} img/s, "
          f"ImageRecordIter {wall['ImageRecordIter']:.0f} img/s; "
          f"ours/ImageRecordIter {wall['ours'] / wall['ImageRecordIter']:.2f}x "
          f"(per CPU-second {cpu['ours'] / cpu['ImageRecordIter']:.2f}x), "
          f"fused/non-fused {wall['ours'] / wall['ours non-fused']:.2f}x")


if __name__ == "__main__":
    main(ARGS)
