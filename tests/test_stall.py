"""A run that stops making progress ends itself within its bound and says where (issue 48): every thread's stack and
one line naming the rank, the phase, the step and the seconds without progress, MLPerf `stalled` then run_stop
aborted, exit 79 (rn50_mx/exit_codes.sh); nothing is left running; a checkpoint folder keeps its last checkpoint as
the resume point. A run paused for less than its bound, or slowing down past the floor at its own pace, goes on;
timing shows a stalled run and the search counts its trial as failed.

The stuck reader is tests/support/stuck.py's: this file as a worker (`python tests/test_stall.py FIFO N FLAGS...`)
is rn50_mx.train whose train iterator, asked for its Nth batch, first opens FIFO, which no one writes; a process
this file does not start (the search's trial) gets the same through its sitecustomize. The real DALI pipeline delivers
every earlier batch."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.bad_values import fifo
from tests.support.mllog import events
from tests.support.procs import (ENV_PATH, PYTHONPATH, ROOT, clean_environ, config_environ, gloo_ranks, mounted,
                                 running, wait_for)
from tests.support.settings import SHRUNK_LAYERS, TINY
from tests.support import stuck
from rn50_mx import checkpoint, config, timing
from rn50_mx.exits import STALLED_EXIT
from rn50_mx.rehearse.stages import rank_pid

THIS = os.path.abspath(__file__)
# Seconds: above the warm-up's longest part (a graph build), measured on 2 cores at a load of 9 to 12 up to 4.0 s for
# one process, 8.3 s for each of two.
FLOOR, FLOOR_TWO_RANKS = 10, 15
# One process: the tiny set's 24 train images at 32x32, 6 steps an epoch; SGD, a progress line (a read) every step.
TINY_RUN = ["--num-classes", "3", "--image-shape", "3,32,32", "--batch-size", "4", "--warmup-epochs", "0",
            "--optimizer", "sgd", "--lr", "0.1", "--seed", "7", "--disp-batches", "1", "--dali-threads", "1",
            "--accuracy-threshold", "1.0", "--stall-seconds", str(FLOOR), "--num-layers", str(SHRUNK_LAYERS)]
SYNTHETIC = [*TINY_RUN, "--synthetic", "1", "--num-examples", "64", "--num-epochs", "1", "--eval-offset", "0"]
STALLED = re.compile(r"^(?:\[\d+\]<stderr>:)?rn50_mx\.train: stalled: (rank (\d+) made no progress for ([\d.]+) s in "
                     r"([a-z -]+?) (?:before run_start|at epoch (\d+) step (\d+)) \(bound ([\d.]+) s\)): "
                     r"(?!rank 0 has not ended).*$", re.M)  # a report, not a rank's last line


def stalled(text):
    """[(line, reason, rank, seconds, phase, epoch, step, bound)] of the stall lines in `text`."""
    return [(m[0], m[1], int(m[2]), float(m[3]), m[4], m[5] and int(m[5]), m[6] and int(m[6]), float(m[7]))
            for m in STALLED.finditer(text)]


def stack_before(text, line, *frames):
    """Whether the stack dump printed just before the stall line `line` holds the main thread in `frames`."""
    dump = text[:text.index(line)].rsplit("(most recent call first):", 3)
    return len(dump) > 1 and all(any(f" in {frame}\n" in part for part in dump) for frame in frames)


def test_a_reader_that_never_returns_ends_the_run_and_keeps_the_last_checkpoint(three_classes, tmp_path):
    """2 epochs of 6 steps, a checkpoint after epoch 1, and the train reader stuck on epoch 2's third batch: the run
    ends at its bound with the stack (the main thread in the reader, under train_epoch), one line (rank 0, data wait,
    epoch 2 step 2, the seconds past the bound), `stalled` and run_stop aborted, exit 79; the checkpoint of epoch 1
    stays the newest usable and the folder is not marked ended; timing shows the run as stalled. The old code
    waited for the reader forever (here it refused --stall-seconds)."""
    never, folder, log = tmp_path / "never", tmp_path / "ckpt", tmp_path / "run.log"
    fifo(never)
    flags = [*TINY_RUN, "--data-train", f"{three_classes}/train.rec", "--data-val", f"{three_classes}/val.rec",
             "--num-epochs", "2", "--eval-period", "1", "--eval-offset", "0", "--checkpoint-dir", str(folder),
             "--checkpoint-every", "1", "--mllog-file", str(log)]
    result = subprocess.run([sys.executable, THIS, str(never), "9", *flags], env=clean_environ(), cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == STALLED_EXIT, result.stdout[-2000:] + result.stderr[-3000:]
    [(line, reason, rank, seconds, phase, epoch, step, bound)] = stalled(result.stderr)
    assert (rank, phase, epoch, step) == (0, "data wait", 2, 2), reason
    # Found within a wake-up (a second) of its bound; the line rounds to a tenth, so 10.04 s past a 10 s bound reads 10.0.
    assert FLOOR <= bound <= seconds <= bound + 5, reason
    assert stack_before(result.stderr, line, "stuck", "batches", "train_epoch", "fit"), result.stderr[-3000:]
    lines = events(log)
    assert [key for key, _, _ in lines[-2:]] == ["stalled", "run_stop"] and lines[-1][2]["status"] == "aborted"
    assert lines[-2][1] == reason and lines[-2][2]["phase"] == "data wait" and lines[-2][2]["step"] == 2
    assert checkpoint.newest_usable(str(folder), set_aside=False) == str(folder / "step-6")
    assert sorted(os.listdir(folder)) == ["lock", "step-6"]
    run = timing.read_run(str(log), "1.0.0")
    assert run.status == "aborted" and run.stalled == f"stalled: {reason}" and timing.drop_reason(run) == run.stalled
    report = timing.format_report(timing.build_report([run], "1.0.0", False)).splitlines()
    assert report[1].split()[3] == "stalled" and f"run.log: stalled: {reason}" in report, report


def test_a_stopped_rank_ends_the_run_from_rank_0_and_leaves_nothing_running(tmp_path):
    """Two Gloo ranks, Gloo's own timeout 600 s: SIGSTOP rank 1 mid-epoch. Rank 0 blocks in its next read of the
    ranks' work and ends the run at its bound: its stack, the line, `stalled` and run_stop aborted, exit 79;
    horovodrun then ends rank 1 (stopped: SIGTERM waits, its SIGKILL after 5 s does not) and exits; nothing of the
    run is left. The old code waited 600 s for Gloo (here it refused --stall-seconds)."""
    out, log = tmp_path / "out", tmp_path / "run.log"
    flags = [*SYNTHETIC, "--num-examples", "512", "--kv-store", "horovod", "--dgxngpu", "2", "--mllog-file", str(log),
             "--stall-seconds", str(FLOOR_TWO_RANKS)]
    env = {**clean_environ(), "HOROVOD_GLOO_TIMEOUT_SECONDS": "600", "OMP_NUM_THREADS": "1"}
    with open(out, "w") as sink:
        proc = subprocess.Popen([*gloo_ranks(2), sys.executable, "-m", "rn50_mx.train", *flags], stdout=sink,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        wait_for(proc, out, r"epoch 1 step 4/64")
        family = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
        os.kill(rank_pid(proc, 1), signal.SIGSTOP)
        status = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert status != 0 and "Process 0 exit with status code 79." in text, text[-3000:]
    [(line, reason, rank, seconds, phase, epoch, step, bound)] = stalled(text)
    assert rank == 0 and phase in ("step", "allreduce") and epoch == 1 and 4 <= step < 64, reason
    assert FLOOR_TWO_RANKS <= bound <= seconds <= bound + 5, reason  # rounded to a tenth, as above
    assert stack_before(text, line, "train_epoch", "fit"), text[-3000:]
    assert [key for key, _, _ in events(log)[-2:]] == ["stalled", "run_stop"]
    psutil.wait_procs(family, timeout=30)  # horovodrun's middlemen reap their children as they exit
    assert [p.pid for p in family if running(p)] == []


def test_a_run_paused_for_less_than_its_bound_finishes(tmp_path):
    """The whole run stopped (SIGSTOP) mid-epoch for 0.6 of its floor, then continued: no verdict, the run ends as
    it would have (its one epoch, run_stop, exit 0). The pause counts as time without progress (the monotonic clock
    runs on), so this holds because the bound is never below the floor. The old code refused --stall-seconds."""
    out, log = tmp_path / "out", tmp_path / "run.log"
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "rn50_mx.train", *SYNTHETIC, "--mllog-file", str(log)],
                                stdout=sink, stderr=subprocess.STDOUT, env=clean_environ(), cwd=ROOT,
                                start_new_session=True)
    try:
        wait_for(proc, out, r"epoch 1 step 2/16")
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(0.6 * FLOOR)
        os.killpg(proc.pid, signal.SIGCONT)
        status = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert status == 0 and stalled(text) == [] and "epoch 1: " in text, text[-3000:]
    assert [key for key, _, _ in events(log)][-1] == "run_stop"


# The watchdog alone, beside a loop that marks as training does: its own MULTIPLE (4) makes the pace's bound show in
# seconds. Floor 0.3 s; marks 0.2 s apart, then 0.5 s (past the floor, within 4 x 0.2), then none. The watchdog's clock
# is the loop's: the gaps are exact, where real sleeps on a loaded machine wake late (a 0.2 s gap taken as 0.31 s was
# a verdict, a 0.5 s one taken as 0.66 s a bound past 2.6 s); after the marks it moves 0.05 s a nap of 0.05 s.
PACED = """
import time, types
from rn50_mx import watchdog
clock = [0.0]
watchdog.time = types.SimpleNamespace(monotonic=lambda: clock[0])
watchdog.MULTIPLE = 4
watch = watchdog.Watchdog(0.3, rank=1)
watch.mark(watchdog.DATA_WAIT)
for gap in (0.2, 0.2, 0.5):
    time.sleep(gap)
    clock[0] += gap
    watch.mark(watchdog.STEP)
