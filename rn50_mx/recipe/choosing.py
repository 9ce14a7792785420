"""Choosing the recipe: an exact RCP hit, an interpolation between neighbouring RCPs, or a published run."""
import math
from collections import Counter
from dataclasses import dataclass, field

from .. import config
from ..errors import InputError
from ..mlperf_rules import EVAL_PERIOD, PRUNED, PUBLISHED, checker_reference, load_checker, rcp_points
from .rules import closed_rule_failures



@dataclass
class Recipe:
    """What the user runs, why, and what to expect."""
    ruleset: str
    nodes: int
    gpus_per_node: int
    batch_per_gpu: int
    kind: str  # "RCP", "interpolated" or "published"
    basis: str  # where the hyperparameters come from, in words
    lr: float
    warmup_epochs: float
    num_epochs: int
    momentum: float
    wd: float
    expect: tuple  # (mean, lowest, highest) epochs to converge
    expect_source: str
    checker_line: str
    notes: list = field(default_factory=list)

    @property
    def gpus(self):
        return self.nodes * self.gpus_per_node

    @property
    def global_batch(self):
        return self.gpus * self.batch_per_gpu

    @property
    def eval_target(self):
        """The epoch an eval must fall on: where most reference runs converged (rounded up for a mean)."""
        return math.ceil(self.expect[0])

    @property
    def eval_offset(self):
        return (self.eval_target - 1) % EVAL_PERIOD

    @property
    def epoch_limit(self):
        """NUMEPOCHS, or past it (at the end LR, RN50_MAX_EPOCHS) up to the first eval at or after the epoch where
        the slowest reference run converged: a run as slow as that one is then judged, not stopped before."""
        first = self.eval_offset + 1
        covering = first + max(0, math.ceil((self.expect[2] - first) / EVAL_PERIOD)) * EVAL_PERIOD
        return max(self.num_epochs, covering)

    @property
    def last_eval(self):
        """The last epoch the schedule evaluates within the limit; training stops there."""
        first = self.eval_offset + 1
        return first + (self.epoch_limit - first) // EVAL_PERIOD * EVAL_PERIOD

    def settings(self):
        """The recipe as rn50_mx Settings (validated as training validates them)."""
        return config.Settings().replace(
            batch_size=self.batch_per_gpu, lr=self.lr, warmup_epochs=self.warmup_epochs, num_epochs=self.num_epochs,
            max_epochs=self.epoch_limit if self.epoch_limit > self.num_epochs else 0,
            mom=self.momentum, wd=self.wd, eval_period=EVAL_PERIOD, eval_offset=self.eval_offset,
            dgxngpu=self.gpus_per_node, dgxnnodes=self.nodes, kv_store="horovod")


def whole_epochs(epochs):
    """A horizon as rn50_mx's whole NUMEPOCHS: to a tenth (step counts convert to 36.99 or 37.0001), then up."""
    return math.ceil(round(epochs, 1))


def mode_epoch(epochs):
    """The epoch most runs converged at (the earliest of a tie): where the eval schedule should put an eval."""
    counts = Counter(epochs)
    return min(e for e in counts if counts[e] == max(counts.values()))


