"""The rehearsal's stages: each runs the package's own command, as a GPU run would, on the stand-in build, and
judges what it printed and wrote. A stage's verdict is one line: its figures, or the failure's own last words."""
import itertools
import json
import os
import re
import signal
import sys
import time

from .. import children, config
from ..errors import InputError

CHILD_TIMEOUT = 600
GRACE = 20
# Horovod's background cycle for the stand-in ranks (horovodrun --cycle-time-ms, which overrides HOROVOD_CYCLE_TIME):
# a GPU config's 0.1 ms (gpu_common.sh) makes each idle rank poll Gloo 10,000 times a second, measured at 45% of a
# core, taken from the ranks' own compute on this machine's cores; at Horovod's default cycle, 8%. At 25 ms against
# 5, side by side (3 pairs each): a quick rehearsal of NF5688M6 35.6-35.8 CPU-seconds against 37.6-39.7 (wall 19.9 s
# against 20.6-21.6), a 2-rank run of 12 tiny CPU steps 10.9-11.5 against 11.7-11.8 (wall alike); fewer wake-ups of
# each rank's Horovod and Gloo threads (the system time), and gradients fused into fewer allreduces.
CYCLE_MS = 25
ERROR = re.compile(r"(?:Error|error|rn50_mx[.\w]*:|Fused|refuse|not supported|Check failed)")
TRACEBACK = "Traceback (most recent call last):"
# A rank's traceback, its one-line error, or the progress watchdog's verdict (rn50_mx/watchdog.py)
FAILURE = re.compile(r"^(\[\d+\]<std(?:out|err)>:)(?:.*(" + re.escape(TRACEBACK) +
                     r")|rn50_mx[.\w]*: (?:error|stalled): )")


class StageFailed(Exception):
    """A stage's one-line verdict."""


class ConfigDiverges(Exception):
    """A finding about the config, not a failure of the code: its loss diverged, and training stopped itself there
    (its log's `diverged` line); one line saying in how many steps, at which LR, with which optimizer."""


def horovodrun(ranks):
    """horovodrun starting `ranks` Gloo ranks on this machine: this Python's Horovod (children.horovodrun); one line
    when there is none."""
    launcher = children.horovodrun(ranks, "--gloo")
    if not launcher:
        raise InputError(f"Horovod is not installed for {sys.executable}; the rehearsal's ranks run under its "
                         "horovodrun: install Horovod (pip install horovod)")
    return [*launcher, "--cycle-time-ms", str(CYCLE_MS)]


def command(plan, module, *extra, **changes):
    """`python -m module` under horovodrun with the plan's flags (and `changes`, then `extra` arguments)."""
    return [*horovodrun(plan.ranks), sys.executable, "-m", module, *extra, *flag_args({**plan.flags, **changes})]


def flag_args(flags):
    """rn50_mx.train's flags for the settings {name: value}."""
    return [f"{config.flag_name(k)}={config.value_text(v)}" for k, v in flags.items()]


def cause(text):
    """The line of a failed child's output that names its cause: the first failure a rank printed, its one-line error
    or the exception that ended its traceback (its peers' errors, Horovod's shutdown and horovodrun's own traceback,
    printed after it, are consequences); else the last line that looks like an error, else the last."""
    lines = text.splitlines()
    first = next((found for found in (failure(lines, i) for i in range(len(lines))) if found), None)
    if first:
        return first[:300]
    lines = [re.sub(r"^\[\d+\]<std(?:out|err)>:", "", line).strip() for line in lines if line.strip()]
    named = [line for line in lines if ERROR.search(line) and not line.startswith(("File ", "Traceback"))]
    return ((named or lines or ["no output"])[-1])[:300]


def failure(lines, i):
    """The failure a rank's line `lines[i]` begins: a one-line error (errors.run_cli), or a traceback's exception, the
    first unindented line after it of the same rank and stream that starts no traceback of its own (MXNet's error
    begins one of its C++ frames); None for any other line."""
    start = FAILURE.match(lines[i])
    if not start or not start.group(2):
        return start and lines[i][len(start.group(1)):].strip()
    own = (later[len(start.group(1)):] for later in itertools.islice(lines, i + 1, None)
           if later.startswith(start.group(1)))
    return next((later.strip() for later in own if later.strip() and not later[0].isspace()
                 and TRACEBACK not in later), None)


