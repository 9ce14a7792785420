"""The batch-size schedule (--batch-schedule, an open-division lever: docs/open-division.md): which steps end an
optimizer update, and what the learning-rate and momentum schedules see of each update.

From each EPOCH:FACTOR point on, one update sums the gradients of FACTOR steps (micro-batches) of the usual
BATCHSIZE images per process: the global batch of an update is FACTOR x BATCHSIZE x processes, while the DALI
readers, their shards and the per-step batch stay as they are (each image still once per epoch over the ranks, and
nothing is rebuilt when the factor changes). An epoch of S steps at factor k has ceil(S / k) updates: when k does
not divide S the last one is short, ending at the epoch's end with the S - k x (ceil(S / k) - 1) steps it has, so
that no update spans two epochs (an epoch's end is where evals, checkpoints and factor changes happen).

Schedules: the learning rate and momentum stay functions of the update count (which checkpoints hold). Update n is
timed by t(n), the steps done over the run when it ends, so warmup and decay keep their lengths in epochs (the poly
schedule still reaches END_LR at NUMEPOCHS x S steps); an update of m steps takes m x lr_at(t(n)): the linear
scaling rule for its m-times larger batch (its gradient is the mean over its m x BATCHSIZE x processes images, as
trainer.step(m x BATCHSIZE) sets). Without the schedule every update is one step and t(n) = n: the closed runs'
schedule, which does not go through this module.
"""
import bisect


class Updates:
    """Where the updates of a run fall on its steps: `factor(epoch)` steps per update in each 0-based epoch
    (Settings.batch_factor), `steps` steps per epoch, a run of `epochs` epochs (later ones take the last's factor)."""

    def __init__(self, factor, steps, epochs):
        self.factors, self.steps = [factor(epoch) for epoch in range(epochs)], steps  # read once: no parse per step
        self.firsts = [0]  # updates done before each epoch, and after the last
        for epoch in range(epochs):
            self.firsts.append(self.firsts[-1] + self.per_epoch(epoch))

    @classmethod
    def of(cls, s, steps):
        """The Updates of settings `s` for `steps` steps per epoch, or None without --batch-schedule (one step per
        update: the code path of the closed division)."""
        return cls(s.batch_factor, steps, s.epoch_limit) if s.batch_schedule else None

    def factor(self, epoch):
        """Steps per update in 0-based `epoch`."""
        return self.factors[min(epoch, len(self.factors) - 1)]

    def per_epoch(self, epoch):
        """Updates in 0-based `epoch`, the short last one included."""
        return -(-self.steps // self.factor(epoch))

    def before(self, epoch):
        """Updates done before 0-based `epoch` begins."""
        last = len(self.firsts) - 1
        if epoch <= last:
            return self.firsts[epoch]
        return self.firsts[last] + (epoch - last) * self.per_epoch(last)

    def size(self, epoch, step):
        """After `step` steps (1-based) of `epoch`: the steps of the update that step ends, or 0 when it ends none
        (its gradients add up for the next)."""
        k = self.factor(epoch)
        if step % k and step != self.steps:
            return 0
        return step - (step - 1) // k * k

    def count(self, epoch, step):
        """Updates done over the run once the update that step `step` of `epoch` ends is done."""
        return self.before(epoch) + -(-step // self.factor(epoch))

    def at(self, n):
        """(t, m) of update n (1-based): the steps done over the run when it ends and the steps it sums. Update 0
        (before any) is (0, the first factor)."""
        if n <= 0:
            return 0, self.factor(0)
        epoch = bisect.bisect_left(self.firsts, n) - 1  # firsts[epoch] < n <= firsts[epoch + 1]
        last = len(self.firsts) - 1
        if epoch >= last:  # past the run's epochs (a schedule asked beyond them)
            epoch = last + (n - self.firsts[last] - 1) // self.per_epoch(last)
        k = self.factor(epoch)
        end = min((n - self.before(epoch)) * k, self.steps)
        return epoch * self.steps + end, end - (end - 1) // k * k

    def scaled(self, lr_at, n):
        """The learning rate of update n: its steps times `lr_at` (a function of the steps done) at its end."""
        t, m = self.at(n)
        return m * lr_at(t)

    def timed(self, value_at, n):
        """`value_at` (a function of the steps done, e.g. the momentum schedule's) at the end of update n."""
        return value_at(self.at(n)[0])
