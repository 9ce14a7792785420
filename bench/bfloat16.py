"""The demo in float32 against bfloat16, side by side on the same fresh seeds: images/s, data wait, epochs and minutes
to the target.

    .venv/bin/python bench/bfloat16.py [--seeds 10] [--first-seed N] [--data data/fashion-mnist]
                                       [rn50_mx.train flags, e.g. --num-epochs 5]

Each contender is `python -m rn50_mx.train` as `make demo` runs it (config/CPU.sh sourced, one process) on the
Fashion-MNIST that `make demo` packed (--data: train.rec and val.rec), with DTYPE=float32 or DTYPE=bfloat16 and
nothing else changed (the fallback off: a bfloat16 run never becomes float32); the flags given apply to both. Every
seed runs both contenders, the order alternating from one seed to the next, so that other work on the machine weighs
on both alike. The seeds are fresh: drawn at random unless --first-seed gives the first of consecutive ones (to
repeat a bench). Per run: its status and top-1, the epochs to the target, the minutes from run_start to run_stop
(MLPerf's score, rn50_mx.timing) and the median images/s and data wait of its epochs; the last lines give each
dtype's medians and misses, and bfloat16 / float32.
Each run's MLPerf log and output stay in results/bench-bfloat16/.

bfloat16 needs a CPU with avx512_bf16 or amx_bf16: on another, the bench stops at the first bfloat16 run with
config's one line.
"""
import argparse
import os
import random
import re
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rn50_mx import timing  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "bench-bfloat16")
DTYPES = ("float32", "bfloat16")
EPOCH_LINE = re.compile(r"^epoch (\d+): ([\d.]+) img/s, data wait ([\d.]+)%", re.M)


def train(dtype, seed, data, flags):
    """One demo run: (its timing.Run, [(images/s, data wait share)] per epoch)."""
    name = os.path.join(RESULTS, f"{dtype}-seed{seed}")
    args = ["-m", "rn50_mx.train", "--data-train", os.path.join(data, "train.rec"), "--data-val",
            os.path.join(data, "val.rec"), "--seed", str(seed), "--mllog-file", name + ".log", *flags]
    command = f"source config/CPU.sh && DTYPE={dtype} RN50_BFLOAT16_FALLBACK=0 exec {shlex.quote(sys.executable)} " + \
        " ".join(map(shlex.quote, args))
    env = {k: v for k, v in os.environ.items() if k not in ("DATADIR", "DTYPE")}
    if os.path.exists(name + ".log"):
        os.remove(name + ".log")  # a log holds one run
    with open(name + ".out", "w") as out:
        code = subprocess.run(["bash", "-c", command], cwd=ROOT, env={**env, "PYTHONPATH": ROOT}, stdout=out,
                              stderr=subprocess.STDOUT).returncode
    text = open(name + ".out").read()
    if code:
        sys.exit(f"bench/bfloat16.py: {dtype}, seed {seed}: training failed ({name}.out): "
                 f"{text.strip().splitlines()[-1] if text.strip() else 'no output'}")
    epochs = [(float(speed), float(wait) / 100) for _, speed, wait in EPOCH_LINE.findall(text)]
    return timing.read_run(name + ".log", "1.0.0"), epochs


def row(dtype, seed, run, epochs):
    speed = statistics.median(s for s, _ in epochs)
    wait = statistics.median(w for _, w in epochs)
    minutes = f"{run.minutes:.2f}" if run.minutes is not None else "-"
    top1 = f"{run.top1:.4f}" if run.top1 is not None else "-"
    return (f"{dtype:>9} seed {seed:>5}: {run.status:>8}, top-1 {top1}, epochs {run.converged_epoch or '-'}, "
            f"minutes {minutes}, {speed:.1f} img/s, data wait {wait:.1%}")


def summary(dtype, results):
    """(line, median minutes of the runs that reached the target) of one dtype's runs."""
    reached = [run for run, _ in results if run.status == "success"]
    speed = statistics.median(s for _, epochs in results for s, _ in epochs)
    wait = statistics.median(w for _, epochs in results for _, w in epochs)
    epochs = statistics.median(run.converged_epoch for run in reached) if reached else None
    minutes = statistics.median(run.minutes for run in reached) if reached else None
    line = (f"median {dtype:>9}: {len(results) - len(reached)} of {len(results)} missed, epochs {epochs or '-'}, "
            f"minutes {'-' if minutes is None else f'{minutes:.2f}'}, {speed:.1f} img/s, data wait {wait:.1%}")
    return line, minutes, speed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="fresh seeds, each run in both dtypes")
    parser.add_argument("--first-seed", type=int, help="seeds FIRST, FIRST+1, ... (default: drawn at random)")
    parser.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist"),
                        help="folder of train.rec and val.rec (make demo packs data/fashion-mnist)")
    args, flags = parser.parse_known_args()
    for split in ("train", "val"):
        if not os.path.isfile(os.path.join(args.data, f"{split}.rec")):
            sys.exit(f"bench/bfloat16.py: --data {args.data}: no {split}.rec (make demo packs data/fashion-mnist)")
    os.makedirs(RESULTS, exist_ok=True)
    first = args.first_seed if args.first_seed is not None else random.SystemRandom().randint(0, 65535)
    results = {dtype: [] for dtype in DTYPES}
    for i, seed in enumerate(range(first, first + args.seeds)):
        for dtype in DTYPES if i % 2 == 0 else DTYPES[::-1]:
            run, epochs = train(dtype, seed, args.data, flags)
            results[dtype].append((run, epochs))
            print(row(dtype, seed, run, epochs), flush=True)
    summaries = [summary(dtype, results[dtype]) for dtype in DTYPES]
    for line, _, _ in summaries:
        print(line)
    (_, full_minutes, full_speed), (_, low_minutes, low_speed) = summaries
    ratio = f", minutes x{low_minutes / full_minutes:.3f}" if full_minutes and low_minutes else ""
    print(f"bfloat16 / float32: images/s x{low_speed / full_speed:.3f}{ratio}")


if __name__ == "__main__":
    main()
