"""`python -m rn50_mx.rehearse`: a GPU config's whole code path on this CPU, before you queue on a cluster.

    source config/<SYSTEM>.sh
    python -m rn50_mx.rehearse [--ranks N] [--quick] [--work DIR] [--data-train T.rec --data-val V.rec]
                               [rn50_mx.train flags]

The config's own settings, shrunk to seconds (plan.py: small images, batches, epochs and ranks; every switch kept),
run through the package's own commands on the stand-in GPU build (rn50_mx/standin): DGXNGPU ranks become --ranks
Horovod (Gloo) ranks, each on a CPU context of its own with mixed contexts refused; NHWC and float16 run through CPU
twins of the kernels the CPU lacks; NVIDIA's fused BatchNorm and NormConv operators are stand-ins that refuse what the
fork's kernels refuse. Stages: the whole run (warm-up, evals on the schedule with the BatchNorm-statistics average,
--save-model), SIGTERM mid-epoch with a checkpoint and an exact resume, `evaluate` on the saved model, the self-test
and the input tuner's timing.
One table; exit 1 when a stage fails; a config whose loss diverges is a finding about the config (the train stage
says in how many steps, at which LR, with which optimizer), which ends the rehearsal with exit 78 when no stage
failed. It never says that the GPU run will work: only that this code path runs.
"""
import os
import sys
import tempfile
import time

from .. import children, config
from ..errors import InputError
from ..exits import DIVERGED_EXIT
from ..selftest.report import Row, table
from . import plan as planning
from . import stages

GPU_ONLY = ("kernel speed (images/s): the stand-in's figures are a CPU's",
            "the numerics of NVIDIA's kernels: cuDNN/cuBLAS float16, NormConv, fused BatchNorm (stand-ins compute "
            "in float32)",
            "NCCL and the fabric: the allreduce here is Gloo on one machine",
            "GPU memory: MXNet's pool and cudaMalloc (rn50_mx.memory estimates it; the self-test compares on a GPU)",
            "DALI's mixed decoder (nvJPEG, the hardware decoder) and its GPU operators: DALI's CPU builds ran",
            "CUDA graphs, the launchers' GPU binding and containers (make test runs the launchers on CPU configs)",
            "the image's own MXNet: the stand-ins model NVIDIA's public fork (docs/rehearsal.md); in the image, "
            "python -m rn50_mx.selftest --stack-only checks that picture")


DIVERGES = "the config"  # the detail of a stage whose run found the config's loss diverging (stages.ConfigDiverges)


def parser():
    """The rehearsal's own options (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.rehearse", __doc__)
    parser.add_argument("--ranks", type=int, default=2, help="processes standing in for the config's GPUs (default 2)")
    parser.add_argument("--quick", action="store_true", help="the whole run only: no stop and resume, evaluate, "
                        "self-test or tuner (CI rehearses every config's code path so)")
    parser.add_argument("--work", default="", help="folder of the rehearsal's data, logs and models (default: a "
                        "temporary folder, removed at the end)")
    return parser


def parse_args(argv):
    args, flags = parser().parse_known_args(argv)
    stages.checked_ranks(args.ranks)
    if args.work and (os.path.islink(args.work) or (os.path.exists(args.work) and not empty_folder(args.work))):
        raise InputError(f"--work {args.work}: must be a new or empty folder (the rehearsal's runs write there)")
    return args, flags


def own_data(flags):
    """Whether --data-train and --data-val were given on the command line (the records to rehearse on: a few hundred
    images of yours); DATADIR alone is not taken."""
    given = {flag.split("=")[0] for flag in flags}
    return {"--data-train", "--data-val"} <= given


def empty_folder(path):
    """Whether `path` is an empty folder; one line when it cannot be listed."""
    try:
        return os.path.isdir(path) and not os.listdir(path)
    except OSError as err:
        raise InputError(f"--work {path}: cannot read ({err.strerror})") from None


def rehearse(s, ranks, work, quick=False, own_data=False):
    """[Row] of every stage, in order (with `quick`, the run alone), on generated records or, with `own_data`, on
    the settings' data files; a stage whose input an earlier one failed to make is not run."""
    rows = [Row("config", True, f"{s.dgxsystem or 'sourced'}: {s.device} {s.input_layout} {s.dtype}, "
                f"{s.optimizer}, batch {s.batch_size} x {s.world_size}"
                + (f", NormConv {s.normconv_wiring}" if s.normconv else ", NormConv off")
                + f"; stand-in GPU sm_{s.standin_sm} (RN50_STANDIN_SM)")]
    plan = planned(s, ranks, work, own_data, quick)
    rows += [Row("shrunk", None, line) for line in plan.shrunk]
    reference = attempt(rows, "train", stages.train, plan, work)
    if reference and not quick:
        attempt(rows, "stop and resume", stages.stop_and_resume, plan, work, reference)
        attempt(rows, "evaluate", stages.evaluate, plan, work, reference)
    if not quick:
        attempt(rows, "self-test", stages.selftest, plan, work)
        attempt(rows, "tune", stages.tune, plan, work)
    return rows + [Row("GPU only", None, what) for what in GPU_ONLY]


