"""The MLPerf ResNet-50 facts in one place: the benchmark's constants, the RCP table read from mlperf-logging (the
files of each ruleset, the RCP checker, their decay steps as a horizon in epochs, the record the checker compares a
global batch with) and the published runs below the smallest RCP (PUBLISHED).

The target top-1 and the eval period are the settings' defaults (config.py, the ground floor, states them once);
mlperf_logging is imported only by the functions that read its tables."""
import functools
import glob
import os
from dataclasses import dataclass

from . import config
from .errors import InputError

USAGE = "training"
BENCHMARK = "resnet"
DEFAULT_RULESET = "1.0.0"  # the rules of the v1.0 submission rn50_mx reimplements
PRUNED = "pruned_rcps"  # the RCP set the package checker compares submissions with
IMAGENET_TRAIN = 1281167  # images in an ImageNet epoch: the RCPs' decay steps convert with it
IMAGENET_CLASSES = 1000
TARGET_TOP1 = config.FIELDS["accuracy_threshold"].default  # closed_resnet.yaml: some eval_accuracy must reach it
EVAL_PERIOD = config.FIELDS["eval_period"].default  # the rules: an eval every 4 epochs
RUNS_NEEDED = 5  # runs in a ResNet score (mlperf_logging.benchmark_meta; test_timing checks the two agree)
MAX_DROPPED = 1  # result summarizer and package checker: one dropped run per benchmark (4 for unet3d only)


@dataclass(frozen=True)
class Point:
    """One validated recipe: a global batch, its LARS hyperparameters and the epochs its runs converged in."""
    name: str
    batch: int
    lr: float
    warmup_epochs: float
    horizon: float  # poly(2) decay horizon, epochs
    momentum: float
    wd: float
    epochs: tuple  # the converged epoch of each run that converged
    source: str


# Published closed-division runs below the smallest RCP (1632), read from their result logs in
# github.com/mlcommons/training_results_v*: global_batch_size, the lars_* keys, run_stop's status and the last eval's
# epoch_num. Checked for this module with the search tool's mirror of those repositories.
PUBLISHED = (
    Point("2xA30 (NVIDIA)", 408, 3.0, 2, 37, 0.9, 5e-5, (35, 35, 35, 35),
          "training_results_v2.0 NVIDIA/results/2xa30_ngc22.04_mxnet/resnet/result_{0..4}.txt "
          "(config_A30_1x2x204.sh; result_1 aborted at epoch 35 with 0.75796)"),
    Point("2xA100-PCIe-80GB (Fujitsu)", 816, 5.3, 2, 37, 0.9, 5e-5, (35, 35, 35, 35),
          "training_results_v2.1 Fujitsu/results/rx_A100-PCIex2_mxnet_NGC_22.04/resnet/result_{0..4}.txt "
          "(config_RX2540M6_A100-PCIe.sh; result_3 aborted at epoch 35 with 0.7585)"),
    Point("1xA100-PCIe-80GB (H3C)", 1000, 8.5, 5, 60, 0.9, 5e-5, (55, 55, 55, 55, 55),
          "training_results_v2.0 H3C/results/R4900G5x1A100-PCIE-80GB/resnet/result_{1..5}.txt (the logs' decay "
          "steps say 60 epochs; the config_R4900G5x1A100-PCIE-80GB.sh in that repository says NUMEPOCHS=50)"),
    Point("4xA100-SXM4-40GB (Lenovo)", 1024, 6.0, 2, 37, 0.9, 2.5e-5, (35, 35, 35, 35, 35),
          "training_results_v2.1 Lenovo/results/SR670v2-4xA100_SXM4_40GB_400W/resnet/result_{1..5}.txt"),
)


def checker_module():
    """mlperf_logging's RCP checker module (imported on first use: the constants above need none of it)."""
    from mlperf_logging.rcp_checker import rcp_checker
    return rcp_checker


def summarizer_module():
    """mlperf_logging's result summarizer (imported on first use: it loads pandas and SciPy, a second of a CPU that a
    tool refusing its input in one line does not spend)."""
    from mlperf_logging.result_summarizer import result_summarizer
    return result_summarizer


def rcp_file(ruleset):
    """The package's ResNet RCP file of a ruleset."""
    return os.path.join(os.path.dirname(checker_module().__file__), f"{USAGE}_{ruleset}", f"rcps_{BENCHMARK}.json")