def run(cmd, out, code=0):
    """Run `cmd` with its output to the file `out`; its text, or StageFailed naming the cause."""
    with open(out, "w") as sink:
        proc = children.start_tied(cmd, stdout=sink, stderr=sink)
    wait(proc, out)
    text = open(out).read()
    if code is not None and proc.returncode != code:
        raise StageFailed(f"exit {proc.returncode}: {cause(text)}")
    return text


def wait(proc, out, until=None):
    """Until `proc` ends, or with `until` (a pattern) until its output matches; a rank that failed while its peers
    wait in a collective (Gloo gives up after minutes) is not waited for: GRACE seconds after a traceback the job is
    ended, its cause named."""
    deadline, failed_at = time.time() + CHILD_TIMEOUT, None
    while proc.poll() is None:
        text = open(out).read()
        if until and re.search(until, text):
            return
        failed_at = failed_at or (time.time() if TRACEBACK in text else None)
        if time.time() > deadline or (failed_at and time.time() > failed_at + GRACE):
            children.stop(proc)
            raise StageFailed(f"ended after a rank failed: {cause(text)}" if failed_at else
                              f"no end after {CHILD_TIMEOUT} s: {cause(text)}")
        time.sleep(0.2)
    children.forget(proc)
    text = open(out).read()  # all of it: the child may have printed `until` just before it ended
    if until and not re.search(until, text):
        raise StageFailed(f"ended (exit {proc.returncode}) before {until!r}: {cause(text)}")


def mllog(path):
    """[(key, value, metadata)] of an MLPerf log."""
    with open(path) as f:
        events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if ":::MLLOG " in line]
    return [(e["key"], e["value"], e.get("metadata", {})) for e in events]


def train(plan, work):
    """The whole run, nothing stopping it, its model saved: the reference every later stage compares with."""
    log, model = os.path.join(work, "run.log"), os.path.join(work, "model")
    try:
        text = run(command(plan, "rn50_mx.train", mllog_file=log, save_model=model), os.path.join(work, "run.out"))
    except StageFailed:
        diverges(log)
        raise
    events = mllog(log)
    evals = [v for k, v, _ in events if k == "eval_accuracy"]
    stops = [m.get("status") for k, _, m in events if k == "run_stop"]
    if stops != ["aborted"] or not evals:  # no target: the run ends after its last eval
        raise StageFailed(f"run_stop {stops}, {len(evals)} evals in {log}")
    speeds = re.findall(r"epoch \d+: ([\d.]+) img/s", text)
    return (f"{len(evals)} eval(s) on the schedule, run_stop aborted (no target), model saved; "
            f"{speeds[-1] if speeds else '?'} img/s (stand-in: no GPU figure)"), dict(model=model, evals=evals)


def diverges(log):
    """ConfigDiverges when the run's MLPerf log says that its loss diverged."""
    events = mllog(log) if os.path.isfile(log) else []
    found = [(value, meta) for key, value, meta in events if key == "diverged"]
    if found:
        first = {key: value for key, value, _ in reversed(events)}
        value, meta = found[0]
        lr = first.get(f"{first.get('opt_name')}_opt_base_learning_rate")  # the log's lars_... or sgd_...
        raise ConfigDiverges(f"diverges in {meta.get('steps')} steps at LR {lr} with OPTIMIZER={first.get('opt_name')} "
                             f"({value}; training stopped itself at epoch "
                             f"{meta.get('epoch_num')} step {meta.get('step')}): a finding about the settings that set "
                             "the step size, not a failure of the code")


def stop_and_resume(plan, work, reference):
    """SIGTERM to rank 0 in epoch 1: the ranks agree on an update end (checkpoint.stops), in epoch 2 or 3, write a
    checkpoint there and stop; the resumed run ends with parameters bit-identical to the uninterrupted run's."""
    folder, out = os.path.join(work, "checkpoints"), os.path.join(work, "stopped.out")
    cmd = command(plan, "rn50_mx.train", checkpoint_dir=folder)
    with open(out, "w") as sink:
        proc = children.start_tied(cmd, stdout=sink, stderr=sink)
    wait(proc, out, until=r"epoch 1 step \d+/")  # the first update's end: step 1, or later with --batch-schedule
    os.kill(rank_pid(proc, 0), signal.SIGTERM)
    wait(proc, out)
    stopped = re.search(r"stopped at epoch (\d+) step (\d+)", open(out).read())
    if not stopped:
        raise StageFailed(f"no resumable stop: {cause(open(out).read())}")
    model = os.path.join(work, "resumed")
    run(command(plan, "rn50_mx.train", checkpoint_dir=folder, save_model=model), os.path.join(work, "resumed.out"))
    differ = different_params(model, reference["model"])
    if differ:
        raise StageFailed(f"the resumed run's {differ} differs from the uninterrupted run's")
    return f"stopped at epoch {stopped[1]} step {stopped[2]}, resumed: every parameter bit-identical"


