"""The progress watchdog: a rank that stops making progress ends the run within a bound and says where (issue 48).

A stuck reader, a deadlocked data worker, a collective that never completes or a peer that stopped leaves every rank
waiting forever: NCCL has no timeout, Gloo's applies to its own collectives only, and one process has none at all.
Each rank runs this thread beside training. The training thread marks each phase as it enters it (`mark`: a clock
read and two attribute stores, no device sync); entering a phase is progress, the one before having completed. The
thread wakes every tenth of the floor (at most every second) and compares the time since the last mark with the
bound: the larger of the floor (--stall-seconds, RN50_STALL_SECONDS), which covers what has no pace yet (the warm-up's
graph builds, the first eval, the first checkpoint), and MULTIPLE times the slowest interval between two marks in this
epoch and the one before. That is the run's own pace as the host sees it: MXNet's engine runs behind the host, which
waits for it only at a read (the stop check's every 4 steps, the progress line's, the epoch's loss), so a read's
interval holds the engine's steps since the last one (up to 8 on the CPU); an eval or a checkpoint is one interval.
The warm-up's intervals (first-time costs) teach no pace.

Past the bound the rank writes every thread's Python stack (faulthandler) and one line naming the rank, the phase,
the step and the seconds without progress to stderr. Rank 0, the MLPerf log's writer, then logs `stalled` (that
line's reason) and run_stop aborted and exits STALLED_EXIT (79, rn50_mx/exit_codes.sh) at once, with os._exit: the
main thread is blocked in C, so no `finally` or atexit would run, and no checkpoint is written of that state (the
last one stays the resume point). The launcher (horovodrun, mpirun, srun) then ends the other ranks, as it does when
any rank exits. Another rank leaves the verdict to rank 0, which is blocked in its next collective and fires in turn
(the rank that stalled first reaches its bound first and its stack comes first); only when rank 0 has not ended the
run by twice the bound (rank 0 itself stopped) does it exit 79 itself. Progress before then cancels its verdict.
"""
import contextlib
import faulthandler
import os
import sys
import threading
import time

from mlperf_logging.mllog import constants as K

from . import config
from . import mlperf_log as log
from .errors import InputError
from .exits import STALLED_EXIT

MULTIPLE = 20  # a 10x slowdown of the slowest recent interval still leaves it half its bound (docs/reliability.md)
WARM_UP, DATA_WAIT, STEP, ALLREDUCE, EVAL, CHECKPOINT = (
    "warm-up", "data wait", "step", "allreduce", "eval", "checkpoint write")
PHASES = {
    WARM_UP: "building and warming up, before run_start",
    DATA_WAIT: "waiting for the input pipeline's next batch",
    STEP: "in a training step, or waiting for MXNet's engine to finish the steps the host issued, their allreduces "
          "included",
    ALLREDUCE: "waiting for the ranks' collectives: the stop check's read",
    EVAL: "in an eval, its BatchNorm average and its allreduce",
    CHECKPOINT: "writing a checkpoint",
}
FLOOR = f"{config.flag_name('stall_seconds')}, {config.FIELDS['stall_seconds'].metadata['env']}"  # the setting's names
REPORT_SECONDS = 10  # the stalled rank's stack, line and log lines get this long before it exits anyway (a full pipe)


