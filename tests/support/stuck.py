"""The train reader held at a chosen batch, for the tests of what a run does when it stops making progress or is
asked to stop.

- stick: the train iterator, asked for its Nth batch, first opens a FIFO no one writes, so it blocks in open(2), in
  C with the GIL released, where DALI's loader thread blocks on a hung file system. DALI's own reader cannot be made
  to block from outside (its .rec reader maps or seeks the file, which a FIFO refuses at open; FUSE, NFS and I/O
  throttling are not available to the suite).
- hold: rank 0's train iterator waits at its Nth batch until the test has opened the FIFO, signalled the run and
  closed it (signal_held): a signal lands at a known step however fast the machine runs the steps around it, where
  a test that signals on seeing a progress line races the steps after it.

Every batch before is the real pipeline's. A process the test does not start itself (`python -m rn50_mx.train` under
horovodrun or the search) gets either through environ(): this folder's stuck_reader/sitecustomize."""
import errno
import itertools
import os
import time

ENVS = {"stick": "STALL_TEST_STUCK_READER", "hold": "STALL_TEST_HELD_READER"}  # "FIFO N"


def at_batch(at, then):
    """Run then() when the train iterator is asked for its `at`th batch (1-based, counted over the run)."""
    from rn50_mx.data import iters

    calls, produce = itertools.count(1), iters.DaliIter.produce

    def produce_at(self):
        if self.train and next(calls) == at:
            then()
        return produce(self)

    iters.DaliIter.produce = produce_at


def stick(never, at):
    """The `at`th train batch waits on the FIFO `never` for good (no writer: blocked in open(2)); the stack a stall
    report prints shows it as `stuck`."""
    def stuck():
        open(never).close()

    at_batch(at, stuck)


def hold(gate, at):
    """Rank 0's `at`th train batch waits until the FIFO `gate` has been opened for writing and closed again (EOF)."""
    def held():
        with open(gate) as f:
            f.read()

    if os.environ.get("HOROVOD_RANK", "0") == "0":
        at_batch(at, held)


def environ(kind, fifo, at):
    """The variables that make every `python -m rn50_mx.train` started with them `kind` ("stick" or "hold") at its
    `at`th train batch: this folder's sitecustomize first on PYTHONPATH, then the repository (for this module)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [os.path.join(here, "stuck_reader"), os.path.dirname(os.path.dirname(here)), os.environ.get("PYTHONPATH")]
    return {ENVS[kind]: f"{fifo} {at}", "PYTHONPATH": os.pathsep.join(filter(None, path))}


def from_environ():
    """In a training process started with environ()'s variables (the sitecustomize calls this): stick or hold."""
    for kind, name in ENVS.items():
        if os.environ.get(name):
            fifo, at = os.environ[name].rsplit(" ", 1)
            {"stick": stick, "hold": hold}[kind](fifo, int(at))


def signal_held(proc, gate, signum, rank=None, timeout=240):
    """Send `signum` to the run `proc` (to its rank `rank` under horovodrun) while its rank 0 waits at its gate
    (hold), then let it go on. The gate is open for writing only once its reader is there (O_NONBLOCK: ENXIO
    before); a run that ends first, or a timeout, fails the test rather than waiting for ever."""
    from rn50_mx.rehearse.stages import rank_pid

    deadline = time.time() + timeout
    while True:
        try:
            fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            if err.errno != errno.ENXIO or proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"the run never reached its gate {gate} ({err.strerror}; exit {proc.poll()})")
            time.sleep(0.05)
    try:
        os.kill(proc.pid if rank is None else rank_pid(proc, rank), signum)
    finally:
        os.close(fd)
