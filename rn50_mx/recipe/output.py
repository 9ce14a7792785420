"""Output: the recipe in words and as config/<NAME>.sh."""
import math
import os
import subprocess

from .. import anchors, config, memory
from ..files import write_atomically
from ..mlperf_rules import EVAL_PERIOD, IMAGENET_TRAIN
from .rules import momentum_note

INIT_AND_EVAL_MINUTES = 15  # per trial: the 30 untimed minutes the rules allow are rarely used
JOB_MINUTES = 10  # per job: the image's start and the checks before the first trial


def minutes(epochs, recipe, img_per_sec):
    return epochs * IMAGENET_TRAIN / (img_per_sec * recipe.gpus) / 60


def trial_minutes(recipe, img_per_sec):
    """One trial: the whole epoch budget plus init and evals, up to 5 minutes."""
    return math.ceil((minutes(recipe.last_eval, recipe, img_per_sec) + INIT_AND_EVAL_MINUTES) / 5) * 5


def number(value):
    """A value as a config file writes it: whole numbers without a decimal point."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def eval_epochs(recipe):
    first = recipe.eval_offset + 1
    return f"{first}, {first + EVAL_PERIOD}, ..., {recipe.last_eval}"


def describe(recipe, img_per_sec, speed_source, forecast=""):
    """The recipe in words: values, why, what to expect (`forecast`: rn50_mx.recipe.predict's line)."""
    mean, low, high = recipe.expect
    rows = [
        f"machine: {recipe.nodes} node(s) x {recipe.gpus_per_node} GPUs x {recipe.batch_per_gpu} images = global "
        f"batch {recipe.global_batch} (ruleset {recipe.ruleset})",
        f"recipe ({recipe.kind}): {recipe.basis}",
        f"  LR {number(recipe.lr)}, warmup {number(recipe.warmup_epochs)} epochs, poly(2) to 1e-4 over "
        f"{recipe.num_epochs} epochs, momentum {recipe.momentum}, weight decay {recipe.wd:.1e}, LARS eta 0.001 eps 0",
        f"epochs to expect: {number(round(mean, 2))} ({recipe.expect_source}; "
        f"the reference runs took {low}-{high})",
        f"epoch budget: the decay ends at NUMEPOCHS {recipe.num_epochs}"
        + (f", then END_LR up to RN50_MAX_EPOCHS {recipe.epoch_limit}" if recipe.epoch_limit > recipe.num_epochs
           else "")
        + f"; the last eval is after epoch {recipe.last_eval}, {recipe.last_eval - recipe.eval_target} epoch(s) "
        "past the expected one, and a run that has not converged by then stops there",
        f"evals: EVAL_PERIOD {EVAL_PERIOD}, EVAL_OFFSET {recipe.eval_offset}: after epochs {eval_epochs(recipe)}",
        f"time to train: ~{minutes(recipe.eval_target, recipe, img_per_sec):.1f} min at {img_per_sec:,.0f} img/s per "
        f"GPU ({speed_source}; ideal scaling, evals and init not counted), "
        f"{minutes(recipe.last_eval, recipe, img_per_sec):.1f} min for the whole budget",
        *([forecast] if forecast else []),
        recipe.checker_line,
    ]
    note = momentum_note(recipe.global_batch, recipe.momentum)
    return "\n".join(rows + [f"note: {text}" for text in recipe.notes + ([note] if note else [])])


def memory_line(path, gpu_memory, gpu):
    """The memory a process of the config at `path` needs (rn50_mx.memory, from the settings sourcing it gives)
    against `gpu_memory` bytes, in words; the line says so when it does not fit."""
    out = subprocess.run(["bash", "-c", 'source "$1" && env -0', "bash", path], env={"PATH": os.environ["PATH"]},
                         capture_output=True, check=True)
    environ = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    need = memory.need(config.load([], environ))
    line = "memory: " + memory.words(need, gpu_memory, gpu)
    return line + " (--max-batch-per-gpu)" if sum(need) > gpu_memory else line


def max_epochs_line(recipe):
    """The RN50_MAX_EPOCHS export when the recipe trains past its horizon, else nothing."""
    if recipe.epoch_limit == recipe.num_epochs:
        return ""
    return (f"export RN50_MAX_EPOCHS={recipe.epoch_limit}  # on at END_LR to the eval after epoch {recipe.expect[2]}, "
            "where the slowest reference run converged\n")


def config_text(recipe, command, img_per_sec, gpu, cores_per_gpu):
    """config/<NAME>.sh in the form of the other configs: the GPU settings every config shares, the recipe, the
    input pipeline's start for this GPU generation (`gpu`, an anchors.Anchor), and Slurm's time limit for NEXP
    trials in one job (run.sub runs them all)."""
    return f"""# shellcheck shell=bash source-path=SCRIPTDIR
# {recipe.nodes} node(s) x {recipe.gpus_per_node} GPUs x {recipe.batch_per_gpu} = {recipe.global_batch} images per step,
# written by `{command}` (ruleset {recipe.ruleset}).
# Recipe ({recipe.kind}): {recipe.basis}
# The GPU settings every config shares (precision, layout, LARS, DALI hints, Horovod, NCCL): gpu_common.sh
source "$(dirname "${{BASH_SOURCE[0]}}")/gpu_common.sh"

export BATCHSIZE={recipe.batch_per_gpu}  # per GPU
export LR={number(recipe.lr)}
export WARMUP_EPOCHS={number(recipe.warmup_epochs)}
export NUMEPOCHS={recipe.num_epochs}  # the horizon of the poly(2) decay
{max_epochs_line(recipe)}export EVAL_OFFSET={recipe.eval_offset}  # evals after epochs {eval_epochs(recipe)}
export WD={recipe.wd:.1e}
export MOM={recipe.momentum}

## The input pipeline's start for {gpu.label} ({cores_per_gpu} CPU cores per GPU); then run the tuner on one node
## (python -m rn50_mx.tune): it measures these and writes config/<NAME>_tuned.sh, which the launchers source next.
export DALI_HW_DECODER_LOAD={gpu.hw_decoder_load}  # share of JPEGs for the hardware decoder (MLPerf configs)
export DALI_THREADS={anchors.dali_threads(cores_per_gpu)}
export DALI_PREFETCH_QUEUE={gpu.prefetch}
export DALI_TMP_BUFFER_HINT={anchors.TMP_BUFFER_PER_IMAGE * recipe.batch_per_gpu}  # resize scratch: bytes x batch

export DGXNGPU={recipe.gpus_per_node}
export DGXNNODES={recipe.nodes}
# minutes for sbatch -t: the job's NEXP trials (run.sub's default 5), each {trial_minutes(recipe, img_per_sec)}
export WALLTIME=$(( ${{NEXP:-5}} * {trial_minutes(recipe, img_per_sec)} + {JOB_MINUTES} ))
DGXSYSTEM=$(basename "${{BASH_SOURCE[0]}}" .sh)
export DGXSYSTEM
"""


def write_config(path, text, force):
    """Write through a temporary name and rename; an existing config is kept unless forced."""
    write_atomically(path, text, "config", force=force)