def rank_pid(proc, rank):
    """The pid of rank `rank`'s Python under horovodrun: a descendant of it (/proc/PID/stat's parent pids) whose
    environment says HOROVOD_RANK=rank."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    family, found = {proc.pid}, True
    while found:
        found = {pid for pid, parent in parents.items() if parent in family and pid not in family}
        family |= found
    for pid in sorted(family - {proc.pid}):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                program = os.path.basename(f.read().split(b"\0")[0])
        except OSError:
            continue
        if f"HOROVOD_RANK={rank}".encode() in environ and program.startswith(b"python"):
            return pid
    raise StageFailed(f"no rank {rank} process under horovodrun")


def different_params(prefix, reference):
    """The first parameter of PREFIX-0000.params that is not bit-identical to REFERENCE's, or None. Bits, not values:
    a NaN that both runs reached is the same (np.array_equal calls it different), 0.0 and -0.0 are not. MXNet is
    imported here only: the rehearsal's own process needs it for nothing else (its import is 2 CPU-seconds)."""
    import mxnet as mx

    ours, theirs = mx.nd.load(prefix + "-0000.params"), mx.nd.load(reference + "-0000.params")
    if ours.keys() != theirs.keys():
        return "parameter list"
    return next((k for k in sorted(ours) if not same_bits(ours[k].asnumpy(), theirs[k].asnumpy())), None)


def same_bits(a, b):
    """Whether two arrays have one dtype, one shape and the same bytes."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def evaluate(plan, work, reference):
    """`python -m rn50_mx.evaluate --model` on the saved model gives the run's last logged top-1."""
    text = run(command(plan, "rn50_mx.evaluate", "--model", reference["model"]), os.path.join(work, "evaluate.out"))
    found = re.search(r"top-1 ([\d.]+)", text)
    if not found:
        raise StageFailed(f"no top-1 in its output: {cause(text)}")
    if abs(float(found[1]) - reference["evals"][-1]) > 5e-5:
        raise StageFailed(f"top-1 {found[1]} against the run's last eval {reference['evals'][-1]:.4f}")
    return f"top-1 {found[1]}: the run's last eval"


def selftest(plan, work):
    """The self-test's rows on the stand-in: every row that can run here passes; GPU-only rows say why not. One timed
    step per source: a stand-in's rate is no figure, and each step is a second of a CPU."""
    cmd = [sys.executable, "-m", "rn50_mx.selftest", "--ranks", str(plan.ranks), "--steps", "1",
           *flag_args(plan.flags)]
    text = run(cmd, os.path.join(work, "selftest.out"), code=None)
    failed = [line for line in text.splitlines() if re.match(r"^\S.*\s{2}FAIL\s{2}", line)]
    if failed or "selftest: all checks passed" not in text:
        raise StageFailed(" ".join((failed or [cause(text)])[0].split()))
    rows = [line for line in text.splitlines() if re.match(r"^\S.*\s{2}(ok|-)\s{2,}", line)]
    return f"{sum(' ok ' in r for r in rows)} rows passed, {sum('  -  ' in r for r in rows)} not for this machine"


def tune(plan, work):
    """The input tuner's path (rn50_mx.tune, as the README's step 3 runs it) with no search budget: it times the
    config's step on synthetic and on real batches on this rank's stand-in device and writes its fragment."""
    cmd = [sys.executable, "-m", "rn50_mx.tune", "--budget", "0", "--rounds", "1", "--steps", "1", "--out", work,
           *flag_args(plan.flags)]
    text = run(cmd, os.path.join(work, "tune.out"))
    written = re.search(r"^wrote (.+)$", text, re.M)
    if not written or not os.path.isfile(written[1]):
        raise StageFailed(f"no fragment written: {cause(text)}")
    stopped = re.search(r"^stopped: (.+?);", text, re.M)
    return f"timed and wrote {os.path.basename(written[1])} (stopped: {stopped[1] if stopped else '?'})"


def checked_ranks(ranks):
    """--ranks: 1 to this machine's CPUs (each rank wants one)."""
    if not 1 <= ranks <= os.cpu_count():
        raise InputError(f"--ranks={ranks}: must be 1 to {os.cpu_count()} (the CPUs of this machine)")
    return ranks
