"""The demo's training images/s and data wait: this tree against an earlier commit, side by side on the same data.

    .venv/bin/python bench/against.py COMMIT [COMMIT...] [--new REV] [--rounds 3] [--epochs 1] [--data DIR]
                                      [rn50_mx.train flags, e.g. --num-examples 2560 for a shorter epoch]

Each contender is `python -m rn50_mx.train` as `make demo` runs it (its own tree's config/CPU.sh sourced, one
process, seed 1), on one Fashion-MNIST train .rec packed once with the demo's FMNIST_ARGS (cached in
$TMPDIR/rn50_mx_bench_against, or --data DIR holding train.rec/.idx), for --epochs epochs without evals. Each
COMMIT's tree (and --new REV's in place of this working tree, e.g. to bisect) is exported with `git archive`
into a temporary folder (the repository is not touched). Rounds alternate the order (this tree first, then
last, ...), so that other work on the machine weighs on every contender alike.
Each epoch prints images/s and "data wait" (the share of the epoch spent inside the iterator's next()); the
last lines give each contender's median over rounds, the ratio of those medians this tree / each COMMIT, and the
median of the rounds' own ratios (each round's contenders run back to back): the machine's speed drifts by a
quarter within minutes here (345 to 440 images/s for one tree in one run), which the medians of all epochs feel and
the paired ratios do not.

A tree with the fused optimizer update (rn50_mx/fused_update) has its library built first by its own Makefile
against this checkout's .venv (`make fused-update`; nothing when it is up to date): an exported tree holds the
source only, and without the library a run would fall back to MXNet's kernels.

Figures: docs/faithful-to-the-submission.md, docs/bfloat16.md.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(tempfile.gettempdir(), "rn50_mx_bench_against")
EPOCH_LINE = re.compile(r"^epoch (\d+): ([\d.]+) img/s, data wait ([\d.]+)%")


def export(commit, dest):
    """COMMIT's tree under dest (git archive: no worktree, no change to the repository)."""
    os.makedirs(dest, exist_ok=True)
    archive = os.path.join(dest, "tree.tar")
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", ROOT, "archive", commit], stdout=f, check=True)
    tree = os.path.join(dest, "tree")
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def build_fused_update(tree):
    """The tree's fused-update library, built by its Makefile with this checkout's .venv (whose .base stamp is not
    remade: -o), where the tree has that source; make's own line says when it does not build."""
    if not os.path.exists(os.path.join(tree, "rn50_mx", "fused_update", "fused_update.cc")):
        return
    venv = os.path.join(ROOT, ".venv")
    subprocess.run(["make", "--no-print-directory", "-C", tree, f"VENV={venv}", "-o", f"{venv}/.base",
                    "fused-update"], check=True, stdout=subprocess.DEVNULL)


def demo_data(folder):
    """folder with train.rec packed as the demo packs it (config/CPU.sh's FMNIST_ARGS); packed once."""
    if not os.path.exists(os.path.join(folder, "train.idx")):
        command = f"source config/CPU.sh && {shlex.quote(sys.executable)} -m rn50_mx.prep_rec fashion-mnist " \
                  f"{shlex.quote(folder)} $FMNIST_ARGS"
        subprocess.run(["bash", "-c", command], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": ROOT})
    return folder


def train(tree, folder, epochs, flags):
    """[(images/s, data wait share)] per epoch of one demo training run of `tree`."""
    args = ["-m", "rn50_mx.train", "--data-train", os.path.join(folder, "train.rec"), "--seed", "1",
            "--num-epochs", str(epochs), "--warmup-epochs", str(epochs / 2), *flags]
    command = f"source config/CPU.sh && exec {shlex.quote(sys.executable)} " + " ".join(map(shlex.quote, args))
    env = {k: v for k, v in os.environ.items() if k != "DATADIR"}
    out = subprocess.run(["bash", "-c", command], cwd=tree, env={**env, "PYTHONPATH": tree},
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench/against.py: {tree}: training failed:\n{out.stderr[-2000:]}")
    epochs = [EPOCH_LINE.match(line) for line in out.stdout.splitlines()]
    return [(float(m.group(2)), float(m.group(3)) / 100) for m in epochs if m]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commits", nargs="+", help="the earlier commits (any git revisions)")
    parser.add_argument("--new", help="a revision to run instead of this working tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--data", default=CACHE, help="folder of train.rec/.idx (packed there if missing)")
    args, flags = parser.parse_known_args()
    folder = demo_data(args.data)
    new = args.new or "this tree"
    results = {name: [] for name in [new, *args.commits]}
    with tempfile.TemporaryDirectory(prefix="rn50_mx_against_") as tmp:
        trees = {new: export(args.new, os.path.join(tmp, "new")) if args.new else ROOT}
        trees.update((c, export(c, os.path.join(tmp, str(i)))) for i, c in enumerate(args.commits))
        names = list(trees)
        for tree in trees.values():
            build_fused_update(tree)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                epochs = train(trees[name], folder, args.epochs, flags)
                results[name].extend(epochs)
                figures = ", ".join(f"{speed:.1f} img/s wait {wait:.1%}" for speed, wait in epochs)
                print(f"round {r + 1}  {name:>12}: {figures}", flush=True)
    medians = {name: (statistics.median(s for s, _ in res), statistics.median(w for _, w in res))
               for name, res in results.items()}
    for name, (speed, wait) in medians.items():
        print(f"median {name:>12}: {speed:.1f} img/s, data wait {wait:.1%}")
    speed, wait = medians[new]
    for commit in args.commits:
        old, old_wait = medians[commit]
        print(f"{new} / {commit}: images/s x{speed / old:.3f}, data wait {wait:.1%} vs {old_wait:.1%}; round by "
              f"round x{paired_ratio(results[new], results[commit], args.rounds):.3f}")


def paired_ratio(new, old, rounds):
    """The median over rounds of (new's median epoch / old's median epoch in that round)."""
    per = len(new) // rounds
    return statistics.median(statistics.median(s for s, _ in new[r * per:(r + 1) * per]) /
                             statistics.median(s for s, _ in old[r * per:(r + 1) * per]) for r in range(rounds))


if __name__ == "__main__":
    main()
