"""Epochs to the demo's target with the two LARS forms, seed by seed, side by side.

    .venv/bin/python bench/lars_forms.py [--seeds 5] [--data DIR] [rn50_mx.train flags]

`make demo`'s training (config/CPU.sh, one process, Fashion-MNIST packed with its FMNIST_ARGS, cached in
$TMPDIR/rn50_mx_bench_against or --data DIR) with RN50_LARS_FORM=submitted (the MXNet submission's SGDwFASTLARS:
the layer weights' momentum scaled by lr_t/lr_t-1, weight decay on fc1_bias) and =tf (the TF reference's form,
which config/CPU.sh was tuned on), seeds 1..SEEDS, the two forms alternating within each seed. Each run stops
at the target or after its last epoch; a line per run gives the epoch that reached the target ("-" if none) and
the top-1 of every eval, the last lines each form's runs that reached it and their mean epochs.

Each run trains up to NUMEPOCHS=4 epochs of 10,000 images: about 5 minutes on a free 2-core machine, so the
default 2 x 5 runs take nearly an hour there.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from against import CACHE, ROOT, demo_data  # noqa: E402

EVAL_LINE = re.compile(r"^epoch (\d+): .* top-1 ([\d.]+)")
FORMS = ("submitted", "tf")


def run(form, seed, folder, flags):
    """(epoch that reached the target or None, [top-1 per eval]) of one demo run."""
    args = ["-m", "rn50_mx.train", "--data-train", os.path.join(folder, "train.rec"),
            "--data-val", os.path.join(folder, "val.rec"), "--seed", str(seed), *flags, "--lars-form", form]
    command = f"source config/CPU.sh && exec {shlex.quote(sys.executable)} " + " ".join(map(shlex.quote, args))
    # The form is a flag: config/CPU.sh exports RN50_LARS_FORM=tf, which an environment variable set before it loses to.
    env = {**{k: v for k, v in os.environ.items() if k != "DATADIR"}, "PYTHONPATH": ROOT}
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench/lars_forms.py: {form} seed {seed}: training failed:\n{out.stderr[-2000:]}")
    evals = [(int(m.group(1)), float(m.group(2))) for m in map(EVAL_LINE.match, out.stdout.splitlines()) if m]
    reached = any("run_stop" in line and "success" in line for line in out.stdout.splitlines())
    return (evals[-1][0] if reached else None), [top1 for _, top1 in evals]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--data", default=CACHE, help="folder of train/val .rec (packed there if missing)")
    args, flags = parser.parse_known_args()
    folder = demo_data(args.data)
    reached, seen = {form: [] for form in FORMS}, {}
    for seed in range(1, args.seeds + 1):
        for form in FORMS if seed % 2 else FORMS[::-1]:
            epoch, top1 = run(form, seed, folder, flags)
            reached[form].append(epoch)
            print(f"seed {seed} {form:>9}: target at epoch {epoch or '-'}, top-1 "
                  + " ".join(f"{t:.4f}" for t in top1), flush=True)
            seen[form] = top1
        if seen["submitted"] == seen["tf"]:  # the forms differ from the second update on
            sys.exit(f"bench/lars_forms.py: seed {seed}: both forms gave the same evals: the form did not reach "
                     "training")
    for form, epochs in reached.items():
        hits = [e for e in epochs if e]
        mean = f"{statistics.mean(hits):.2f}" if hits else "-"
        print(f"{form:>9}: {len(hits)}/{len(epochs)} runs reached the target, mean epochs {mean}")


if __name__ == "__main__":
    main()