def rulesets():
    """The rulesets whose RCP folder has ResNet RCPs."""
    folders = glob.glob(os.path.join(os.path.dirname(checker_module().__file__), f"{USAGE}_*"))
    return sorted(os.path.basename(folder)[len(USAGE) + 1:] for folder in folders
                  if os.path.isfile(os.path.join(folder, f"rcps_{BENCHMARK}.json")))


@functools.lru_cache(maxsize=None)
def load_checker(ruleset):
    """The RCP checker of a ruleset: the table with its olympic means, lowest accepted means and pruning. Made once a
    process: its constructor computes every RCP's lowest accepted mean (about 900 t-tests, 0.14 CPU-s after scipy's
    import) and the recipe asks up to three times; what this package calls on it (_find_*, _get_rcp_data,
    _create_interp_rcp) reads it and changes nothing (mlperf_logging 4.1.68 rcp_checker.py: only __init__ and
    _prune_rcps assign to it)."""
    if not os.path.isfile(rcp_file(ruleset)):
        raise InputError(f"--ruleset {ruleset}: mlperf_logging has no ResNet RCPs for it (it has "
                         f"{', '.join(rulesets())})")
    return checker_module().RCP_Checker(USAGE, ruleset, BENCHMARK, False)


def horizon_epochs(record):
    """An RCP's opt_learning_rate_decay_steps in epochs. The files mix units (1.0.0: 35, 37, 42, 48, 58 and 90 are
    epochs, 22530, 6095 and 1133 are steps; from 1.1.0 most are steps). A value up to twice the slowest run's epochs
    is epochs; a larger one is steps of this batch. A step count that ends before the fastest run converged cannot be
    the whole schedule: it counts after the warmup (as the TF reference's decay_steps = train_steps - warmup_steps),
    so the warmup is added (1.0.0 2048, 8192 and 65536, 2.0.0 67840)."""
    hyper, slowest, fastest = record["Hyperparams"], max(record["Epochs to converge"]), min(record["Epochs to converge"])
    value = hyper["opt_learning_rate_decay_steps"]
    if value <= 2 * slowest:
        return float(value)
    epochs = value * record["BS"] / IMAGENET_TRAIN
    return epochs + hyper["opt_learning_rate_warmup_epochs"] if epochs < fastest else epochs


def rcp_point(record, ruleset):
    """An RCP record of the checker as a Point."""
    hyper = record["Hyperparams"]
    return Point(f"resnet_ref_{record['BS']}", record["BS"], hyper["opt_base_learning_rate"],
                 hyper["opt_learning_rate_warmup_epochs"], horizon_epochs(record), hyper["opt_momentum"],
                 hyper["opt_weight_decay"], tuple(record["Epochs to converge"]),
                 f"mlperf_logging rcp_checker/{USAGE}_{ruleset}/rcps_{BENCHMARK}.json")


def rcp_points(checker, rcp_pass="full_rcps"):
    """The checker's RCPs as Points: all of them, or the pruned ones it compares submissions with."""
    return [rcp_point(record, checker.ruleset) for record in checker._get_rcp_data(rcp_pass).values()]


def checker_reference(checker, batch):
    """(record, kind, words): the record the RCP checker compares runs of this global batch with, found as
    check_directory finds it among the pruned RCPs: the RCP itself ("rcp"), an interpolation between its neighbours
    ("interpolated"), the smallest RCP for a smaller batch ("smallest"); above the largest, none ("missing")."""
    found = checker._find_rcp(batch, PRUNED)
    if found:
        return found, "rcp", f"its RCP {batch}"
    low, high = checker._find_top_min_rcp(batch, PRUNED), checker._find_bottom_max_rcp(batch, PRUNED)
    if low and high:
        record = checker._create_interp_rcp(batch, low, high)[1]
        return record, "interpolated", f"its interpolation between RCPs {low['BS']} and {high['BS']}"
    if high:
        smallest = checker._find_min_rcp(PRUNED)
        return smallest, "smallest", f"its smallest RCP, {smallest['BS']} (for a smaller batch)"
    return None, "missing", f"no RCP at or above {batch}: the checker fails such runs until one is submitted"