def exact_hits(points, gpus, max_batch):
    """Points whose global batch these GPUs reach exactly within the per-GPU limit, largest per-GPU batch first."""
    return sorted((p for p in points if p.batch % gpus == 0 and p.batch // gpus <= max_batch),
                  key=lambda p: -p.batch)


def from_point(point, args, checker, kind):
    """A recipe that takes a validated point's hyperparameters as they are."""
    record, _, how = checker_reference(checker, point.batch)
    rcp = checker._find_rcp(point.batch, "full_rcps") if kind == "RCP" else None
    mean = f", RCP mean {rcp['RCP Mean']:.2f}" if rcp else ""
    recipe = Recipe(args.ruleset, args.nodes, args.gpus_per_node, point.batch // (args.nodes * args.gpus_per_node),
                  kind, f"{point.name} as it is ({point.source})", point.lr, point.warmup_epochs,
                  whole_epochs(point.horizon), point.momentum, point.wd,
                  (mode_epoch(point.epochs), min(point.epochs), max(point.epochs)),
                  f"most of its {len(point.epochs)} converged runs{mean}",
                  checker_words(record, how))
    return recipe


def checker_words(record, how):
    if record is None:
        return f"RCP checker: {how}"
    return (f"RCP checker: compares your runs with {how}: mean {record['RCP Mean']:.2f} epochs; it accepts a "
            f"5-run olympic mean of at least {record['Min Epochs']:.2f}")


def interpolate(low, high, batch):
    """Hyperparameters for a batch between two validated points. LR^2 is linear in the batch (the square-root rule:
    exact from 1632 to 3264, 7.4 -> 10.5; bounded by the neighbours elsewhere); warmup and horizon are linear in the
    batch, rounded up to whole epochs; momentum is the lower neighbour's (the rules fix 0.9 below 32k) and weight
    decay the lower neighbour's, at the nearest 1e-4 x 2^N (the closed rule)."""
    t = (batch - low.batch) / (high.batch - low.batch)
    lr = math.sqrt(low.lr ** 2 + t * (high.lr ** 2 - low.lr ** 2))
    return dict(lr=round(lr, 2), warmup_epochs=math.ceil(low.warmup_epochs + t * (high.warmup_epochs - low.warmup_epochs)),
                num_epochs=whole_epochs(low.horizon + t * (high.horizon - low.horizon)), momentum=low.momentum,
                wd=1e-4 * 2.0 ** round(math.log2(low.wd / 1e-4)))


def neighbours(points, batch):
    below = [p for p in points if p.batch < batch]
    above = [p for p in points if p.batch > batch]
    return (max(below, key=lambda p: p.batch) if below else None), (min(above, key=lambda p: p.batch) if above else None)


def interpolated(args, checker, anchors):
    """The recipe at the largest global batch the GPUs hold, between two neighbouring anchors."""
    gpus = args.nodes * args.gpus_per_node
    batch = gpus * args.max_batch_per_gpu
    low, high = neighbours(anchors, batch)
    if low is None or high is None:
        span = f"{min(p.batch for p in anchors)}-{max(p.batch for p in anchors)}"
        raise InputError(f"--nodes {args.nodes} --gpus-per-node {args.gpus_per_node} --max-batch-per-gpu "
                         f"{args.max_batch_per_gpu}: global batch {batch} is outside every RCP and published run "
                         f"({span}) and lands on none of them exactly; change the per-GPU limit or the GPU count")
    values = interpolate(low, high, batch)
    record, kind, how = checker_reference(checker, batch)
    epochs = low.epochs + high.epochs
    if kind == "interpolated":
        expect, expect_source = (record["RCP Mean"], min(epochs), max(epochs)), "the RCP checker's interpolated mean"
    else:  # below the smallest RCP: the published neighbours' epochs
        expect, expect_source = (max(epochs), min(epochs), max(epochs)), "the slower neighbour's runs"
    return Recipe(args.ruleset, args.nodes, args.gpus_per_node, args.max_batch_per_gpu, "interpolated",
                  f"not validated by an RCP: derived from {low.name} and {high.name} (rn50_mx.recipe.interpolate: "
                  "LR^2 linear in the batch, warmup and horizon linear, momentum and weight decay of the lower)",
                  expect=expect, expect_source=expect_source, checker_line=checker_words(record, how), **values)


def choose(args):
    """The recipe for these GPUs: an exact RCP hit, else an interpolation, else (below 1632) a published run."""
    checker = load_checker(args.ruleset)
    gpus = args.nodes * args.gpus_per_node
    smallest = checker._find_min_rcp("full_rcps")["BS"]
    notes = []
    for point in exact_hits(rcp_points(checker), gpus, args.max_batch_per_gpu):
        recipe = from_point(point, args, checker, "RCP")
        failures = closed_rule_failures(recipe.settings(), args.ruleset)
        if not failures:
            recipe.notes = notes + recipe.notes
            return recipe
        notes.append(f"skipped {point.name}: the closed-division checker rejects its values ({failures[0]})")
    if gpus * args.max_batch_per_gpu >= smallest:
        notes.append(f"no RCP of ruleset {args.ruleset} is a multiple of {gpus} GPUs within {args.max_batch_per_gpu} "
                     "images per GPU")
        recipe = interpolated(args, checker, rcp_points(checker, PRUNED))
    else:
        notes.append(f"below the smallest RCP ({smallest}): the RCP table has nothing for {gpus} GPU(s) x "
                     f"{args.max_batch_per_gpu}; starting from published runs that converged")
        hits = exact_hits(PUBLISHED, gpus, args.max_batch_per_gpu)
        anchors = list(PUBLISHED) + [p for p in rcp_points(checker, PRUNED) if p.batch == smallest]
        recipe = from_point(hits[0], args, checker, "published") if hits else interpolated(args, checker, anchors)
    failures = closed_rule_failures(recipe.settings(), args.ruleset)
    if failures:
        raise InputError(f"the recipe for {recipe.global_batch} breaks the closed-division rules of ruleset "
                         f"{args.ruleset}: {failures[0]}")
    recipe.notes = notes + recipe.notes
    return recipe
