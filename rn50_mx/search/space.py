"""What the search may change, in which allowed form, and the coarse-then-fine plan over it.

Closed division (training_rules.adoc, "Hyperparameters" for ResNet; mlperf_logging closed_resnet_lars.yaml): the
base learning rate, the warmup epochs, the poly(2) horizon (lars_opt_learning_rate_decay_steps, NUMEPOCHS here),
the weight decay on its lattice 1e-4 x 2^N and the eval offset. Open division: any numeric setting of the
settings object, by its environment name.
"""
import math
from dataclasses import dataclass

from .. import config
from ..errors import InputError
from ..mlperf_rules import DEFAULT_RULESET, IMAGENET_CLASSES, checker_reference, load_checker

CLOSED = ("NUMEPOCHS", "LR", "WARMUP_EPOCHS", "WD", "EVAL_OFFSET")
# What no mode searches: the measuring stick (the target, the data, the eval schedule), the world a run is measured
# on, and the seed. A search over these "wins" by moving the stick (ACCURACY_THRESHOLD 0.18 won).
NEVER = {"ACCURACY_THRESHOLD": "the target", "NUMEXAMPLES": "the data", "NUM_CLASSES": "the data",
         "EVAL_PERIOD": "the eval schedule", "DGXNNODES": "the world size", "DGXNGPU": "the world size",
         "SEED": "the seed"}
WD_UNIT = 1e-4  # the rules allow lars_opt_weight_decay = 1e-4 * 2^N only
BY_ENV = {f.metadata["env"]: f for f in config.FIELDS.values() if f.metadata["env"]}
# The plan's phases, as the Inspur article tunes and the published logs suggest: the horizon first (runs converge
# about 2 epochs before its end; one too long cost submitters 4-8 epochs), then the learning rate within +-10-20%,
# then the warmup, then the weight decay one lattice step each way, then where the evals fall (the offset: the same
# run scores the epoch of the first eval at or past its convergence).
PHASES = {"NUMEPOCHS": ((-2, -1, 1), "add"), "LR": ((0.8, 0.9, 1.1, 1.2), "times"), "WARMUP_EPOCHS": ((-1, 1), "add"),
          "WD": ((0.5, 2.0), "times"), "EVAL_OFFSET": ((-1, 1, -2, 2, -3, 3), "add"),
          # open levers: the batch halved and doubled; label smoothing +-0.05 (MosaicML's 0.08 lies between); the
          # weight EMA at half-lives of about 7 and 23 updates (decay per update)
          "BATCHSIZE": ((0.5, 2.0), "times"), "LABELSMOOTHING": ((-0.05, 0.05), "add"),
          "RN50_EMA_DECAY": ((0.9, 0.97), "set")}


def phases(knobs, mode):
    """The plan's order: the closed knobs in PHASES' order; in open mode the knobs in the order given (--knob), the
    user's guess of what pays first. Knobs without steps are left to the sampler."""
    envs = [k.env for k in knobs] if mode == "open" else [env for env in PHASES if any(k.env == env for k in knobs)]
    return [(env, *PHASES[env]) for env in envs if env in PHASES]

@dataclass(frozen=True)
class Knob:
    """One searched setting: its environment name, its field, and the closed interval of its values."""
    env: str
    field: str
    low: float
    high: float
    integer: bool
    lattice: bool = False  # values WD_UNIT * 2^N only

    def values(self):
        """The lattice points inside [low, high] (lattice knobs only)."""
        n = range(math.ceil(math.log2(self.low / WD_UNIT) - 1e-9), math.floor(math.log2(self.high / WD_UNIT) + 1e-9) + 1)
        return [WD_UNIT * 2.0 ** k for k in n]

    def holds(self, value):
        return self.low <= value <= self.high and (not self.lattice or on_lattice(value))

    def distribution(self):
        import optuna

        if self.lattice:
            return optuna.distributions.CategoricalDistribution(self.values())
        if self.integer:
            return optuna.distributions.IntDistribution(int(self.low), int(self.high))
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.low > 0 and self.high / self.low > 4)


def on_lattice(wd):
    exponent = math.log2(wd / WD_UNIT) if wd > 0 else float("nan")
    return abs(exponent - round(exponent)) < 1e-9