class Watchdog:
    """One rank's watchdog over the training thread's marks; `floor` > 0 seconds."""

    def __init__(self, floor, rank):
        self.floor, self.rank = floor, rank
        self.phase, self.since, self.epoch, self.step = WARM_UP, time.monotonic(), 0, 0
        self.slowest, self.before = 0.0, 0.0  # the slowest interval of this epoch, of the one before
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self.watch, name="rn50_mx progress watchdog", daemon=True)
        self.thread.start()

    def mark(self, phase):
        """The training thread enters `phase`: the phase before it has completed."""
        now = time.monotonic()
        if now - self.since > self.slowest and self.phase != WARM_UP:
            self.slowest = now - self.since
        self.phase, self.since = phase, now

    def batches(self, it, epoch):
        """The batches of the train iterator `it` in 0-based `epoch`: each wait for one is the data wait, each arrival
        progress; its end waits for the engine's last steps of the epoch (the epoch's loss read)."""
        self.epoch, self.before, self.slowest = epoch, self.slowest, 0.0
        while True:
            self.mark(DATA_WAIT)
            try:
                batch = next(it)
            except StopIteration:
                self.mark(STEP)
                return
            self.step = it.position
            self.mark(STEP)
            yield batch

    def bound(self):
        return max(self.floor, MULTIPLE * max(self.slowest, self.before))

    def watch(self):
        """Wake every tenth of the floor (at most a second) until stopped; past the bound, this rank's report (and
        rank 0's verdict); past twice the bound with no progress since, a rank other than 0 exits too."""
        reported = None
        while not self.stopped.wait(min(1.0, self.floor / 10)):
            since, phase, bound = self.since, self.phase, self.bound()
            idle = time.monotonic() - since
            if idle > bound and reported != since:
                reported = since
                self.report(phase, idle, bound)
            elif idle > 2 * bound and reported == since:
                self.report(phase, idle, bound, last=True)

    def where(self, phase):
        return "before run_start" if phase == WARM_UP else f"at epoch {self.epoch + 1} step {self.step}"

    def report(self, phase, idle, bound, last=False):
        """The stack dump and the line (and rank 0's log lines), written within REPORT_SECONDS; then rank 0 exits
        STALLED_EXIT, as does another rank whose `last` report this is (rank 0 has not ended the run). Nothing after
        stop(): run_stop is the verdict then."""
        with self.lock:
            if self.stopped.is_set():
                return
            reason = (f"rank {self.rank} made no progress for {idle:.1f} s in {phase} {self.where(phase)} "
                      f"(bound {bound:.1f} s)")
            meta = {K.EPOCH_NUM: self.epoch + 1, "step": self.step, "rank": self.rank, "phase": phase,
                    "seconds": round(idle, 1), "bound": round(bound, 1)}
            writer = threading.Thread(target=write_report, daemon=True, args=(
                self.line(reason, phase, bound, last), not last, reason, meta if self.rank == 0 else None))
            writer.start()
            writer.join(REPORT_SECONDS)
            if self.rank == 0 or last:
                os._exit(STALLED_EXIT)

    def line(self, reason, phase, bound, last):
        """The one line: the reason, what the phase is, where the bound comes from and what happens next."""
        if last:
            return f"rn50_mx.train: stalled: {reason}: rank 0 has not ended the run; this rank ends (exit " \
                   f"{STALLED_EXIT})"
        then = (f"the run stops (exit {STALLED_EXIT})" if self.rank == 0 else
                f"rank 0 ends the run, or this rank exits {STALLED_EXIT} at {2 * bound:.1f} s")
        return (f"rn50_mx.train: stalled: {reason}: {PHASES[phase]}; the bound is the larger of the floor, "
                f"{self.floor} s ({FLOOR}), and {MULTIPLE} x the slowest recent interval "
                f"({max(self.slowest, self.before):.1f} s); every thread's stack is above; {then}")

    def stop(self):
        """Training has ended (run_stop comes next, or a resumable stop's exit): no verdict from now on."""
        with self.lock:
            self.stopped.set()


class Off:
    """No watchdog (RN50_STALL_SECONDS=0, or code that is not a training run): marks cost a call."""

    def mark(self, phase):
        pass

    def batches(self, it, epoch):
        return it

    def stop(self):
        pass


def write_report(line, stacks, reason, meta):
    """With `stacks` every thread's stack, then the line, on stderr; with `meta` (rank 0) the MLPerf `stalled` event
    (`reason`) and run_stop aborted."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if stacks:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    print(line, file=sys.stderr, flush=True)
    if meta is None:
        return
    try:
        log.event("stalled", reason, metadata=meta)
        log.end(K.RUN_STOP, metadata={K.STATUS: K.ABORTED})
    except InputError as err:  # the log's disk is full: the verdict stands, without its lines
        print(f"rn50_mx.train: error: {err}", file=sys.stderr, flush=True)
    sys.stdout.flush()


_watch = Off()  # this process's watchdog: train.run starts and stops it; every other use of the package sees Off


@contextlib.contextmanager
def watching(s, rank):
    """This process's watchdog over the training run of settings `s` (in its warm-up from now; Off when
    --stall-seconds is 0), stopped at the end of the block if stop() has not stopped it before."""
    global _watch
    _watch = Watchdog(s.stall_seconds, rank) if s.stall_seconds else Off()
    try:
        yield
    finally:
        stop()


def mark(phase):
    """The training thread enters `phase` (one of PHASES)."""
    _watch.mark(phase)


def batches(it, epoch):
    """The train iterator's batches of 0-based `epoch`, watched (Watchdog.batches)."""
    return _watch.batches(it, epoch)


def stop():
    global _watch
    _watch.stop()
    _watch = Off()
