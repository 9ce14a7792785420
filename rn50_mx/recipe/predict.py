"""Time to train for any cluster, from a small model fitted to the published MLPerf ResNet-50 results.

A training step of a GPU takes its share of the images at the generation's own speed, plus, across nodes, the part
of the gradient allreduce the backward pass does not hide:

    step seconds = b / v  +  [nodes > 1] x (latency + per_doubling x log2(nodes) + max(0, ring - BACKWARD x b / v))
    ring         = 2 (nodes - 1) / nodes x GRADIENT_BYTES / node bandwidth  (a ring allreduce of fp16 gradients)
    minutes      = epochs x steps per epoch x step seconds / 60  +  evals  (+ init, which the score does not time)

b is the per-GPU batch; v the generation's images/s per GPU on one node (fitted: the median of the single-node
results; a user's measured figure replaces it); latency and per_doubling (two constants shared by every generation)
are fitted by least squares to what the multi-node results lost per step against b / v. Epochs are the recipe's
epochs to expect (its RCP's runs, or the RCP checker's mean at the batch; the checker's mean in
bench/predict_ttt.py). The fitted constants live in predict_fit.py, written by bench/predict_ttt.py from
bench/mlperf_resnet_results.csv; its leave-one-round-out errors give the interval.
"""
import functools
import math
import re

from ..mlperf_rules import EVAL_PERIOD, IMAGENET_TRAIN, checker_reference, load_checker
from . import predict_fit

PARAMETERS = 25_557_032  # ResNet-50 v1.5's trainable parameters (the gradient an allreduce sums every step)
GRADIENT_BYTES = 2 * PARAMETERS  # fp16 gradients, as the MLPerf MXNet submissions reduce them
BACKWARD = 2 / 3  # share of a step's compute in the backward pass (about twice the forward), which hides the ring
EVAL_IMAGES = 50_000  # ImageNet's validation set, evaluated every EVAL_PERIOD epochs
EVAL_SPEEDUP = 3  # a forward pass alone costs about a third of a training step
# A node's compute fabric (total Gb/s) where the system description names none: a DGX of the generation
DEFAULT_NODE_GBPS = {"V100": 800, "A100": 1600, "H100": 3200, "H200": 3200}
FABRIC = re.compile(r"\bIB\b|InfiniBand|RoCE|Omni-?Path|OPA|ConnectX|[HNE]DR", re.I)
SIZES = ("1 node", "2-16 nodes", "more")


def generation(accelerator, system=""):
    """The fit's GPU key of an accelerator's name (and its system's, which some descriptions need to say PCIe): the
    generation, with '-PCIe' for the PCIe cards (the same chip much slower: 4,500 against 7,000 images/s for H100
    in the v3.0-v4.0 logs); other GPUs by model, or the name itself."""
    found = re.search(r"\b(V100|A100|H100|H200|GH200|A30|A40|A10|L40S|L40|L4|T4|A5000|A6000)", accelerator, re.I)
    if not found:
        return " ".join(accelerator.split())
    pcie = found.group(1).upper() in ("V100", "A100", "H100") and re.search(r"PCI", accelerator + system, re.I)
    return found.group(1).upper() + ("-PCIe" if pcie else "")


def node_gbps(interconnect, gpu):
    """A node's compute-fabric bandwidth in Gb/s from a system description's host_networking ('Compute: 8x
    ConnectX-6 IB HDR 200Gb/Sec' -> 1600): only the parts that name a cluster fabric (InfiniBand, RoCE, Omni-Path),
    storage and management links left out; else the generation's DGX figure (many descriptions name only their
    management Ethernet, '1Gb Ethernet', while their logs scale as a fabric does)."""
    best = 0
    for part in re.split(r"[,+;]", interconnect or ""):
        if re.search(r"storage|management", part, re.I) or not FABRIC.search(part):
            continue
        rate = re.search(r"(\d+)\s*G(?:b|bps)", part, re.I)
        count = re.search(r"(\d+)\s*x\b", part, re.I)
        if rate:
            best = max(best, int(rate.group(1)) * (int(count.group(1)) if count else 1))
    return best or DEFAULT_NODE_GBPS.get(gpu.split("-")[0], DEFAULT_NODE_GBPS["A100"])


def rcp_epochs(global_batch, ruleset=predict_fit.RULESET):
    """The RCP checker's mean epochs at this global batch (an RCP, or its interpolation; the smallest RCP's below
    the table); None above the table."""
    record, _, _ = checker_reference(checker(ruleset), global_batch)
    return record["RCP Mean"] if record else None


@functools.lru_cache(maxsize=None)
def checker(ruleset):
    """The RCP checker of a ruleset, read once (bench/predict_ttt.py asks it for every result of every fit)."""
    return load_checker(ruleset)


