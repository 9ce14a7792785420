"""python -m rn50_mx.tune against the baselines, on the demo configuration and on an input-bound one.

    .venv/bin/python bench/tune.py [--rounds 2] [--steps 2] [--only demo|input-bound]

Two configurations, one after the other in one run, each on its own data:
- demo: config/CPU.sh (ResNet-50 at 32x32, LARS, OMP_NUM_THREADS = all cores) at batch 16 instead of 128 (--batch),
  to fit the run in 25 minutes on 2 cores, on Fashion-MNIST (PER_CLASS per class, `rn50_mx.prep_rec.make_fashion_mnist`);
- input-bound: the same step on big JPEGs (bench/prep_rec.py's 500x375 pictures scaled to 3000x2250),
  with 1 DALI thread, no fused decode and a prefetch depth of 1.
For each, in the tuner's search space (rn50_mx/tune/space.py: DALI threads, OpenMP threads, fused decode, prefetch):
the full grid, every point timed for ROUNDS windows, its best by images/s; then the tuner's search
(rn50_mx/tune/search.py, no budget, target 0.98); and last, side by side in alternating rounds with synthetic
batches, the settings of: the config as sourced ("defaults"), the rule of thumb "threads 3-5, prefetch 2" (3
threads here), the grid's best, and the tuner's choice (the same settings timed once). Every window is rn50_mx/measure.py's (DRAIN untimed steps,
STEPS timed), in this process or, for another OMP_NUM_THREADS, in a worker process (rn50_mx/tune/workers.py).

Prints a line per grid point and per tuner candidate, then for each config real/synthetic of each contender and the
minutes each search took; the last line: the tuner's real/synthetic over the grid best's and its time over the
grid's, per config, and the tuner's real images/s over the defaults' on the input-bound config.

Measured here (12 min, 2 cores, the machine to itself): demo, ours/grid best real/synthetic 1.001 in 0.07 of its
time; input-bound, 1.125 in 0.30 of its time, and 1.65x the defaults' real images/s (README "Tuning the input
pipeline").
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from train_step import demo_data, demo_environ  # noqa: E402  (bench/train_step.py, beside this file)

from rn50_mx import config, measure  # noqa: E402
from rn50_mx.errors import run_cli  # noqa: E402

CACHE = os.path.join(tempfile.gettempdir(), "rn50_mx_bench_tune")
PER_CLASS = 60  # demo train photographs per class
BIG = (3000, 2250)  # input-bound JPEG size: decoding one takes longer than training on it
BIG_COUNT = 160
INPUT_BOUND = {"DALI_THREADS": "1", "DALI_ROI_DECODE": "0", "DALI_PREFETCH_QUEUE": "1"}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=2, help="counted rounds per grid point and per comparison")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per window")
    parser.add_argument("--final-rounds", type=int, default=5, help="rounds of the last side-by-side comparison")
    parser.add_argument("--batch", type=int, default=16, help="images per step (config/CPU.sh has 128)")
    parser.add_argument("--only", choices=("demo", "input-bound"), help="one configuration only")
    return parser.parse_args()


def big_jpegs():
    """Prefix of the input-bound .rec: bench/prep_rec.py's pictures scaled to BIG, made once."""
    from PIL import Image

    import prep_rec as bench_prep  # bench/prep_rec.py
    from rn50_mx import prep_rec

    prefix = os.path.join(CACHE, f"big-{BIG[0]}-{BIG_COUNT}", "train")
    if os.path.exists(prefix + ".idx"):
        return prefix
    tree = os.path.join(CACHE, "tree")
    bench_prep.make_tree(tree, BIG_COUNT)
    for folder, _, files in os.walk(tree):
        for name in files:
            if name.endswith(".jpg"):
                path = os.path.join(folder, name)
                Image.open(path).resize(BIG, Image.Resampling.BICUBIC).save(path, quality=90)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    prep_rec.pack(tree, prefix, shuffle=True)
    return prefix


def configurations(only, batch):
    """{name: settings} of the two configurations."""
    environ = {**demo_environ(), "BATCHSIZE": str(batch)}
    size = config.load([], environ, prog="bench/tune.py").image_chw[1]
    found = {}
    if only in (None, "demo"):
        found["demo"] = config.load(["--data-train", demo_data(PER_CLASS, size) + ".rec", "--seed", "1"], environ,
                                    prog="bench/tune.py")
    if only in (None, "input-bound"):
        found["input-bound"] = config.load(["--data-train", big_jpegs() + ".rec", "--seed", "1"],
                                           {**environ, **INPUT_BOUND}, prog="bench/tune.py")
    return found


