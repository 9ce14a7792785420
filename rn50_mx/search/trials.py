"""One trial's runs, as a user runs training: `python -m rn50_mx.train` (under horovodrun for several processes) in a
process group of its own, each seed's MLPerf log in the trial's folder, read as it grows with timing's parser."""
import math
import os
import re
import subprocess
import sys

from .. import children, config, timing
from ..errors import InputError

PENALTY = 2  # epochs added to the horizon for a seed that does not reach the target (MLPerf counts no such run)
DIVERGED, RANKED = "diverged", "pruned"


def command(s):
    """The training command of settings `s`: every value as a flag, so the run resolves exactly these."""
    train = [sys.executable, "-m", "rn50_mx.train", *config.as_flags(s)]
    processes = s.world_size
    if processes == 1:
        return train
    return ["horovodrun", "--gloo", "-np", str(processes), "-H", f"localhost:{processes}", *train]


class Run:
    """One seed of one trial: its process group and its log."""

    def __init__(self, s, folder, seed):
        self.log, self.out = os.path.join(folder, f"seed{seed}.log"), os.path.join(folder, f"seed{seed}.out")
        self.s = s.replace(seed=seed, mllog_file=self.log)
        self.proc, self.stopped = None, ""

    def start(self):
        try:
            config.validate(self.s, {})
        except InputError as err:
            raise InputError(f"trial settings refused: {err}") from None
        with open(self.out, "w") as out:
            self.proc = children.start(command(self.s), stdout=out, stderr=subprocess.STDOUT)
        return self.proc.pid

    def read(self):
        """timing's Run for the log so far, or None before run_start."""
        try:
            return timing.read_run(self.log, "1.0.0")
        except (InputError, OSError):
            return None

    def output(self):
        try:
            with open(self.out, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def done(self):
        return self.proc is not None and self.proc.poll() is not None

    def stop(self, why):
        """End the run's whole process group (horovodrun and its ranks) and wait for it."""
        self.stopped = why
        children.stop(self.proc)


def epochs_to_target(run, s):
    """MLPerf's measure: the epoch whose eval reached the target (run_stop success); the horizon plus PENALTY for a
    run that missed it (or stopped before it)."""
    if run is not None and run.status == "success" and run.converged_epoch:
        return float(run.converged_epoch)
    return float(s.num_epochs + PENALTY)


def minutes_to_target(run, s):
    """run_start to run_stop; a run that missed the target (or has no run_stop: NaN) counts its minutes stretched to
    the horizon plus PENALTY epochs."""
    if run is None or run.minutes is None:
        return float("nan")
    return run.minutes if run.status == "success" else run.minutes * (s.num_epochs + PENALTY) / s.num_epochs


NOT_FINITE = re.compile(r"^(?:\[\d+\]<stdout>:)?epoch \d+: .*loss (?:nan|inf|-inf)\b", re.M)


def verdict(run, out, s, curves, share):
    """DIVERGED, RANKED or "" for a run in progress (`out`: its output so far). Diverged: an epoch's loss is not
    finite, or top-1 under half the best finished curve's at the same epoch where that one is well above chance.
    Ranked out: after `share` of the horizon, top-1 more than 0.02 under that best (early top-1 ranks runs badly:
    measured on the demo, docs/search.md)."""
    if NOT_FINITE.search(out):
        return DIVERGED
    if run is None or not run.evals:
        return ""
    epoch, top1 = run.evals[-1]
    best = max((dict((e, t) for e, t in curve).get(epoch, -1.0) for curve in curves), default=-1.0)
    if top1 is None or math.isnan(top1) or (best > 2.0 / s.num_classes and top1 < best / 2):
        return DIVERGED
    if epoch >= share * s.num_epochs and best >= 0 and top1 < best - 0.02:
        return RANKED
    return ""
