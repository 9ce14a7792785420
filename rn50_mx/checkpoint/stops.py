"""Stopping at a checkpoint: SIGTERM and SIGUSR1 ask, the ranks agree on the step."""
import os
import signal

CHECK_PERIOD = 4  # steps between the stop-flag allreduces (Stops.agreed)
RESUMABLE = "resumable"  # fit's status when it stopped after writing a checkpoint
RESUMABLE_EXIT = 75  # the exit status of a resumable stop (EX_TEMPFAIL), which trials.sh reports as such


class Stops:
    """SIGTERM and SIGUSR1 ask for a stop; `agreed(step, factor)` says, on every rank alike, when the ranks have agreed
    to stop. A second signal ends the process at once, as without a checkpoint folder."""

    def __init__(self, d):
        self.d, self.asked, self.pending = d, False, None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self.ask)

    def ask(self, signum, frame):
        if self.asked:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.asked = True

    def agreed(self, step, factor=1):
        """After step `step` of the run, the end of an update in an epoch of `factor` steps per update (more than 1
        with --batch-schedule only): whether any rank had asked at the check before.

        Checks come every CHECK_PERIOD steps, and at every update end in an epoch of factor > 1, each reading the
        previous one's allreduce: a stop lands 4 to 8 steps after its signal, or, with updates of several steps, at
        the end of the update after the signal's (across a change of factor, at the second check after it); never
        inside an update. Every rank counts the same steps, so all stop at the same one. Checks counted in updates
        put a stop 4 to 8 updates late, past the end of a run of fewer than 8 updates (issue 33 item 18)."""
        if factor == 1 and step % CHECK_PERIOD:
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

    def agreed(self, step, factor=1):
        return False