print("paced", flush=True)
for _ in range(1200):
    time.sleep(0.05)
    clock[0] += 0.05
"""


def test_the_bound_follows_the_run_s_pace_and_a_rank_other_than_0_leaves_the_verdict_to_rank_0():
    """A run slowing down past its floor at its own pace gets no verdict; rank 1, past its bound (4 x its slowest
    interval, 0.5 s), prints its stack and its line and leaves the verdict to rank 0; with no progress since, it
    exits 79 at twice the bound, saying so. The old code had no watchdog."""
    result = subprocess.run([sys.executable, "-c", PACED], env={**clean_environ(), **PYTHONPATH}, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == STALLED_EXIT and result.stdout == "paced\n", result.stdout + result.stderr
    [(_, reason, rank, seconds, phase, epoch, step, bound)] = stalled(result.stderr)
    assert (rank, phase, epoch, step, bound) == (1, "step", 1, 0, 2.0) and 2.0 <= seconds <= 2.2, reason  # 4 x 0.5 s
    assert f"rank 0 ends the run, or this rank exits 79 at {2 * bound:.1f} s" in result.stderr
    assert result.stderr.count("(most recent call first):") >= 2  # the loop's thread and the watchdog's
    last = result.stderr.splitlines()[-1]
    assert re.fullmatch(r"rn50_mx\.train: stalled: rank 1 made no progress for ([\d.]+) s in step at epoch 1 step 0 "
                        r"\(bound ([\d.]+) s\): rank 0 has not ended the run; this rank ends \(exit 79\)", last), last


# Rank 0's watchdog over a loop that marks once and then waits, its MLPerf log on a disk that filled after it opened.
FULL_LOG = """
import os, sys, time
from rn50_mx import mlperf_log, watchdog
mlperf_log.configure(0, sys.argv[1])
filler = os.open(os.path.join(os.path.dirname(sys.argv[1]), "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while os.write(filler, bytes(65536)):
        pass
except OSError:
    pass
watchdog.Watchdog(0.3, rank=0).mark(watchdog.DATA_WAIT)
time.sleep(60)
"""


def test_a_verdict_whose_log_line_cannot_be_written_is_one_more_line_and_still_exit_79(tmp_path):
    """The MLPerf log's disk full at the verdict: the stack and the stall line, then one line naming the log and the
    full disk (no traceback from the writer's thread), and exit 79 all the same. The old code had no watchdog."""
    with mounted(tmp_path / "full", "size=256k") as folder:
        result = subprocess.run([sys.executable, "-c", FULL_LOG, os.path.join(folder, "run.log")],
                                env={**clean_environ(), **PYTHONPATH}, cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
    assert result.returncode == STALLED_EXIT and "Traceback" not in result.stderr, result.stderr
    [(line, *_)] = stalled(result.stderr)
    assert result.stderr.splitlines()[-1] == (f"rn50_mx.train: error: {folder}/run.log: cannot write the MLPerf log "
                                              "(No space left on device); the run stops: its log would not hold the "
                                              "whole run"), result.stderr


def write_log(path, lines):
    """An MLPerf log of (key, value, metadata) lines, as a user or another tool may have written it."""
    path.write_text("".join(':::MLLOG {"namespace": "", "time_ms": %d, "event_type": "POINT_IN_TIME", "key": "%s", '
                            '"value": %s, "metadata": %s}\n' % (i, key, json.dumps(value), json.dumps(meta))
                            for i, (key, value, meta) in enumerate(lines)))
    return str(path)


@pytest.mark.parametrize("value, shown", [("two\nlines\x1b[2J", "two\\nlines\\x1b[2J"), ({"a": [1]}, "{'a': [1]}"),
                                          (None, "None")])
def test_a_stalled_line_someone_else_wrote_is_one_line_and_never_the_verdict_of_a_success(tmp_path, value, shown):
    """A `stalled` value that is no text, or text with a line break or a terminal escape, is shown on one line; a
    `stalled` line before a run_stop success leaves the run a success (run_stop is the verdict, as for `diverged`).
    The old code had no `stalled`."""
    aborted = timing.read_run(write_log(tmp_path / "a.log", [("run_start", None, {}), ("stalled", value, {}),
                                                             ("run_stop", None, {"status": "aborted"})]), "1.0.0")
    assert aborted.stalled == f"stalled: {shown}"
    report = timing.format_report(timing.build_report([aborted], "1.0.0", False))
    assert f"a.log: stalled: {shown}" in report.splitlines()
    success = timing.read_run(write_log(tmp_path / "s.log", [("run_start", None, {}), ("stalled", value, {}),
                                                             ("run_stop", None, {"status": "success"})]), "1.0.0")
    assert success.status == "success" and success.stalled is None


@pytest.mark.parametrize("ends", ["as it may", "between the driver's read of its log and its look at the run"])
def test_a_stall_fails_the_search_s_trial_in_training_s_words(tiny_data, tmp_path, monkeypatch, ends):
    """A trial whose reader never returns its first batch: training stops itself (`stalled`, run_stop aborted, exit
    79); the search tells the study the trial failed, in training's words, neither pruned nor complete; timing reads
    the log as a stalled run. The floor (2 s) may also fall within the warm-up's graph build on a loaded machine: the
    verdict is then `before run_start`, as true a stall. The old code completed the trial. A run that ended between
    the driver's read of its log and its look at the process (held there: the read waits for the end) had its trial
    told COMPLETE from the log before the stall (a fresh clone's make test, e8f7417): the driver asks first."""
    import optuna

    from rn50_mx import search
    from rn50_mx.search import driver, space

    never = tmp_path / "never"
    fifo(never)
    environ = {**config_environ("CPU"), **TINY, "DATADIR": tiny_data, "PATH": ENV_PATH, **PYTHONPATH,
               "RN50_STALL_SECONDS": "2"}
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    for name, value in stuck.environ("stick", never, 1).items():
        monkeypatch.setenv(name, value)
    s, args, knobs = search.prepare(["--results", str(tmp_path / "res"), "--out", str(tmp_path / "cfg"), "--knob",
                                     "EVAL_OFFSET=0:1", "--trials", "1", "--finalists", "0"])
    os.makedirs(args.results)
    loop = driver.Driver(s, args, knobs, search.open_study(args, knobs, s), args.results)
    loop.study.enqueue_trial(space.start(s, knobs))  # the sourced settings first, as Driver.run starts
    loop.launch()
    [slot] = loop.slots
    if ends != "as it may":
        run, read = slot.current, slot.current.read
        monkeypatch.setattr(run, "read", lambda: (read(), run.started.proc.wait())[0])
    deadline = time.time() + 300
    while not loop.poll(slot):
        assert time.time() < deadline
        time.sleep(0.5)
    [trial] = loop.study.get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL, (trial, open(slot.current.log).read()[-2000:])
    assert re.fullmatch(r"stalled: rank 0 made no progress for [\d.]+ s in (warm-up before run_start|data wait at "
                        r"epoch 1 step 0) \(bound 2\.0 s\)", trial.user_attrs["why"]), trial.user_attrs
    run = timing.read_run(slot.current.log, "1.0.0")
    assert run.stalled == trial.user_attrs["why"] and run.status == "aborted" and not run.counted


def test_timing_reads_a_log_that_stalled_before_run_start(tmp_path):
    """A run that stalled in its warm-up has `stalled` and run_stop aborted but no run_start: timing shows it as
    stalled, with no minutes, rather than as a log with no run."""
    run = timing.read_run(write_log(tmp_path / "w.log", [("init_start", None, {}), ("stalled", "rank 0 stuck", {}),
                                                         ("run_stop", None, {"status": "aborted"})]), "1.0.0")
    assert (run.stalled, run.status, run.minutes) == ("stalled: rank 0 stuck", "aborted", None)


@pytest.mark.parametrize("value", ["-1", "86401", "1.5", "x"])
def test_a_bad_floor_is_one_line_naming_it(value):
    """A negative, fractional or huge floor, or none at all, is one line naming the flag or the variable."""
    for argv, environ, name in ((["--stall-seconds", value], {}, "--stall-seconds"),
                                ([], {"RN50_STALL_SECONDS": value}, "RN50_STALL_SECONDS")):
        with pytest.raises(config.SettingsError) as refused:
            config.load(argv, environ)
        assert re.match(f"{name}='?{re.escape(value)}'?: (must be|expected int)", str(refused.value)), refused.value


SYSTEMS = [name[:-3] for name in sorted(os.listdir(os.path.join(ROOT, "config")))
           if name.endswith(".sh") and not name.endswith("_common.sh") and name != "CPU.sh"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_gpu_configs_shut_horovod_down_only_well_after_the_watchdog_s_verdict(system):
    """Each GPU config sets Horovod's stall warning (60 s) and shutdown, the shutdown above the warning (Horovod
    ignores it otherwise) and at least twice the watchdog's floor; a floor raised to the shutdown is refused in one
    line. The old configs set neither."""
    environ = config_environ(system)
    check, shutdown = (int(environ[f"HOROVOD_STALL_{name}_TIME_SECONDS"]) for name in ("CHECK", "SHUTDOWN"))
    floor = config.load([], environ).stall_seconds
    assert check < shutdown and shutdown >= 2 * floor, (check, shutdown, floor)
    with pytest.raises(config.SettingsError, match=f"^HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={shutdown} is not above "
                                                   f"RN50_STALL_SECONDS={shutdown}: "):
        config.load([], {**environ, "RN50_STALL_SECONDS": str(shutdown)})


if __name__ == "__main__":
    from rn50_mx import train
    from rn50_mx.errors import run_cli

    stuck.stick(sys.argv[1], int(sys.argv[2]))
    sys.argv = ["rn50_mx.train", *sys.argv[3:]]
    run_cli(train.main, "rn50_mx.train")
