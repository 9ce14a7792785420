"""Stopping at a checkpoint: SIGTERM and SIGUSR1 ask, the ranks agree on the step."""
import os
import signal

CHECK_PERIOD = 4  # updates between the stop-flag allreduces: a stop lands 4 to 8 updates after its signal
RESUMABLE = "resumable"  # fit's status when it stopped after writing a checkpoint
RESUMABLE_EXIT = 75  # the exit status of a resumable stop (EX_TEMPFAIL), which trials.sh reports as such


class Stops:
    """SIGTERM and SIGUSR1 ask for a stop; `agreed(step)` says, on every rank alike, when the ranks have agreed to
    stop. A second signal ends the process at once, as without a checkpoint folder."""

    def __init__(self, d):
        self.d, self.asked, self.pending = d, False, None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self.ask)

    def ask(self, signum, frame):
        if self.asked:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.asked = True

    def agreed(self, step):
        """After update `step` of the run (a step, but with --batch-schedule, whose stops fall between updates only):
        whether any rank had asked when the last check period began."""
        if step % CHECK_PERIOD:
            return False
        pending = self.pending
        self.pending = self.d.host_sum([self.asked])
        return pending is not None and pending.asscalar() > 0


def default_signals():
    """After training: SIGTERM and SIGUSR1 end the process at once again (its teardown has nothing to save)."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


class NoStops:
    """Without a checkpoint folder: the signals keep their default actions and no step checks anything."""

    def agreed(self, step):
        return False
