"""The search: coordinate descent over the knobs, each candidate timed in paired rounds against the incumbent.

The ceiling (synthetic batches) and the starting settings are timed side by side first. Then each knob in turn,
the most promising first, steps to a neighbouring value while that beats the incumbent: a candidate is timed in
alternating rounds with the incumbent (one untimed window first, for its pipeline's start), and its gain is the
median of its per-round ratios to the incumbent, so that the swings of shared cores cancel. A candidate far below
after its first round is dropped there. It stops when real/synthetic reaches the target, when every knob is done,
or when the next candidate would overrun the budget."""
import collections
import statistics
import time

from .. import measure
from . import space

ROUNDS = 3  # counted rounds per candidate
WIN = 1.02  # a candidate must beat the incumbent by this much: a tie keeps the settings as they are
DROP = 0.85  # a candidate this far below the incumbent after its first round is not timed further

Row = collections.namedtuple("Row", "knobs rate ratio verdict seconds")


class Search:
    """One search on `hosts` (hosts.Hosts); progress(row) is called for every candidate."""

    def __init__(self, hosts, knobs, space_, budget_s, target, steps, rounds=ROUNDS, progress=None):
        self.hosts, self.space, self.budget_s, self.target = hosts, space_, budget_s, target
        self.steps, self.rounds, self.progress = steps, rounds, progress or (lambda row: None)
        self.incumbent, self.rows, self.tried, self.stop = dict(knobs), [], set(), ""
        self.tic = time.perf_counter()

    def elapsed(self):
        return time.perf_counter() - self.tic

    def baseline(self):
        """The ceiling and the starting settings, side by side; sets the incumbent's real/synthetic."""
        timers = {"synthetic": self.hosts.timer(None, self.steps), "real": self.hosts.timer(self.incumbent, self.steps)}
        for timer in timers.values():
            timer()
        rates = measure.side_by_side(timers, self.rounds)
        self.ceiling = measure.median(rates["synthetic"])
        real = measure.median(rates["real"])
        self.ratio = real.images_per_s / self.ceiling.images_per_s
        self.record(self.incumbent, real, self.ratio, "start", self.elapsed())

    def record(self, knobs, rate, ratio, verdict, seconds):
        row = Row(dict(knobs), rate, ratio, verdict, seconds)
        self.rows.append(row)
        self.tried.add(space.describe(knobs))
        self.progress(row)

    def paired(self, candidate):
        """(median Rate of the candidate, its median per-round gain over the incumbent, rounds timed)."""
        timers = {"incumbent": self.hosts.timer(self.incumbent, self.steps),
                  "candidate": self.hosts.timer(candidate, self.steps)}
        timers["candidate"]()

        def far_below(r, rates):
            return r == 1 and rates["candidate"][0].images_per_s < DROP * rates["incumbent"][0].images_per_s

        rates = measure.side_by_side(timers, self.rounds, far_below)
        gains = [c.images_per_s / i.images_per_s for c, i in zip(rates["candidate"], rates["incumbent"])]
        return measure.median(rates["candidate"]), statistics.median(gains), len(gains)

    def affordable(self, last_cost):
        """Whether another candidate, costing about as much as the last, fits in what is left of the budget."""
        if self.elapsed() + last_cost > self.budget_s:
            self.stop = f"budget spent ({self.elapsed() / 60:.1f} of {self.budget_s / 60:.1f} min)"
            return False
        return True

    def try_knob(self, knob, choices, last_cost):
        """Hill-climb one knob: step while the neighbour wins, first down, then (if down lost at once) up."""
        for direction in (0, 1):
            moved = False
            while True:
                near = space.neighbours(knob, self.incumbent[knob], choices)
                options = [v for v in near if (v < self.incumbent[knob]) == (direction == 0)]
                candidate = {**self.incumbent, knob: options[0]} if options else None
                if candidate is None or space.describe(candidate) in self.tried:
                    break
                if not self.affordable(last_cost):
                    return last_cost
                tic = time.perf_counter()
                rate, gain, rounds = self.paired(candidate)
                won = gain >= WIN
                verdict = "kept" if won else (f"dropped after {rounds} round" if rounds < self.rounds else "no gain")
                last_cost = time.perf_counter() - tic
                self.record(candidate, rate, self.ratio * gain, verdict, last_cost)
                if not won:
                    break
                self.incumbent, self.ratio, moved = candidate, self.ratio * gain, True
                if self.ratio >= self.target:
                    self.stop = f"real/synthetic {self.ratio:.3f} reached the target {self.target}"
                    return last_cost
            if moved:
                break
        return last_cost

    def run(self):
        """The whole search; returns the chosen knobs."""
        self.baseline()
        last_cost = self.rows[0].seconds / 2
        if self.ratio >= self.target:
            self.stop = f"real/synthetic {self.ratio:.3f} already at the target {self.target}"
        for knob, choices in self.space:
            if self.stop:
                break
            last_cost = self.try_knob(knob, choices, last_cost)
        self.stop = self.stop or "every knob tried"
        return self.incumbent
