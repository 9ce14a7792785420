"""A working recipe and config/<NAME>.sh for your machine, from MLPerf's reference convergence points (RCPs).

    python -m rn50_mx.recipe --nodes 1 --gpus-per-node 4               # 4 x 408 = 1632: resnet_ref_1632 as it is
    python -m rn50_mx.recipe --nodes 2 --gpus-per-node 8 --system MYCLUSTER
    python -m rn50_mx.recipe --nodes 1 --gpus-per-node 2 --max-batch-per-gpu 204 --img-per-sec-per-gpu 1500

mlperf-logging ships the RCPs (rcp_checker/training_<ruleset>/rcps_resnet.json): for each validated global batch,
the LARS hyperparameters and the epochs its reference runs converged in. The recipe takes them from the package at
run time. Where the GPUs can land the global batch exactly on an RCP (per-GPU batch within --max-batch-per-gpu), it
takes that RCP's hyperparameters as they are, the closed division's hyperparameter borrowing. Otherwise it derives
them from the two neighbouring RCPs the RCP checker itself would interpolate between, and says so. Below the
smallest RCP (1632) it starts from a published MLPerf run that converged (PUBLISHED). A recipe the compliance
checker's closed-division rules reject is an error, not a config.
"""
import argparse
import os
import re
import shlex
import sys

from .. import anchors, config, memory
from ..mlperf_rules import (BENCHMARK, DEFAULT_RULESET, PRUNED, PUBLISHED, USAGE, horizon_epochs, load_checker,
                            rcp_file, rulesets)
from ..errors import InputError, printable
from . import open_division, predict
from .check import place, search_room, verdict
from .choosing import Recipe, choose, interpolate, mode_epoch, whole_epochs
from .output import config_text, describe, memory_line, write_config
from .rules import closed_rule_failures

__all__ = ["BENCHMARK", "DEFAULT_MAX_BATCH", "DEFAULT_RULESET", "PRUNED", "PUBLISHED", "USAGE", "Recipe",
           "choose", "closed_rule_failures", "config_text", "describe", "horizon_epochs", "interpolate",
           "load_checker", "main", "mode_epoch", "parse_args", "place", "rcp_file", "rulesets", "verdict",
           "whole_epochs", "write_config"]

DEFAULT_MAX_BATCH = 408  # the per-GPU batch of the NF5688M6 submission (A100-80GB)
# The ranges of the machine's numbers: what a cluster, a node, a GPU and a fabric can have, with room for hardware to
# come (an H100 trains ResNet-50 at about 7,000 img/s, a node's fabric is 8 x 400 Gb/s). A value outside is a typo or
# a unit slip: the predicted minutes and WALLTIME would be inf, NaN or hundreds of digits.
BOUNDS = {"nodes": (1, 10_000, "nodes"), "gpus_per_node": (1, 64, "GPUs"),
          "max_batch_per_gpu": (1, config.MAX_BATCH, "images"), "cores_per_node": (1, 4096, "cores"),
          "gpu_memory": (1, 1024, "GiB"), "img_per_sec_per_gpu": (1, 100_000, "images/s"),
          "node_gbps": (1, 100_000, "Gb/s")}


# --- command line ---------------------------------------------------------------------------------------------
def parser():
    """The recipe's options."""
    parser = config.Parser(prog="python -m rn50_mx.recipe", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, help="number of nodes (required unless --predict)")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per node")
    parser.add_argument("--max-batch-per-gpu", type=int, default=DEFAULT_MAX_BATCH,
                        help=f"largest per-GPU batch that fits in memory (default {DEFAULT_MAX_BATCH}, A100-80GB)")
    parser.add_argument("--ruleset", default=DEFAULT_RULESET, help=f"MLPerf training rules (default {DEFAULT_RULESET})")
    parser.add_argument("--gpu", default="A100", choices=sorted(anchors.BY_KEY),
                        help="GPU generation: the default images/s (its MLPerf anchor) and the input-pipeline "
                             "settings the config starts from (default A100: A100-80GB)")
    parser.add_argument("--gpu-memory", type=float,
                        help="GiB of memory per GPU, which the config's need is stated against (default the --gpu's: "
                             "80 GiB; e.g. 40 for A100-40GB)")
    parser.add_argument("--cores-per-node", type=int, default=os.cpu_count(),
                        help=f"CPU cores per node, for DALI's threads per GPU (default this machine's: "
                             f"{os.cpu_count()})")
    parser.add_argument("--img-per-sec-per-gpu", type=float, help="your measured training images/s per GPU")
    parser.add_argument("--node-gbps", type=float,
                        help="each node's compute-fabric bandwidth in Gb/s, for the predicted time to train (default "
                             "the --gpu's DGX: 8 NICs, 1600 for A100, 3200 for H100)")
    parser.add_argument("--predict", metavar="NODES,NODES,...",
                        help="only predict: the recipe's time to train for each of these node counts (e.g. "
                             "1,2,4,8,16), in a table; writes no config")
    parser.add_argument("--system", help="config name (default custom_<nodes>x<gpus>x<batch>)")
    parser.add_argument("--config-dir", default="config", help="where the configs and gpu_common.sh are")
    parser.add_argument("--force", action="store_true", help="replace an existing config/<NAME>.sh")
    parser.add_argument("--division", choices=("closed", "open"), default="closed",
                        help="closed: MLPerf's closed rules (default); open: the closed recipe plus the open-division "
                             "levers at the published open runs' values, logged and scored as open, written as "
                             "config/<NAME>_open.sh")
    return parser