def planned(s, ranks, work, own_data=False, quick=False):
    """The Plan of the rehearsal of `s` on `ranks` ranks: on the settings' data files with `own_data`, else on records
    generated in WORK/data with the config's classes (DATADIR's ImageNet is not read: each shrunk eval would read its
    whole val split); with `quick` (the run alone, no stop to land) at fewer steps an epoch."""
    steps = planning.QUICK_STEPS if quick else planning.STEPS
    if own_data:
        return planning.shrink(s, ranks, {"train": s.data_train, "val": s.data_val}, steps)
    return planning.shrink(s, ranks, planning.generated_records(os.path.join(work, "data"), s.num_classes), steps)


def attempt(rows, name, stage, *args):
    """Run one stage into `rows`; a stage returns its detail, or (detail, value) to hand `value` to later stages:
    attempt returns that value, True without one, None when the stage failed (its one line in the table)."""
    tic = time.time()
    try:
        result = stage(*args)
    except stages.StageFailed as err:
        rows.append(Row(name, False, str(err)))
        return None
    except stages.ConfigDiverges as finding:
        rows.append(Row(name, False, f"{DIVERGES} {finding}"))
        return None
    detail, value = result if isinstance(result, tuple) else (result, True)
    rows.append(Row(name, True, f"{detail} [{time.time() - tic:.0f} s]"))
    return value


def main():
    children.stop_on_sigterm()
    args, flags = parse_args(sys.argv[1:])
    s = config.load(flags, prog="rn50_mx.rehearse")
    if s.device != "gpu":  # before --work is made
        raise InputError(f"DEVICE={s.device}: not a GPU config; a CPU config's path is what make test runs")
    stages.horovodrun(args.ranks)  # every stage's ranks run under it: one line before any work
    tic = time.time()
    if args.work:
        try:
            os.makedirs(args.work, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=args.work)
        except OSError as err:
            raise InputError(f"--work {args.work}: cannot write there ({err.strerror})") from None
        probe.close()
        rows = rehearse(s, args.ranks, args.work, args.quick, own_data(flags))
    else:
        # The folder goes with the rehearsal however it ends: at its end here, or after a SIGKILL by a process that
        # waits for it (children.remove_after), its children ended first by the kernel (stages: children.start_tied).
        with tempfile.TemporaryDirectory(prefix="rn50-rehearse-", ignore_cleanup_errors=True) as work:
            children.remove_after(work)
            rows = rehearse(s, args.ranks, work, args.quick, own_data(flags))
    print(table(rows))
    failed = [r.name for r in rows if r.status is False and not r.detail.startswith(DIVERGES)]
    found = [f"{r.detail} ({r.name} stage)" for r in rows if r.status is False and r.detail.startswith(DIVERGES)]
    verdict = "no stage failed in the code" if found else "every stage ran"
    verdict = f"FAILED: {', '.join(failed)}" if failed else verdict
    print(f"rehearse: {verdict} in {time.time() - tic:.0f} s on stand-ins; what only a GPU can show is listed above, "
          "and this says nothing of whether the GPU run will work", flush=True)
    for line in found:
        print(f"rehearse: {line}", flush=True)
    return 1 if failed else DIVERGED_EXIT if found else 0

