"""One trial's runs, as a user runs training (launchers.py: this machine, run_with_docker.sh or a Slurm job), each
seed's MLPerf log in the trial's folder, read as it grows with timing's parser."""
import math
import os

from .. import config, timing
from ..errors import InputError
from . import launchers

PENALTY = 2  # epochs added to the horizon for a seed that does not reach the target (MLPerf counts no such run)
BEHIND, RANKED = "behind: top-1 under half the best curve's", "pruned"


class Run:
    """One seed of one trial: where it runs, its log and its output."""

    def __init__(self, s, folder, seed, kind="local"):
        self.kind, self.folder, self.seed = kind, folder, seed
        self.log, self.out = launchers.log_path(kind, folder, seed), os.path.join(folder, f"seed{seed}.out")
        # Trials share no checkpoint folder or model file; a launcher trial's log is the launcher's trial log.
        self.s = s.replace(seed=seed, mllog_file=self.log if kind == "local" else "", checkpoint_dir="", save_model="")
        self.started, self.stopped = None, ""

    def start(self, job_name):
        """Starts the run, a Slurm job named `job_name` (launchers.job_name), held until go(); its record (what a later
        driver needs to end it), for the study to keep before go()."""
        try:
            config.validate(self.s, {})
        except InputError as err:
            raise InputError(f"trial settings refused: {err}") from None
        self.started = launchers.start(self.kind, self.s, self.folder, self.seed, self.out, job_name)
        return self.started.record

    def go(self):
        self.started.go()

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
        return self.started is not None and self.started.done()

    def stop(self, why):
        """End the run: its whole process group (horovodrun and its ranks), or its Slurm job."""
        self.stopped = why
        self.started.stop()


def log_problem(log, s):
    """Why the MLPerf log at `log` is not the log of a run of settings `s`, or None: its own seed line, its
    hyperparameter lines (what training logs of `s`: mlperf_log.hyperparameter_events, the open levers) and the
    epochs of its evals (the eval schedule of `s`) against the settings. A log is read from a folder others may
    write; one of another seed or other settings is another run's."""
    from .. import mlperf_log
    from ..train import eval_epochs

    try:
        lines, _ = timing.parse_log(log, "1.0.0")
    except (InputError, OSError) as err:
        return str(err)
    first = {}
    for line in lines:
        first.setdefault(line.key, line.value.get("value"))
    expected = [("seed", s.seed), *mlperf_log.hyperparameter_events(s), *config.open_levers(s).items()]
    wrong = next(((key, value) for key, value in expected if key not in first or first[key] != value), None)
    if wrong:
        key, value = wrong
        return f"{f'its {key} is {first[key]!r}' if key in first else f'it logs no {key}'}, the run's {value!r}"
    scheduled = {epoch + 1 for epoch in eval_epochs(s)}
    evaluated = [(line.value["metadata"] or {}).get("epoch_num") for line in lines if line.key == "eval_accuracy"]
    off = [epoch for epoch in evaluated if epoch not in scheduled]
    return f"it evaluates epoch {off[0]!r}, off the run's eval schedule" if off else None


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


def verdict(run, s, curves, share, running=True):
    """Why the search ends the trial of a run (timing's Run of its log so far), or "": the run's own verdict when its
    loss diverged (training stops itself there and says so in its log: one verdict, training's, whatever the run's
    state); while it is `running`, BEHIND when, past the warmup, its top-1 is under half the best finished curve's
    at the same epoch where that one is well above chance (within the warmup top-1 near chance is normal: on the
    demo, epoch 1 of 8 trials gave 0.098-0.202, and LR 4.4 was cut there at 0.098 between LRs 4.0 and 4.8 that
    converged), or RANKED after `share` of the horizon, its top-1 more than 0.02 under that best (early top-1 ranks
    runs badly: measured on the demo, docs/search.md)."""
    if run is not None and run.diverged:
        return run.diverged
    if not running or run is None or not run.evals:
        return ""
    epoch, top1 = run.evals[-1]
    best = max((dict((e, t) for e, t in curve).get(epoch, -1.0) for curve in curves), default=-1.0)
    if top1 is None or math.isnan(top1):
        return BEHIND
    if epoch > s.warmup_epochs and best > 2.0 / s.num_classes and top1 < best / 2:
        return BEHIND
    if epoch >= share * s.num_epochs and best >= 0 and top1 < best - 0.02:
        return RANKED
    return ""
