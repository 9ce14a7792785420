"""python -m rn50_mx.search on the demo (config/CPU.sh on the packed Fashion-MNIST of `make demo`), closed then open,
each within a budget of trials, and the winner against config/CPU.sh on the same fresh seeds.

    .venv/bin/python bench/search.py [--trials 8] [--final-seeds 5] [--only closed|open] [--data data/fashion-mnist]

closed: the default space (NUMEPOCHS, LR, WARMUP_EPOCHS around the config's), objective epochs; open: --mode open
with --objective minutes over the weight EMA, the horizon, the batch (it trades images/s against epochs), LR, label
smoothing and warmup, planned in that order (the EMA first: the lever most likely to save the demo an epoch). Each prints the
search's own lines and table; the last line per mode: the winner's olympic epochs (or minutes) over the sourced
config's on the same seeds. A run of the demo takes 3-4 minutes on 2 cores: 8 trials and 2 sets x 5 seeds take about
an hour per mode. Results go to results/bench-search/ (the studies continue when the bench is run again).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(mode, args):
    flags = ["--trials", str(args.trials), "--final-seeds", str(args.final_seeds), "--study", f"demo-{mode}",
             "--results", os.path.join(ROOT, "results", "bench-search", mode),
             "--out", os.path.join(ROOT, "results", "bench-search", mode, "config")]
    if mode == "open":
        flags += ["--mode", "open", "--objective", "minutes", "--knob", "RN50_EMA_DECAY=0:0.99", "--knob",
                  "NUMEPOCHS=3:5", "--knob", "BATCHSIZE=64:256", "--knob", "LR=2:8", "--knob", "LABELSMOOTHING=0:0.2",
                  "--knob", "WARMUP_EPOCHS=0:2"]
    command = f"source config/CPU.sh && DATADIR={args.data} exec {sys.executable} -m rn50_mx.search " + " ".join(flags)
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True)
    print(result.stdout + result.stderr, flush=True)
    rows = {name: (float(epochs), minutes) for name, epochs, minutes in
            re.findall(r"^(sourced|trial \d+) +([\d.]+) +\S+ +\S+ +\S+ +(\S+)", result.stdout, re.M)}
    if "sourced" in rows and len(rows) > 1:
        name = min((k for k in rows if k != "sourced"), key=lambda k: rows[k][0])
        (epochs, minutes), (base_epochs, base_minutes) = rows[name], rows["sourced"]
        print(f"{mode}: {name} / sourced: epochs {epochs / base_epochs:.3f}" +
              (f", minutes {float(minutes) / float(base_minutes):.3f}" if "-" not in (minutes, base_minutes) else ""))
    else:
        print(f"{mode}: the sourced config stayed best (or nothing finished)")
    return result.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--final-seeds", type=int, default=5)
    parser.add_argument("--only", choices=("closed", "open"))
    parser.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist"))
    args = parser.parse_args()
    codes = [run(mode, args) for mode in ("closed", "open") if args.only in (None, mode)]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
