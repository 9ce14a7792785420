"""Training images/s of one configuration on one device: the measuring code the benchmarks, the tuner and the
self-test share.

    measure.synthetic_vs_real(s, ctx)     # {"synthetic": Rate, "real": Rate} of this config on this device
    step = measure.train_step(s, ctx)     # the parts it is made of, for other contenders:
    batches = measure.sources(s, ctx)     # {"synthetic": endless batches, "real": endless batches}
    measure.compare({"name": (step, batches["real"]), ...}, s.batch_size, rounds=5, steps=5)
    measure.side_by_side({"name": lambda: Rate, ...}, rounds=3)   # contenders timed elsewhere (the tuner's)

A measurement runs DRAIN untimed steps, each waited for, then STEPS timed ones. The untimed steps absorb a
hybridized graph's first build and the batches DALI prefetched while something else was being timed (a head start
that would flatter the real data). compare() times several contenders round after round, the first round not
counted and every other round in reverse order, and reports medians: on shared cores the wall rates swing between
rounds, so only contenders timed side by side are compared.

A Rate is images/s; images per CPU-second of the process (all its threads, DALI's and MXNet's: it hardly moves
when other work shares the machine); and the share of the time spent inside next() on the batches (for real data,
waiting for DALI; the engine computes meanwhile). The caller decides the device: every function takes `ctx`.

Open levers that change a run's step over its epochs (LEFT_OUT) are off in a measurement: synthetic_vs_real and the
tuner time timed(s), and left_out(s) says so in their reports.
"""
import collections
import functools
import statistics
import time

DRAIN = 3  # untimed steps before each timed window: DALI's default prefetch depth (2) + 1
# The open levers a measurement leaves out: (Settings field, its value when off, what timing without it means).
LEFT_OUT = (("prog_start_side", 0, "progressive resizing (every batch at IMAGE_SHAPE: the run's largest size, its "
             "input's hardest case, and the only one the synthetic ceiling has)"),
            ("batch_schedule", "", "the batch-size schedule (an optimizer update at every step, as at factor 1)"))

Rate = collections.namedtuple("Rate", "images_per_s images_per_cpu_s wait_share")


def endless(it):
    """The batches of `it`, epoch after epoch."""
    while True:
        yield from it
        it.reset()


def rate(step, batches, batch_size, steps, drain=DRAIN):
    """The Rate of `steps` training steps on `batches`, after `drain` untimed ones.

    step(batch) returns an mx.nd that is ready when the step is done (train.train_step's summed loss)."""
    for _ in range(drain):
        step(next(batches)).wait_to_read()
    waited, total = 0.0, 0.0
    tic, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        asked = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - asked
        total = step(batch) + total
    total.wait_to_read()  # the engine runs behind Python: the steps are done only when their losses are
    seconds = time.perf_counter() - tic
    return Rate(steps * batch_size / seconds, steps * batch_size / (time.process_time() - cpu), waited / seconds)


def median(rates):
    """The Rate whose every field is the median of that field over `rates`."""
    return Rate(*(statistics.median(column) for column in zip(*rates)))


def side_by_side(timers, rounds, on_round=None):
    """{name: [Rate of each round]} of timers = {name: () -> Rate}, over `rounds` rounds, every other round taking
    them in reverse order so that none is always first. on_round(r, rates) is called after each round r (from 1);
    a true answer ends the rounds there, and a timer it removes from `timers` is not timed again."""
    rates = {name: [] for name in timers}
    for r in range(1, rounds + 1):
        for name in list(timers)[::1 if r % 2 else -1]:
            rates[name].append(timers[name]())
        if on_round and on_round(r, rates):
            break
    return rates


def compare(runs, batch_size, rounds, steps, drain=DRAIN, on_round=None, uncounted=True):
    """{name: median Rate} of runs = {name: (step, endless batches)}, timed side by side over `rounds` rounds.

    A first round, in reverse order, is not counted (unless not `uncounted`). on_round(r, {name: [Rate of each
    counted round]}) is called after each counted round r."""
    timers = {name: functools.partial(rate, step, batches, batch_size, steps, drain)
              for name, (step, batches) in runs.items()}
    for name in list(timers)[::-1] if uncounted else ():
        timers[name]()
    return {name: median(values) for name, values in side_by_side(timers, rounds, on_round).items()}


def train_step(s, ctx, hybridize=True):
    """train.train_step bound to a fresh network, loss and one-process trainer of `s` on `ctx` (train.parts),
    hybridized unless `hybridize` is False."""
    from . import data, dist, train

    net, loss_fn, trainer = train.parts(s, ctx, data.steps_per_epoch(s, 1), dist.Single().trainer, hybridize)
    return functools.partial(train.train_step, net, loss_fn, trainer)


def batches(s, ctx, seed):
    """Endless train batches of `s` on `ctx` through data.make_iters: synthetic ones with s.synthetic, else the
    DALI pipeline's."""
    from . import data

    train, _ = data.make_iters(s.replace(data_val=""), 0, 1, seed, ctx)
    return endless(train)


def sources(s, ctx):
    """{"synthetic": batches, "real": batches} of `s` on `ctx`, seeded as rank 0 of training (the global seeds
    too, as train.py). Checks the train files first: a missing one fails in one line before anything is built."""
    from . import data, dist, train

    data.check_files(s.replace(data_val=""))
    _, seed = train.rank_seed(s, dist.Single())
    return {"synthetic": batches(s.replace(synthetic=True), ctx, seed), "real": batches(s, ctx, seed)}


def drain_for(s):
    """Untimed steps before a timed window of `s`: more than its DALI prefetch depth, so that the timed real batches
    are decoded while they are timed, not taken from a queue filled beforehand."""
    return max(DRAIN, s.dali_prefetch_queue + 1)


def timed(s):
    """The settings that stand for `s` in a measurement: its LEFT_OUT levers off."""
    return s.replace(**{name: off for name, off, _ in LEFT_OUT})


def left_out(s):
    """"timed without ..." for each LEFT_OUT lever `s` turns on, for a report ("" when none)."""
    return "; ".join(f"timed without {words}" for name, off, words in LEFT_OUT if getattr(s, name) != off)


def synthetic_vs_real(s, ctx, rounds=5, steps=5, figure=True):
    """{"synthetic": Rate, "real": Rate}: the config's training step (hybridized, as train.py) on constant batches,
    the ceiling, and on its real data, timed side by side on `ctx` after drain_for(s) untimed steps each; timed(s)
    stands for `s`. Without `figure` (a stand-in build, whose rate is none), the steps only run: no untimed steps
    and no uncounted round."""
    s = timed(s)
    runs = sources(s, ctx)
    step = train_step(s, ctx)
    return compare({name: (step, b) for name, b in runs.items()}, s.batch_size, rounds, steps,
                   drain_for(s) if figure else 0, uncounted=figure)