def parse_args(argv=None):
    args = parser().parse_args(argv)
    args.predict = node_counts(args.predict)
    if args.nodes is not None and args.predict:
        raise InputError(f"--nodes {args.nodes} with --predict {','.join(map(str, args.predict))}: --predict's list "
                         "gives the node counts; give one of the two")
    if args.nodes is None:
        if not args.predict:
            raise InputError("--nodes: required (or --predict NODES,NODES,...)")
        args.nodes = args.predict[0]
    for name, (least, most, unit) in BOUNDS.items():
        value = getattr(args, name)
        if value is not None and not least <= value <= most:
            shown = value if isinstance(value, int) else f"{value:g}"
            raise InputError(f"{config.flag_name(name)}={shown}: must be {least:,} to {most:,} {unit}")
    if args.system is not None and not re.fullmatch(config.SYSTEM_NAME, args.system):
        raise InputError(f"--system {args.system!r}: a config name is letters, digits, '.', '_' and '-' (it names "
                         "config/<NAME>.sh and the launchers' DGXSYSTEM)")
    if args.system is not None and args.system.endswith(FRAGMENT_SUFFIXES):
        raise InputError(f"--system {args.system}: config/<SYSTEM>{' and '.join(FRAGMENT_SUFFIXES)}.sh are the "
                         "fragments the launchers source after config/<SYSTEM>.sh: give the config another name")
    if not os.path.isfile(os.path.join(args.config_dir, "gpu_common.sh")):
        raise InputError(f"--config-dir {args.config_dir}: no gpu_common.sh there (run from the rn50-mx checkout)")
    return args


def node_counts(text):
    """--predict's node counts as ints (None without the flag); a bad list is one line."""
    if text is None:
        return None
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    least, most, _ = BOUNDS["nodes"]
    if not counts or not least <= min(counts) <= max(counts) <= most or len(counts) > 64:
        raise InputError(f"--predict {text!r}: a comma-separated list of 1 to 64 node counts, each {least} to "
                         f"{most:,}, e.g. 1,2,4,8")
    return sorted(set(counts))


def speed_of(args, gpu):
    """(images/s per GPU, its source in words): the user's measured figure, else the fit's for the generation."""
    if args.img_per_sec_per_gpu:
        return args.img_per_sec_per_gpu, "yours"
    fitted = predict.speed(gpu.key)
    return fitted, f"{gpu.label}: the median of the single-node published results"


def predict_nodes(args, gpu):
    """The --predict table: the recipe chosen for each node count, its time to train predicted."""
    speed, source = speed_of(args, gpu)
    recipes = [choose(argparse.Namespace(**{**vars(args), "nodes": nodes})) for nodes in args.predict]
    gbps = args.node_gbps or predict.DEFAULT_NODE_GBPS[gpu.key]
    print(f"{args.gpus_per_node} {gpu.label} per node, up to {args.max_batch_per_gpu} images per GPU, ruleset "
          f"{args.ruleset}, {speed:,.0f} img/s per GPU ({source}), {gbps:g} Gb/s per node:")
    print(predict.table(recipes, speed, gbps))
    print("predicted: run_start to run_stop (the score), interval from the published results' leave-one-round-out "
          "errors; ideal: every GPU at full speed, no allreduce or evals; saved: against the row above")


FRAGMENT_SUFFIXES = ("_tuned", "_hparams")  # rn50_mx.tune's and rn50_mx.search's fragments (trials.sh source_fragments)


def shown_command(argv):
    """The command line for the config's comment: quoted as a shell would need it, and on one line whatever the
    arguments hold (a newline in a comment would start a shell line in the config the launchers source)."""
    return printable(shlex.join(["python", "-m", "rn50_mx.recipe", *argv]))


def main(argv=None):
    """Choose the recipe, print it, and write config/<NAME>.sh."""
    args = parse_args(argv)
    gpu = anchors.BY_KEY[args.gpu]
    if args.predict:
        return predict_nodes(args, gpu)
    recipe = choose(args)
    if args.img_per_sec_per_gpu:
        speed, speed_source = args.img_per_sec_per_gpu, "yours"
    else:
        speed, speed_source = gpu.img_per_s, f"{gpu.label} in the MLPerf logs"
    name = (args.system or f"custom_{recipe.nodes}x{recipe.gpus_per_node}x{recipe.batch_per_gpu}") + (
        "_open" if args.division == "open" else "")
    path = os.path.join(args.config_dir, name + ".sh")
    command = shown_command(sys.argv[1:] if argv is None else argv)
    cores_per_gpu = max(1, args.cores_per_node // recipe.gpus_per_node)
    forecast = predict.words(recipe, *speed_of(args, gpu), args.node_gbps or predict.DEFAULT_NODE_GBPS[gpu.key])
    text, words = config_text(recipe, command, speed, gpu, cores_per_gpu), describe(recipe, speed, speed_source,
                                                                                      forecast)
    if search_room(recipe):
        words = "\n".join([words, search_room(recipe)])
    if args.division == "open":
        text = open_division.mark(text) + open_division.config_block(recipe.num_epochs)
        words = "\n".join([words, *open_division.describe_lines(recipe.num_epochs)])
    write_config(path, text, args.force)
    print(words)
    print(memory_line(path, args.gpu_memory * memory.GIB if args.gpu_memory else gpu.memory_mib << 20,
                      f"{args.gpu_memory:g} GiB GPU" if args.gpu_memory else gpu.label))
    print(f"wrote {path}: source it, then `python -m rn50_mx.check` shows every value training will use")
    print(f"next: tune its input pipeline on one node with your data (DATADIR=... python -m rn50_mx.tune): it "
          f"writes config/{name}_tuned.sh, which the launchers source after {name}.sh")
