"""Stopping on a step the ranks agree on: SIGTERM and SIGUSR1 ask for a resumable stop; a diverged loss stops the
run."""
import dataclasses
import math
import os
import signal

import mxnet as mx

from .. import watchdog
from ..dist import HOST

CHECK_PERIOD = 4  # steps between the stop-flag allreduces (Stops.agreed)
RESUMABLE = "resumable"  # fit's status when it stopped after writing a checkpoint
DIVERGED = "diverged"  # fit's status when the ranks agreed that the loss diverged (run_stop aborted)
LOSS_LIMIT = 1000  # times a uniform guess's loss, ln C: past it no learning run's loss goes


def loss_limit(num_classes):
    """The mean loss per image a learning run never reaches: 1000 times a uniform guess's (ln C: 2303 for 10
    classes, 6908 for 1000). Not 100 times: the suite's tiny runs (2 images a rank, BatchNorm over 2, LARS at LR 0.5)
    reach 100-400 per image and finish. A diverging loss grows by orders of magnitude in a few steps (config/CPU.sh at
    LR 1000: 9.1e3 to 2.1e4 over its first 4 steps, 3.8e24 after epoch 1): a bound 10 times higher costs a check at
    most."""
    return LOSS_LIMIT * math.log(num_classes)


@dataclasses.dataclass
class Divergence:
    """The check that found the loss diverged: the run's steps `first`..`last` it covered, their mean loss per image
    over every rank (NaN or infinite when one rank's was), and on how many of the `world` ranks its own mean was past
    the limit."""
    first: int
    last: int
    loss: float
    ranks: int
    world: int


class Stops:
    """`agreed(step, images, factor)` says, on every rank alike, when the ranks have agreed to stop: after a SIGTERM or
    SIGUSR1 (with `signals`, a checkpoint folder: a second signal then ends the process at once, as without one), or
    when the ranks' mean loss per image over the steps since the previous check was not finite (on any rank) or past
    `limit`.

    The check rides on the stop-flag allreduce: this rank's request, whether its loss of the window went past the limit,
    that loss and its images, summed over the ranks in one tiny allreduce issued every CHECK_PERIOD steps and read at
    the next check, so that no step waits for it (the loss stays on the device until then)."""

    def __init__(self, d, limit, signals=True):
        self.d, self.limit, self.asked, self.pending = d, limit, False, None
        self.loss, self.mark, self.images, self.mark_images, self.step, self.mark_step = None, None, 0, 0, 0, 0
        for sig in (signal.SIGTERM, signal.SIGUSR1) if signals else ():
            signal.signal(sig, self.ask)

    def ask(self, signum, frame):
        if self.asked:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.asked = True

    def begin(self, loss, images, step):
        """An epoch's running loss sum `loss` (on the device), from `images` at the run's step `step`. The window in
        progress carries over: the steps of the epoch before that came after its last check count in the next."""
        if self.loss is None:
            self.mark, self.mark_images, self.mark_step = loss.copy(), images, step
        else:
            self.mark, self.mark_images = loss - (self.loss - self.mark), images - (self.images - self.mark_images)
        self.loss, self.images, self.step = loss, images, step

    def agreed(self, step, images, factor=1):
        """After step `step` of the run, the end of an update in an epoch of `factor` steps per update (more than 1
        with --batch-schedule only), `images` into the epoch: None to go on, or why the ranks stop, read at the check
        before: a Divergence, or RESUMABLE when any rank had asked.

        Checks come every CHECK_PERIOD steps, and at every update end in an epoch of factor > 1, each reading the
        previous one's allreduce: a stop lands 4 to 8 steps after its signal, or, with updates of several steps, at
        the end of the update after the signal's (across a change of factor, at the second check after it); never
        inside an update. Every rank counts the same steps, so all stop at the same one. Checks counted in updates
        put a stop 4 to 8 updates late, past the end of a run of fewer than 8 updates (issue 33 item 18)."""
        self.step, self.images = step, images
        if factor == 1 and step % CHECK_PERIOD:
            return None
        pending, self.pending = self.pending, self.flags()
        return self.verdict(pending)

    def settle(self):
        """A Divergence or None for every step so far, read now: before a checkpoint is written, so that none holds a
        diverged state. The pending check stays pending: a stop request is read where it always is."""
        return self.verdict(self.pending, asked=False) or self.verdict(self.flags(), asked=False)

    def flags(self):
        """The check of the window since the last one, issued, not waited for: (the ranks' sums of [asked, past the
        limit, window loss, window images], first step, last step)."""
        window, images = self.loss - self.mark, self.images - self.mark_images
        past = 1 - (window <= self.limit * images)  # NaN compares false: a NaN or +inf loss is past too
        mine = mx.nd.concat(mx.nd.array([self.asked], ctx=HOST), past.as_in_context(HOST),
                            window.as_in_context(HOST), mx.nd.array([images], ctx=HOST), dim=0)
        check = (self.d.allreduce_sum(mine), self.mark_step + 1, self.step)
        self.mark, self.mark_images, self.mark_step = self.loss.copy(), self.images, self.step
        return check

    def verdict(self, check, asked=True):
        if check is None:
            return None
        sums, first, last = check
        watchdog.mark(watchdog.ALLREDUCE)
        requests, past, loss, images = sums.asnumpy().tolist()  # the host read: the check period's one
        mean = loss / images if images else 0.0
        if not mean <= self.limit:  # the ranks' mean: a rank's batches alone can be noisy; NaN compares false
            return Divergence(first, last, mean, int(past), self.d.size)
        return RESUMABLE if asked and requests > 0 else None


def default_signals():
    """After training: SIGTERM and SIGUSR1 end the process at once again (its teardown has nothing to save)."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