def parse_knob(text, mode):
    """A --knob NAME=LOW:HIGH; closed mode takes only the closed-division hyperparameters, each in its form."""
    name, _, bounds = text.partition("=")
    low_text, _, high_text = bounds.partition(":")
    field = BY_ENV.get(name)
    if name in NEVER:
        raise InputError(f"--knob {text}: {name} is {NEVER[name]}, which the search measures by: no mode searches it")
    if field is None:
        raise InputError(f"--knob {text}: {name} is not a setting rn50_mx reads (give its environment name, e.g. LR)")
    if mode == "closed" and name not in CLOSED:
        raise InputError(f"--knob {text}: {name} is not a closed-division hyperparameter of ResNet-50 (closed: "
                         f"{', '.join(CLOSED)}); --mode open searches any setting")
    if field.type not in (int, float, "int", "float"):
        raise InputError(f"--knob {text}: {name} is not a number")
    integer = field.type in (int, "int")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise InputError(f"--knob {text}: give NAME=LOW:HIGH, two numbers") from None
    if not (math.isfinite(low) and math.isfinite(high) and low <= high) or (integer and (low, high) != (int(low), int(high))):
        raise InputError(f"--knob {text}: LOW:HIGH must be finite{' whole' if integer else ''} numbers, LOW <= HIGH")
    knob = Knob(name, field.name, low, high, integer, lattice=mode == "closed" and name == "WD")
    if knob.lattice and not 0 < low:
        raise InputError(f"--knob {text}: the closed rules allow WD = 1e-4 x 2^N only: LOW must be above 0")
    if knob.lattice and not knob.values():
        raise InputError(f"--knob {text}: the closed rules allow WD = 1e-4 x 2^N only, and none lies in [{low}, {high}]")
    return knob


def default_knobs(s, mode):
    """Around the sourced settings: the horizon from 2 below (or lower, down to the fewest epochs the RCP checker
    accepts at this batch: issue 34, published sets above a 4k batch sat 1-12% above the checker's mean) to 1 above,
    the learning rate halved to doubled, the warmup from 0 to one above (kept below the horizon)."""
    lowest = max(2, min(s.num_epochs - 2, accepted_epochs(s) or s.num_epochs))
    knobs = [Knob("NUMEPOCHS", "num_epochs", lowest, s.num_epochs + 1, True),
             Knob("LR", "lr", s.lr / 2, s.lr * 2, False),
             Knob("WARMUP_EPOCHS", "warmup_epochs", 0, s.warmup_epochs + 1, isinstance(s.warmup_epochs, int))]
    return knobs


def accepted_epochs(s, ruleset=DEFAULT_RULESET):
    """The fewest whole epochs whose 5-run olympic mean the RCP checker accepts at the settings' global batch (its
    'Min Epochs', up), or None: not LARS on ImageNet, or no RCP reaches the batch."""
    if s.num_classes != IMAGENET_CLASSES or not s.is_lars:
        return None
    record, _, _ = checker_reference(load_checker(ruleset), s.global_batch)
    return math.ceil(record["Min Epochs"]) if record else None


def start(s, knobs):
    """The sourced settings' values of the knobs: the search's first trial."""
    return {k.env: getattr(s, k.field) for k in knobs}


def check_start(params, knobs, mode):
    """The sourced values must be a point of the space (closed mode: WD on its lattice)."""
    for knob in knobs:
        if not knob.holds(params[knob.env]):
            raise InputError(f"{knob.env}={params[knob.env]}: the sourced value is outside --knob "
                             f"{knob.env}={knob.low:g}:{knob.high:g}" + (" or off the lattice 1e-4 x 2^N"
                                                                          if knob.lattice else ""))


def point_problem(point, knobs):
    """Why `point`, values read back from a study (a trial's, or the fixed ones a queued trial is asked with), is not
    a point of the knobs' space, or None. The database may be another's: a value planted there would reach a run, or
    fail in Optuna's ask at every later driver (a ValueError traceback)."""
    if not isinstance(point, dict):
        return f"{point!r:.100} is not a {{knob: value}}"
    by_env = {k.env: k for k in knobs}
    for env, value in point.items():
        knob = by_env.get(env)
        if knob is None:
            return f"{env!r:.40} is not one of the knobs {sorted(by_env)}"
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and knob.holds(value) and (not knob.integer or value == int(value))):
            return f"{env}={value!r:.40} is not a value of --knob {env}={knob.low:g}:{knob.high:g}"
    return None


def planned(best, knobs, phase):
    """The points of the plan's phase `phase` (one of `phases`) around the best params so far: one knob moved at a
    time, kept in its range."""
    env, steps, how = phase
    knob = next(k for k in knobs if k.env == env)
    points = []
    for step in steps:
        value = {"add": best[env] + step, "times": best[env] * step, "set": step}[how]
        value = int(round(value)) if knob.integer else value if knob.lattice else round(value, 6)
        if knob.holds(value) and value != best[env]:
            points.append({**best, env: value})
    return points


def apply(s, params, knobs):
    """The settings of one trial: the sourced ones with the knobs' values."""
    return s.replace(**{k.field: params[k.env] for k in knobs})
