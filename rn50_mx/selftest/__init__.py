"""A GPU owner's first three minutes on a new machine: is the stack right, does every stage of a run work on this
device with this config, and how fast is it next to the MLPerf anchors. One table; exit 1 when a check fails.

    source config/<SYSTEM>.sh
    python -m rn50_mx.selftest --data-train $DATADIR/train.rec --data-val $DATADIR/val.rec [rn50_mx.train flags]
    python -m rn50_mx.selftest --stack-only --expect-gpu        (the Dockerfile's build-time check)
    source config/<SYSTEM>.sh; python -m rn50_mx.selftest --stack-only   (a minute: the stack, and whether this
                                 MXNet is the NVIDIA build the rehearsal's stand-ins model)

The checks run the package's own code on the configured device (`dist.context`): the memory a process of the
config needs (rn50_mx.memory, an estimate) against the GPU's; the DALI pipelines on real records; the configured
layout and precision (NHWC float16, fused BatchNorm and NormConv where MXNet has them) against NCHW float32 on the
same weights and batch; one multi-precision LARS step against the float32 step; an allreduce across --ranks
processes (default: one per visible GPU; on the CPU 1, so CI asks for 2); training steps on synthetic and on real
batches, and one eval over the val set. On a CPU it is the same code on the CPU. First, on NVIDIA's build (or the
stand-in build), whether it is the build the rehearsal's stand-ins model (build.py).
"""
import argparse
import os
import sys

from .. import bind, children, config
from ..errors import InputError
from .report import Row, attempt, table
from .stack import stack_rows, topology


def parser():
    """The self-test's own options (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.selftest", __doc__)
    parser.add_argument("--stack-only", action="store_true",
                        help="only the stack: versions, build features, whether MXNet runs a kernel on each GPU, and "
                        "with DEVICE=gpu whether it is the NVIDIA build the rehearsal's stand-ins model")
    parser.add_argument("--expect-gpu", action="store_true",
                        help="fail unless MXNet has CUDA, cuDNN and NCCL, Horovod NCCL, and DALI >= 1.44")
    parser.add_argument("--ranks", type=int, default=0, help="processes for the allreduce check (0: one per GPU)")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per data source")
    parser.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse_args(argv):
    args, flags = parser().parse_known_args(argv)
    # bounded by the machine before anything starts: one process per CPU at most (horovodrun -np 10000 otherwise)
    if not 0 <= args.ranks <= os.cpu_count():
        raise InputError(f"--ranks={args.ranks}: must be 0 to {os.cpu_count()} (the CPUs of this machine)")
    if args.steps < 1:
        raise InputError(f"--steps={args.steps}: must be at least 1")
    return args, flags


# --- the checks after the stack, on the configured device ------------------------------------------------------


def device_checks(s, ranks, steps, flags):
    """Every check after the stack, on the configured device."""
    import mxnet as mx

    from .. import dist
    from . import build, checks

    ctx = dist.context(s, 0)
    rows = []
    with ctx:
        if s.device == "gpu":
            rows += build.build_rows(s, ctx)
        attempt(rows, "memory", checks.memory_need, s, ctx)
        iters = attempt(rows, "pipelines", checks.pipelines, s, ctx)
        try:
            net = checks.configured_network(s, ctx)
        except InputError as err:  # the fused kernels refuse this GPU (model.check_fused_kernels): said in one row
            rows.append(Row("network", False, str(err)))
            return rows
        if iters:
            iters[0].reset()
            attempt(rows, "layout/precision", checks.layout_precision, s, ctx, net, next(iters[0]))
        attempt(rows, "lars float16", checks.lars_step, s, ctx)
        attempt(rows, "allreduce", checks.allreduce, s, ranks, flags)
        attempt(rows, "one GPU per process", checks.one_gpu, s)
        if iters:
            attempt(rows, "train steps", checks.timed_steps, s, ctx, steps)
            attempt(rows, "eval", checks.evaluation, net, iters[1])
    mx.nd.waitall()
    return rows


def build_checks(s):
    """build.build_rows on the configured GPU, or on the CPU where none is visible (its kernels row then says so):
    with --stack-only, the minute that tells an image's first owner where the rehearsal's picture of it was wrong."""
    import mxnet as mx

    from .. import dist
    from . import build

    gpu = s.standin != "off" or mx.context.num_gpus() > 0
    return build.build_rows(s, dist.context(s, 0) if gpu else mx.cpu())


def main(argv=None):
    children.stop_on_sigterm()  # a stopped self-test ends its horovodrun and ranks (run_cli)
    args, flags = parse_args(sys.argv[1:] if argv is None else argv)
    settings = config.load(flags, prog="rn50_mx.selftest")
    if args.allreduce_worker:
        from . import checks

        return checks.allreduce_worker(settings)
    build_rows = build_checks(settings) if args.stack_only and settings.device == "gpu" else []
    rows = stack_rows(args.expect_gpu) + build_rows  # the build's rows first: the stand-in build, if any, installed
    if not args.stack_only:
        from .. import data  # loads MXNet and DALI: not for --stack-only

        data.check_files(settings)
        if not settings.data_train or not settings.data_val:
            raise InputError("--data-train and --data-val: the self-test reads real records of both splits")
        gpus = len(bind.query_gpus("index")) if settings.device == "gpu" else 1
        rows += device_checks(settings, args.ranks or gpus, args.steps, flags)
    print(table(rows))
    topo = topology()
    if topo:
        print("\nnvidia-smi topo -m:\n" + topo)
    failed = [r.name for r in rows if r.status is False]
    print(f"selftest: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}", flush=True)
    return 1 if failed else 0
