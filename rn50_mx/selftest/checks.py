"""The checks on the configured device. Each returns its detail line, or (detail, value) to hand `value` to a
later check; it raises CheckFailed with a one-line verdict, or Skipped when it does not apply here."""
import os
import re
import shutil
import subprocess
import sys

from .. import anchors, bind, children, measure
from ..errors import InputError
from .report import CheckFailed, Skipped

# Loss of the configured model against NCHW float32 on the same weights and batch: float32 differs only in the
# order of sums; float16 in its 11-bit mantissa through 50 layers; bfloat16 in its 8-bit one (measured at the
# demo's batch of 128 32x32 images, 5 seeds: 0.05-0.79 % apart).
LOSS_RTOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 3e-2}
STEP_RTOL = 1e-4  # one LARS step's master weights against float32: the same arithmetic, summed in another order


def pipelines(s, ctx):
    """A few real batches from each pipeline: the configured shape (the first epoch's train size, the eval size),
    dtype and device, finite, labels in range."""
    import numpy as np

    from .. import data

    train_it, val_it = data.make_iters(s, 0, 1, s.seed or 1, ctx)
    shapes = data.batch_shape(s, hw=s.train_hw(0)), data.batch_shape(s, train=False)
    for name, it, count, shape in (("train", train_it, 2, shapes[0]), ("val", val_it, 1, shapes[1])):
        for batch, _ in zip(it, range(count)):
            x, y = batch.data[0], batch.label[0].asnumpy()
            if x.shape != shape or np.dtype(x.dtype) != np.dtype(s.input_dtype) or x.context != ctx:
                raise CheckFailed(f"{name} batch is {x.shape} {x.dtype} on {x.context}, not {shape} {s.input_dtype} "
                                  f"on {ctx}")
            if not (x.asnumpy().astype("float32") ** 2).sum() < float("inf"):
                raise CheckFailed(f"{name} batch has non-finite values")
            if y.min() < 0 or y.max() >= s.num_classes:
                raise CheckFailed(f"{name} labels outside [0, {s.num_classes})")
    shown = shapes[0] if shapes[0] == shapes[1] else "train {} and val {}".format(*shapes)
    detail = f"{shown} {s.dtype} {s.input_layout} on {ctx}, train {train_it.num_samples} and val " \
             f"{val_it.num_samples} images"
    return detail, (train_it, val_it)


def configured_network(s, ctx):
    """The network as training runs it (train.network: the configured layout, dtype and fused kernels, hybridized),
    from a fixed seed."""
    import mxnet as mx

    from .. import train

    mx.random.seed(1)
    return train.network(s, ctx)


def unhybridized(s, ctx, net):
    """The configured network with `net`'s weights, not hybridized: NormConv's fusions run only traced, so this is
    the plain path with the same parameters (model.Bottleneck.hybrid_forward), which must run and agree."""
    from .. import train

    imperative = train.network(s, ctx, hybridize=False, drawn=False)
    for name, param in imperative.collect_params().items():
        param.set_data(net.collect_params()[name].data())
    return imperative


def layout_precision(s, ctx, net, batch):
    """The configured network, hybridized as training runs it and imperatively as bench/train_step does, against
    NCHW float32 with separate BatchNorm kernels, run imperatively with the same weights, on one real batch: the mean
    losses must agree. Training mode (BatchNorm on the batch's own
    statistics), as training computes it: the initial running statistics would let activations grow unbounded."""
    import mxnet as mx

    from .. import model, optim

    ref = model.build_model(s.replace(input_layout="NCHW", dtype="float32", fused_bn=False, normconv=False), ctx,
                            drawn=False)
    for name, param in ref.collect_params().items():
        value = net.collect_params()[name].data().astype("float32")
        param.set_data(value.transpose((0, 3, 1, 2)) if value.ndim == 4 and s.input_layout == "NHWC" else value)
    x, y = batch.data[0], batch.label[0]
    x_ref = x.astype("float32").transpose((0, 3, 1, 2)) if s.input_layout == "NHWC" else x.astype("float32")
    loss_fn = optim.make_loss(s)
    try:
        with mx.autograd.train_mode():
            loss = float(loss_fn(net(x), y).mean().asscalar())
    except mx.base.MXNetError as err:  # NVIDIA's fused kernels end in LOG(FATAL) "No fallback impl" where unsupported
        fused = ("NormConv" if any(unit.batch for stage in net.stages for unit in stage) else
                 "fused BatchNorm" if net.bn0.fused else "")
        if not fused:
            raise
        raise CheckFailed(f"the {fused} kernels failed on this GPU ({str(err).strip().splitlines()[0]}); train with "
                          + ("RN50_NORMCONV=0" if fused == "NormConv" else "RN50_FUSED_BN=0")) from None
    with mx.autograd.train_mode():
        expected = float(loss_fn(ref(x_ref), y).mean().asscalar())
        imperative = float(loss_fn(unhybridized(s, ctx, net)(x), y).mean().asscalar())
    gap = abs(loss - expected) / abs(expected)
    detail = (f"loss {loss:.5f} ({s.input_layout} {s.dtype}; {imperative:.5f} run imperatively, as bench/train_step "
              f"runs it) vs {expected:.5f} (NCHW float32): {gap:.2%} apart")
    gap = max(gap, abs(imperative - expected) / abs(expected))
    if not gap <= LOSS_RTOL[s.dtype]:
        raise CheckFailed(detail + f", more than {LOSS_RTOL[s.dtype]:.2%}"
                          + ("; if it passes with RN50_NORMCONV=0 RN50_FUSED_BN=0, the fused kernels' wiring is wrong: "
                             "train with those set" if s.input_layout == "NHWC" else ""))
    return detail


