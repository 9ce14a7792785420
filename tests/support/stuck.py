"""A train reader that never returns, for the watchdog's tests: the train iterator, asked for its Nth batch, first
opens a FIFO no one writes, so it blocks in open(2), in C with the GIL released, where DALI's loader thread blocks
on a hung file system. DALI's own reader cannot be made to block from outside (its .rec reader maps or seeks the
file, which a FIFO refuses at open; FUSE, NFS and I/O throttling are not available to the suite); every earlier
batch is the real pipeline's."""
import itertools
import os

ENV = "STALL_TEST_STUCK_READER"  # "FIFO N": set by a test for a training process it does not start itself


def stick(never, at):
    """Make the train iterator's `at`th batch (1-based, counted over the run) wait on the FIFO `never` for good."""
    from rn50_mx.data import iters

    calls, produce = itertools.count(1), iters.DaliIter.produce

    def stuck(self):
        if self.train and next(calls) == at:
            open(never).close()  # no writer: blocked in open(2) for good
        return produce(self)

    iters.DaliIter.produce = stuck


def environ(never, at):
    """The variables that make every Python process started with them (`python -m rn50_mx.train` under a launcher
    or the search) stick at its `at`th train batch: this folder's sitecustomize first on PYTHONPATH."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stuck_reader")
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    return {ENV: f"{never} {at}", "PYTHONPATH": path}