def grid(pool, s, args):
    """(the grid's best knobs, its seconds): every point of the search space timed for args.rounds windows."""
    from rn50_mx.tune import space

    tic, best, best_rate = time.perf_counter(), None, 0.0
    for knobs in space.grid(s):
        timer = pool.timer(knobs, args.steps)
        rate = measure.median([timer() for _ in range(args.rounds)])
        print(f"  grid {space.describe(knobs):70} {rate.images_per_s:7.1f} img/s", flush=True)
        if rate.images_per_s > best_rate:
            best, best_rate = knobs, rate.images_per_s
    return best, time.perf_counter() - tic


def ours(pool, s, args):
    """(the tuner's choice, its seconds)."""
    from rn50_mx.tune import output, search, space

    run = search.Search(pool, space.start(s), space.searched(s, False), float("inf"), 0.98, args.steps, args.rounds,
                        progress=lambda row: print("  tune " + output.row_line(row), flush=True))
    choice = run.run()
    print(f"  tune stopped: {run.stop}")
    return choice, run.elapsed()


def final(pool, s, contenders, args):
    """{name: median Rate} of synthetic batches and each contender's knobs, side by side; contenders with the same
    knobs are timed once (the same settings: any difference between them would be noise)."""
    from rn50_mx.tune import space

    same = {name: space.describe(knobs) for name, knobs in contenders.items()}
    timers = {"synthetic": pool.timer(None, args.steps)}
    timers.update((same[name], pool.timer(knobs, args.steps)) for name, knobs in contenders.items())
    for timer in timers.values():
        timer()
    rates = {key: measure.median(values) for key, values in measure.side_by_side(timers, args.final_rounds).items()}
    return {"synthetic": rates["synthetic"], **{name: rates[key] for name, key in same.items()}}


def bench(name, s, args):
    """One configuration: the grid, the tuner, the final comparison; returns its summary figures."""
    from rn50_mx import dist
    from rn50_mx.tune import space, workers

    print(f"{name}: batch {s.batch_size}, {s.image_shape}, {s.data_train}; start {space.describe(space.start(s))}",
          flush=True)
    pool = workers.Workers(s, dist.context(s, 0))
    try:
        best, grid_s = grid(pool, s, args)
        choice, ours_s = ours(pool, s, args)
        start = space.start(s)
        contenders = {"defaults": start, "threads 3-5, prefetch 2": {**start, "dali_threads": 3,
                                                                      "dali_prefetch_queue": 2},
                      "grid's best": best, "ours": choice}
        rates = final(pool, s, contenders, args)
    finally:
        pool.close()
    synthetic = rates["synthetic"].images_per_s
    minutes = {"grid's best": grid_s / 60, "ours": ours_s / 60}
    print(f"{name}: synthetic {synthetic:.1f} img/s")
    for contender, knobs in contenders.items():
        r = rates[contender]
        searched = f", search {minutes[contender]:.1f} min" if contender in minutes else ""
        print(f"  {contender:26} {space.describe(knobs):70} {r.images_per_s:7.1f} img/s, real/synthetic "
              f"{r.images_per_s / synthetic:.3f}, wait {r.wait_share:.0%}, {1000 / r.images_per_cpu_s:.1f} CPU ms/img"
              f"{searched}", flush=True)
    return {"quality": rates["ours"].images_per_s / rates["grid's best"].images_per_s,
            "time": ours_s / grid_s, "over defaults": rates["ours"].images_per_s / rates["defaults"].images_per_s}


def main():
    args = parse_args()
    # MXNet reads OMP_NUM_THREADS when it loads: the config's, as training would have it.
    os.environ["OMP_NUM_THREADS"] = demo_environ()["OMP_NUM_THREADS"]
    results = {name: bench(name, s, args) for name, s in configurations(args.only, args.batch).items()}
    print("; ".join(f"{name}: ours/grid best real/synthetic {r['quality']:.3f} in {r['time']:.2f} of its time, "
                    f"ours/defaults img/s {r['over defaults']:.2f}" for name, r in results.items()))


if __name__ == "__main__":
    run_cli(main, "bench/tune.py")