def lars_step(s, ctx):
    """One LARS step on float16 tensors with float32 master weights (two conv kernels and a BatchNorm gamma, the
    configured hyperparameters) against the same step in float32 from the same values: the master weights must
    match the float32 result, and the float16 weights must be the master weights rounded."""
    import mxnet as mx
    import numpy as np

    from .. import optim

    rng = np.random.RandomState(0)
    shapes = [(64, 64, 3, 3), (256, 64, 1, 1), (64,)]
    weights = [(rng.standard_normal(shape) * 0.05).astype("float16") for shape in shapes]
    grads = [(rng.standard_normal(shape) * 0.01).astype("float16") for shape in shapes]
    results = {}
    for dtype in ("float16", "float32"):
        lars = optim.LARS(momentum=s.mom, eta=s.lars_eta, eps=s.lars_eps, wd=s.wd, learning_rate=s.lr,
                          multi_precision=dtype == "float16")
        lars.set_wd_mult({2: 0.0})
        updater = mx.optimizer.get_updater(lars)
        w = [mx.nd.array(v, ctx=ctx, dtype=dtype) for v in weights]
        updater(list(range(len(w))), [mx.nd.array(g, ctx=ctx, dtype=dtype) for g in grads], w)
        masters = [updater.states[i][1] for i in range(len(w))] if dtype == "float16" else w
        results[dtype] = ([a.asnumpy() for a in w], [m.asnumpy() for m in masters])
    (half, master), (full, _) = results["float16"], results["float32"]
    moved = max(float(np.abs(f - w.astype("float32")).max()) for f, w in zip(full, weights))
    gap = max(float(np.abs(m - f).max()) for m, f in zip(master, full)) / moved
    rounded = all(np.array_equal(h, m.astype("float16")) for h, m in zip(half, master))
    detail = f"master weights within {gap:.1e} of the float32 step (relative to its largest change)"
    if not (gap <= STEP_RTOL and rounded):
        raise CheckFailed(detail + ("" if rounded else "; the float16 weights are not the master weights rounded"))
    return detail


def allreduce(s, ranks, flags):
    """`ranks` processes (horovodrun) each allreduce float16 and float32 arrays on their device."""
    if ranks < 2:
        raise Skipped("one device: nothing to reduce across (--ranks N runs N processes)")
    horovodrun = children.horovodrun(ranks)
    if not horovodrun:
        raise CheckFailed(f"Horovod is not installed for {sys.executable} (pip install horovod)")
    world = ["--kv-store", "horovod", "--dgxnnodes", "1", "--dgxngpu", str(ranks)]  # the world dist.init expects
    command = [*horovodrun, sys.executable, "-m", "rn50_mx.selftest", "--allreduce-worker", *flags, *world]
    result = children.run(command, timeout=300)  # ended with the self-test when it is stopped
    # by rank, not by line: under horovodrun's tagged output one rank's line can land inside another's
    ok = set(re.findall(r"ALLREDUCE OK rank (\d+)", result.stdout))
    if result.returncode != 0 or len(ok) != ranks:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise CheckFailed(f"horovodrun -np {ranks} exited {result.returncode}: {tail[0][:200]}")
    return f"{ranks} processes, float16 and float32, sums exact"


def allreduce_worker(s):
    """One rank of allreduce: its device's arrays of (rank + 1), summed over ranks, must be exact."""
    import mxnet as mx

    from .. import dist

    d = dist.init(s.replace(kv_store="horovod"))
    ctx = dist.context(s, d.local_rank)
    expected = d.size * (d.size + 1) / 2
    for dtype in ("float16", "float32"):
        total = d.allreduce_sum(mx.nd.full((1 << 16,), d.rank + 1, ctx=ctx, dtype=dtype))
        if total.context != ctx or not (total.asnumpy() == expected).all():
            raise InputError(f"rank {d.rank}: {dtype} allreduce gave {total[:1].asscalar()} on {total.context}, "
                             f"expected {expected} on {ctx}")
    if s.device == "gpu":
        try:
            gpu_contexts(os.getpid(), compute_apps())
        except CheckFailed as err:
            raise InputError(f"rank {d.rank}: {err}") from None
        except Skipped:
            pass
    print(f"ALLREDUCE OK rank {d.rank} on {ctx}", flush=True)
    return 0


