"""The knobs the tuner may change, and their values. They change how fast batches come, not what training computes:
DALI's threads and prefetch depth, the fused decode + random crop (the same crop distribution, decoding only the
window), the share of JPEGs for the hardware decoder (GPU), and MXNet's OpenMP threads (CPU: the split of the cores
between DALI and the model). Antialiasing changes the images the model sees: it is searched only when allowed."""
import itertools
import os

from .. import config

# Search order, the most promising first: threads decide most of what a CPU-bound pipeline gives.
KNOBS = ("dali_threads", "omp_num_threads", "dali_roi_decode", "dali_prefetch_queue", "dali_hw_decoder_load")
AUGMENTATION = ("dali_resize_antialias",)
PREFETCH = (1, 2, 3)
HW_DECODER_LOAD = (0.0, 0.25, 0.5, 0.75, 1.0)


def cores():
    """The CPUs this process may run on (a numactl binding counts)."""
    return len(os.sched_getaffinity(0))


def values(s, knob):
    """The values of `knob` worth trying on this device, in order; () where it does nothing.

    hw_decoder_load is an argument of DALI's mixed (nvJPEG) decoder only; MXNet's OpenMP threads compete with DALI
    for the cores only when the model runs on them."""
    n, gpu = cores(), s.device == "gpu"
    return {"dali_threads": tuple(range(1, n + 2)),
            "omp_num_threads": () if gpu else tuple(range(1, n + 1)),
            "dali_roi_decode": (False, True),
            "dali_prefetch_queue": PREFETCH,
            "dali_hw_decoder_load": HW_DECODER_LOAD if gpu else (),
            "dali_resize_antialias": (True, False)}[knob]


def searched(s, allow_augmentation_changes):
    """The knobs of the search, in order, each with its values."""
    knobs = KNOBS + (AUGMENTATION if allow_augmentation_changes else ())
    return [(knob, values(s, knob)) for knob in knobs if values(s, knob)]


def start(s, allow_augmentation_changes=False):
    """The knobs of `s` as it is: the incumbent the search starts from. OMP_NUM_THREADS unset is MXNet's default,
    half the logical CPUs (src/engine/openmp.cc)."""
    knobs = {knob: getattr(s, knob) for knob, _ in searched(s, allow_augmentation_changes)}
    if "omp_num_threads" in knobs and not knobs["omp_num_threads"]:
        knobs["omp_num_threads"] = max(1, (os.cpu_count() or 2) // 2)
    return knobs


def neighbours(knob, value, choices):
    """The values next to `value` among `choices` (which may not hold it): the one below, then the one above."""
    below = [c for c in choices if c < value]
    above = [c for c in choices if c > value]
    return [v for v in (below[-1] if below else None, above[0] if above else None) if v is not None]


def grid(s, allow_augmentation_changes=False):
    """Every combination of the searched knobs' values: what a full grid search measures."""
    space = searched(s, allow_augmentation_changes)
    return [dict(zip([k for k, _ in space], combo)) for combo in itertools.product(*[v for _, v in space])]


def apply(s, knobs):
    """`s` with the knobs set: the settings a candidate trains with."""
    return s.replace(**knobs)


def env_name(knob):
    """The reference's variable of a knob."""
    return config.FIELDS[knob].metadata["env"]


def text(value):
    """A knob's value as its variable holds it (booleans as 0 and 1)."""
    return str(int(value)) if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def exports(knobs):
    """`knobs` as the reference's variables: (name, text) pairs a config file exports."""
    return [(env_name(knob), text(value)) for knob, value in knobs.items()]


def describe(knobs):
    """A candidate in one short line: its variables."""
    return " ".join(f"{name}={value}" for name, value in exports(knobs))