def step_seconds(batch_per_gpu, nodes, img_per_s, gbps, fit=predict_fit):
    """One training step of a GPU: its images at `img_per_s`, plus the allreduce the backward pass does not hide."""
    compute = batch_per_gpu / img_per_s
    if nodes == 1:
        return compute
    ring = 2 * (nodes - 1) / nodes * GRADIENT_BYTES * 8 / (gbps * 1e9)
    return compute + fit.LATENCY + fit.PER_DOUBLING * math.log2(nodes) + max(0.0, ring - BACKWARD * compute)


def minutes(epochs, nodes, gpus_per_node, batch_per_gpu, img_per_s, gbps, fit=predict_fit):
    """(scored minutes, ideal minutes): run_start to run_stop as the model predicts it (training and evals), and
    the ideal-scaling figure (every GPU at `img_per_s`, no allreduce, no evals)."""
    gpus = nodes * gpus_per_node
    steps = epochs * math.ceil(IMAGENET_TRAIN / (gpus * batch_per_gpu))
    train = steps * step_seconds(batch_per_gpu, nodes, img_per_s, gbps, fit)
    evals = math.ceil(epochs / EVAL_PERIOD) * EVAL_IMAGES / (gpus * img_per_s * EVAL_SPEEDUP)
    return (train + evals) / 60, epochs * IMAGENET_TRAIN / (gpus * img_per_s) / 60


def size_class(nodes):
    return SIZES[0] if nodes == 1 else SIZES[1] if nodes <= 16 else SIZES[2]


def speed(gpu, fit=predict_fit):
    """The fitted images/s per GPU of a generation key, or None when no published result has it."""
    return fit.IMG_PER_S.get(gpu)


def interval(predicted, nodes, fit=predict_fit):
    """(low, high) minutes: the prediction times the 10th and 90th percentile of published / predicted in the
    leave-one-round-out test for systems of this size."""
    low, high = fit.RATIO_INTERVAL[size_class(nodes)]
    return predicted * low, predicted * high


def init_minutes(nodes, fit=predict_fit):
    """init_start to run_start, the published median of systems of this size (not in the score, but in the job)."""
    return fit.INIT_MINUTES.get(size_class(nodes), 0.0)


def forecast(recipe, img_per_s, gbps, fit=predict_fit):
    """(predicted minutes, (low, high), ideal minutes) of the recipe: its expected epochs on its machine."""
    predicted, ideal = minutes(recipe.expect[0], recipe.nodes, recipe.gpus_per_node, recipe.batch_per_gpu,
                               img_per_s, gbps, fit)
    return predicted, interval(predicted, recipe.nodes, fit), ideal


def words(recipe, img_per_s, speed_source, gbps, fit=predict_fit):
    """The recipe's predicted time to train in one line: the figure, its interval, what it stands on, the ideal."""
    predicted, (low, high), ideal = forecast(recipe, img_per_s, gbps, fit)
    allreduce = (f"; {fit.LATENCY * 1e3:.1f} ms a step of allreduce the backward pass does not hide, over "
                 f"{gbps:g} Gb/s per node" if recipe.nodes > 1 else "")
    return (f"predicted time to train: {predicted:.1f} min (interval {low:.1f}-{high:.1f}: the published results' "
            f"leave-one-round-out errors for {size_class(recipe.nodes)}) plus {init_minutes(recipe.nodes):.1f} min "
            f"of init, at {img_per_s:,.0f} img/s per GPU ({speed_source}){allreduce}; ideal scaling would say "
            f"{ideal:.1f} min (rn50_mx.recipe.predict, docs/recipes.md)")


def table(recipes, img_per_s, gbps, fit=predict_fit):
    """One row per recipe (node count): GPUs, global batch, epochs, predicted minutes and interval, ideal minutes,
    and what the last doubling of the nodes still saved."""
    rows = [f"{'nodes':>5} {'GPUs':>5} {'batch':>6} {'epochs':>6} {'predicted min':>13} {'interval':>13} "
            f"{'ideal min':>9} {'saved':>6}"]
    before = None
    for recipe in recipes:
        predicted, (low, high), ideal = forecast(recipe, img_per_s, gbps, fit)
        saved = "" if before is None else f"{1 - predicted / before:.0%}"
        rows.append(f"{recipe.nodes:>5} {recipe.gpus:>5} {recipe.global_batch:>6} {recipe.expect[0]:>6.1f} "
                    f"{predicted:>13.2f} {f'{low:.2f}-{high:.2f}':>13} {ideal:>9.2f} {saved:>6}")
        before = predicted
    return "\n".join(rows)