def memory_need(s, ctx):
    """The memory a process of this config needs (rn50_mx.memory: input, weights and their optimizer states,
    activations: an estimate) against the GPU's (MXNet's gpu_memory_info: cudaMemGetInfo), or on its own on the
    CPU."""
    from .. import memory

    need = memory.need(s)
    if ctx.device_type != "gpu":
        return memory.words(need)
    import mxnet as mx

    _, total = mx.context.gpu_memory_info(ctx.device_id)
    detail = memory.words(need, total, f"GPU {ctx.device_id}")
    if sum(need) > total:
        raise CheckFailed(detail)
    return detail


def one_gpu(s):
    """This process holds a CUDA context on exactly one GPU (the allreduce check asks the same of every rank)."""
    if s.device != "gpu":
        raise Skipped("CPU run")
    return gpu_contexts(os.getpid(), compute_apps())


def compute_apps():
    """nvidia-smi's list of processes holding a context: "pid, gpu_uuid" lines."""
    if not shutil.which("nvidia-smi"):
        raise Skipped("nvidia-smi not found")
    return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60).stdout


def gpu_contexts(pid, apps):
    """The verdict on `pid` from nvidia-smi's compute-apps lines: one GPU is right; several mean that a thread
    of the process used a GPU other than its own (e.g. GPU 0 from every rank); none, that nvidia-smi cannot see
    it (a container without the host's PID namespace lists no process)."""
    gpus = sorted({uuid.strip() for p, _, uuid in (line.partition(",") for line in apps.splitlines())
                   if p.strip() == str(pid)})
    if not gpus:
        raise Skipped(f"nvidia-smi lists no context of process {pid} (in a container: no host PID namespace)")
    if len(gpus) > 1:
        raise CheckFailed(f"process {pid} holds contexts on {len(gpus)} GPUs ({', '.join(gpus)}): one expected")
    return f"process {pid}: a context on {gpus[0]} only"


def evaluation(net, val_it):
    """One eval over the whole val set, as a run does it: every image counted once."""
    from .. import dist, train

    top1, top5, images = train.accuracy(net, val_it, dist.Single())
    if images != val_it.num_samples:
        raise CheckFailed(f"counted {images} of {val_it.num_samples} val images")
    return f"{images} images, top-1 {top1:.4f}, top-5 {top5:.4f} (untrained weights: about chance)"


def timed_steps(s, ctx, steps):
    """Training images/s on synthetic and on real batches side by side, the Inspur article's ceiling and reality. On
    the stand-in build the steps run on both and no rate is said: a stand-in's is no figure, and whether the input
    keeps up is the GPU's question (the rehearsal's self-test: 16 steps of a CPU-second each went to the untimed
    steps and the uncounted round of a figure it did not give)."""
    note = measure.left_out(s)
    if s.standin != "off":
        measure.synthetic_vs_real(s, ctx, rounds=1, steps=steps, figure=False)
        return f"{steps} step(s) on synthetic and {steps} on real batches ran (stand-in: no figure)" + (
            note and f"; {note}")
    rates = measure.synthetic_vs_real(s, ctx, rounds=1, steps=steps)  # drains the prefetch depth + 1 first
    names = [row[0] for row in bind.query_gpus("name")]
    return anchor_words((rates["synthetic"].images_per_s, rates["real"].images_per_s), names) + (note and f"; {note}")


def anchor_words(rates, gpu_names):
    """Synthetic and real images/s beside the MLPerf anchor of this GPU model, with the gap in words."""
    synthetic, real = rates
    line = f"synthetic {synthetic:.0f} img/s, real {real:.0f} img/s per device: real/synthetic {real / synthetic:.2f}"
    line += " (the input keeps up)" if real >= 0.95 * synthetic else " (the input pipeline is the limit: " \
        "python -m rn50_mx.tune)"
    found = anchors.for_gpu_names(gpu_names)
    if found is None:
        return line + "; no MLPerf anchor for this device"
    return line + f"; MLPerf-tuned NVIDIA MXNet does about {found.img_per_s} img/s per {found.label}: this run's " \
        f"synthetic rate is {synthetic / found.img_per_s:.0%} of it"


# --- running them ----------------------------------------------------------------------------------------------
