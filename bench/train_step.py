"""Training images/s of the demo configuration: synthetic against real data, hybridized against imperative.

Synthetic batches against the real DALI pipeline, and a hybridized network against an imperative one, side by
side in one run.

    .venv/bin/python bench/train_step.py [--rounds 5] [--steps 5] [--per-class 100] [--sweep | --dtypes [--unfused]]
                                         [rn50_mx.train flags, e.g. --dali-threads 1]

The configuration is config/CPU.sh's (sourced: image shape, batch, classes, DALI threads, LARS, and
OMP_NUM_THREADS unless the environment sets it), plus the flags given. The real data are Fashion-MNIST photographs at the demo's size, PER_CLASS per class, made by
`rn50_mx.prep_rec.make_fashion_mnist` (what `python -m rn50_mx.prep_rec fashion-mnist DIR` runs) and cached in
$TMPDIR/rn50_mx_bench_train_step. Synthetic is `--synthetic 1`: one random batch made once, no input work.

Four contenders train the real ResNet-50 with train.train_step: synthetic and real data, each on an imperative
network and on a hybridized one, as train.py runs it (hybridize(static_alloc, static_shape) on the network).
Both data sources feed both networks. A fifth fetches the real batches and trains nothing: what the input costs.
rn50_mx/measure.py times them (shared with python -m rn50_mx.tune): each round times every contender for STEPS
steps after DRAIN untimed ones (the graph's first build, DALI's head start); a first round is not counted, and
every other round runs backwards. Figures are medians over the rounds: images/s; images per CPU-second of the
process (all its threads, DALI's and MXNet's); and the share of the time the loop spent inside next() on the
iterator (for real data, waiting for DALI; the engine computes meanwhile).

The real/synthetic ratio is how the Inspur article measures the input pipeline: at 1.0 the input costs nothing.
Here data and compute share the same cores, so the real pipeline's decoding takes CPU from the model; its share
of the CPU (training images per CPU-second / input images per CPU-second) bounds what it can cost on cores that
training keeps busy, and unlike the wall-clock ratio it hardly moves when other work shares the machine.
--sweep reruns the real/synthetic comparison (imperative) in fresh processes with other thread settings:
OMP_NUM_THREADS and OMP_WAIT_POLICY must be set before MXNet loads; DALI threads and prefetch depth are flags.

Last line: real/synthetic and hybridized/imperative, each for both of the other's two cases.

--dtypes instead times float32 against bfloat16 (a CPU with avx512_bf16 or amx_bf16) on synthetic batches and the
hybridized network: the whole step, and forward and backward alone (the step without the optimizer), so that the
optimizer's share is their difference. Beside images/s it gives the arithmetic rate, GFLOP/s (the convolutions' and
the dense layer's multiply-adds x 2, counted on the network: forward, the weight gradients and the data gradients
but the first convolution's, whose input needs none), and that rate as a share of this CPU's measured peak in the
same dtype: the best of a few large matrix products (FullyConnected, oneDNN's inner product, as the network's
layers), timed once before the rounds. Measured 2026-11-27 at f3422b2 on the demo's 2 cores, quiet, 3 rounds x 10
steps (ms/step): forward+backward 278.5 float32, 236.8 bfloat16 (x1.18); the whole step 344.8 and 437.8 (x0.79): the
optimizer took 66 ms in float32 and 201 ms in bfloat16, whose update then ran unfused on float32 masters
(optim.Masters); docs/bfloat16.md has the figures with the fused update (rn50_mx/fused_update). --unfused adds each
dtype's step with MXNet's own optimizer kernels (the fused library left out), side by side with the others.

Measured on 2 cores shared with two other trainings (MXNet 1.9.1, DALI 2.4; wall rates swing 25 % between
rounds there): real/synthetic 0.99-1.12, the input taking 0.4 % of the CPU (DALI alone: ~17,000 images per
CPU-second at 32x32, training ~80); hybridized/imperative 1.15-1.31. Without OMP_NUM_THREADS MXNet computes on
one thread here (images/s = images per CPU-second); OMP_NUM_THREADS=2 gave 118-127 against 83 images/s once,
when a core was free, and nothing measurable while both were busy.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rn50_mx import config, measure  # noqa: E402  (measure loads MXNet only when it builds something)
from rn50_mx.errors import run_cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(tempfile.gettempdir(), "rn50_mx_bench_train_step")
MARK = "TRAIN_STEP_RESULT "
NO_TRAINING = "real, no training"
# --sweep: (label, environment, rn50_mx.train flags) of each fresh process.
SWEEP = [
    ("as config/CPU.sh", {}, []),
    ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}, []),
    ("OMP_NUM_THREADS=2", {"OMP_NUM_THREADS": "2"}, []),
    ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}, []),
    ("DALI_THREADS=1", {}, ["--dali-threads=1"]),
    ("DALI_THREADS=1 OMP_NUM_THREADS=2", {"OMP_NUM_THREADS": "2"}, ["--dali-threads=1"]),
    ("DALI_PREFETCH_QUEUE=1", {}, ["--dali-prefetch-queue=1"]),
    ("DALI_PREFETCH_QUEUE=4", {}, ["--dali-prefetch-queue=4"]),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds (one more, uncounted, comes first)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per contender and round")
    parser.add_argument("--per-class", type=int, default=100, help="Fashion-MNIST train photographs per class")
    parser.add_argument("--sweep", action="store_true", help="also compare thread settings in fresh processes")
    parser.add_argument("--dtypes", action="store_true", help="time float32 against bfloat16 instead: the step, and "
                                                              "forward+backward alone")
    parser.add_argument("--unfused", action="store_true", help="with --dtypes: also each dtype's step with MXNet's "
                                                               "own optimizer kernels instead of the fused update")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_known_args(argv)


def demo_environ():
    """The environment config/CPU.sh exports, as run_and_time.sh would see it."""
    result = subprocess.run(["bash", "-c", "source config/CPU.sh && env -0"], cwd=ROOT, capture_output=True,
                            check=True)
    return dict(item.split("=", 1) for item in result.stdout.decode().split("\0") if "=" in item)


def demo_data(per_class, size):
    """Prefix of the cached train .rec: Fashion-MNIST at size x size, per_class images per class."""
    from rn50_mx import prep_rec

    out_dir = os.path.join(CACHE, f"fashion-mnist-{size}px-{per_class}")
    prep_rec.make_fashion_mnist(out_dir, size=size, train_per_class=per_class, val_per_class=1)
    return os.path.join(out_dir, "train")


def settings(args, train_flags):
    """config/CPU.sh's settings on the benchmark data, with `train_flags` on top."""
    environ = demo_environ()
    size = config.load([], environ, prog="bench/train_step.py").image_chw[1]
    prefix = demo_data(args.per_class, size)
    return config.load(["--data-train", prefix + ".rec", "--seed", "1", *train_flags], environ,
                       prog="bench/train_step.py")


def no_training(batch):
    """The input alone: the batch is fetched and touched, no model runs (what decoding costs per image)."""
    return batch.label[0].sum()


def contenders(s, modes):
    """name -> (step function, endless batches): synthetic and real data on each network mode in `modes`, and
    the real data with no training."""
    import mxnet as mx

    ctx = mx.cpu()
    sources = measure.sources(s, ctx)
    runs = {}
    for mode in modes:
        step = measure.train_step(s, ctx, hybridize=mode == "hybridized")
        for source, batches in sources.items():
            runs[f"{source} {mode}"] = (step, batches)
    runs[NO_TRAINING] = (no_training, sources["real"])
    return runs


def compare(s, args, modes, verbose):
    """Medians over the rounds: {name: (images/s, images per CPU-second, next() share)}."""
    def show(r, rates):
        print(f"round {r}: " + ", ".join(f"{name} {v[-1][0]:.1f}" for name, v in rates.items()), flush=True)

    return measure.compare(contenders(s, modes), s.batch_size, args.rounds, args.steps,
                           on_round=show if verbose else None)


UNFUSED = "step, MXNet's update"  # --unfused's contender (after its dtype)
PEAK_SHAPE = (2048, 2048, 2048)  # the matrix product timed for the peak: M x K times (N x K)^T
PEAK_TRIES = 5


def peak_gflops(dtype, ctx, shape=PEAK_SHAPE, tries=PEAK_TRIES):
    """GFLOP/s of the best of `tries` matrix products of `shape` in `dtype`: FullyConnected (oneDNN's inner product,
    which runs the network's dense layer and computes as its convolutions do), the first one untimed."""
    import mxnet as mx

    from rn50_mx.model import mx_dtype

    m, k, n = shape
    x = mx.nd.random.uniform(shape=(m, k), ctx=ctx).astype(mx_dtype(dtype))
    w = mx.nd.random.uniform(shape=(n, k), ctx=ctx).astype(mx_dtype(dtype))
    best = float("inf")
    for t in range(tries + 1):
        mx.nd.waitall()
        tic = time.perf_counter()
        mx.nd.FullyConnected(x, w, num_hidden=n, no_bias=True).wait_to_read()
        best = min(best, time.perf_counter() - tic) if t else best
    return 2 * m * n * k / best / 1e9


def step_flops(s):
    """(forward, training step) FLOPs per image of the network of `s`: 2 x the multiply-adds of its convolutions and
    dense layer, the step adding the weight gradients (as many) and the data gradients (as many, but the first
    convolution's: its input takes none). Counted on one image through an imperative float32 copy."""
    import mxnet as mx
    from mxnet.gluon import nn

    from rn50_mx import model

    net = model.build_model(s.replace(dtype="float32"))
    macs = []

    def count(block, _, out):
        weight = block.weight.shape
        per_output = int(np.prod(weight[1:]))  # (out, in/groups, kh, kw) or (units, in_units)
        macs.append(per_output * int(np.prod(out.shape[1:])))

    for block in blocks_of(net, (nn.Conv2D, nn.Dense)):
        block.register_forward_hook(count)
    net(mx.nd.zeros((1, *s.image_chw), dtype="float32"))
    forward = 2 * sum(macs)
    return forward, 3 * forward - 2 * macs[0]


def blocks_of(block, kinds):
    """Every block under `block` (itself included) that is one of `kinds`, in registration order."""
    found = [block] if isinstance(block, kinds) else []
    for child in block._children.values():
        found += blocks_of(child, kinds)
    return found


def dtypes(s, args):
    """float32 against bfloat16 on synthetic batches: the step and forward+backward, ms per step, GFLOP/s against
    the measured peak, and the ratios."""
    import functools

    import mxnet as mx

    from rn50_mx import data, dist, fused_update, train

    runs, ctx = {}, mx.cpu()
    kernel = fused_update.load()
    print(f"optimizer update: {'fused, ' + fused_update.ISA_NAMES[kernel.best_isa] if kernel else 'MXNet kernels'}")
    peaks = {dtype: peak_gflops(dtype, ctx) for dtype in ("float32", "bfloat16")}
    forward, training = step_flops(s)
    print(f"peak (FullyConnected {'x'.join(map(str, PEAK_SHAPE))}, best of {PEAK_TRIES}): float32 "
          f"{peaks['float32']:.0f} GFLOP/s, bfloat16 {peaks['bfloat16']:.0f} GFLOP/s; the network: {forward / 1e6:.1f} "
          f"MFLOP forward, {training / 1e6:.1f} MFLOP a training step per image")
    for dtype in ("float32", "bfloat16"):
        low = s.replace(dtype=dtype, synthetic=True)
        config.validate(low)  # bfloat16 on a CPU without its instructions: config's one line
        net, loss_fn, trainer = train.parts(low, ctx, data.steps_per_epoch(low, 1), dist.Single().trainer)
        batches = measure.batches(low, ctx, 1)
        runs[f"{dtype} step"] = (functools.partial(train.train_step, net, loss_fn, trainer), batches)
        # update=0: a step that ends no update, i.e. forward and backward without the optimizer
        runs[f"{dtype} forward+backward"] = (functools.partial(train.train_step, net, loss_fn, trainer, update=0),
                                             batches)
        if args.unfused:
            net, loss_fn, trainer = train.parts(low, ctx, data.steps_per_epoch(low, 1), dist.Single().trainer)
            trainer._optimizer.use_fused(None)
            runs[f"{dtype} {UNFUSED}"] = (functools.partial(train.train_step, net, loss_fn, trainer),
                                          measure.batches(low, ctx, 1))
    m = measure.compare(runs, s.batch_size, args.rounds, args.steps)
    ms = {name: 1000 * s.batch_size / rate.images_per_s for name, rate in m.items()}
    for name, value in ms.items():
        gflops = m[name].images_per_s * training / 1e9
        print(f"  {name:30s} {value:6.1f} ms/step  {m[name].images_per_s:6.1f} images/s  {gflops:6.1f} GFLOP/s "
              f"({gflops / peaks[name.split()[0]]:4.0%} of the {name.split()[0]} peak)")
    for dtype in ("float32", "bfloat16"):
        optimizer = ms[f"{dtype} step"] - ms[f"{dtype} forward+backward"]
        print(f"  {dtype} optimizer (step - forward+backward): {optimizer:.1f} ms")
        if args.unfused:
            print(f"  {dtype} {UNFUSED} / step: x{ms[f'{dtype} {UNFUSED}'] / ms[f'{dtype} step']:.2f}")
    print(f"bfloat16/float32 speed: step x{ms['float32 step'] / ms['bfloat16 step']:.2f}, forward+backward "
          f"x{ms['float32 forward+backward'] / ms['bfloat16 forward+backward']:.2f}")


def worker(args, train_flags):
    """One --sweep process: real against synthetic on the imperative network, as one JSON line."""
    medians = compare(settings(args, train_flags), args, ["imperative"], verbose=False)
    print(MARK + json.dumps(medians), flush=True)


def sweep(args, train_flags):
    """The SWEEP settings, each in a fresh process; a line each with its images/s and real/synthetic ratio."""
    print(f"sweep, imperative network, {args.rounds} rounds x {args.steps} steps each; images/s (per CPU-second):")
    for label, env, flags in SWEEP:
        command = [sys.executable, os.path.abspath(__file__), "--worker", f"--rounds={args.rounds}",
                   f"--steps={args.steps}", f"--per-class={args.per_class}", *train_flags, *flags]
        result = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
        lines = [line.split(MARK, 1)[1] for line in result.stdout.splitlines() if MARK in line]
        if result.returncode != 0 or not lines:
            sys.exit(f"bench/train_step.py: {label} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        m = json.loads(lines[0])
        (real, real_cpu, wait), (synth, synth_cpu, _) = m["real imperative"], m["synthetic imperative"]
        print(f"  {label:34s} synthetic {synth:5.1f} ({synth_cpu:5.1f})  real {real:5.1f} ({real_cpu:5.1f}), "
              f"next() {wait:3.0%}, input {input_share(m, 'imperative'):4.1%} of the CPU; "
              f"real/synthetic {real / synth:.2f} (per CPU-s {real_cpu / synth_cpu:.2f})", flush=True)


def input_share(m, mode):
    """Share of the process's CPU time that the input pipeline takes when it feeds training in `mode`."""
    return m[f"real {mode}"][1] / m[NO_TRAINING][1]


def main():
    args, train_flags = parse_args()
    if args.worker:
        return worker(args, train_flags)
    # MXNet takes OMP_NUM_THREADS when it loads (prep_rec loads it): the config's, unless the caller set one.
    os.environ.setdefault("OMP_NUM_THREADS", demo_environ().get("OMP_NUM_THREADS", "1"))
    s = settings(args, train_flags)  # a bad flag stops here, in one line
    print(f"config/CPU.sh: ResNet-50, {s.image_shape} images, batch {s.batch_size}, {s.num_classes} classes, "
          f"{s.dali_threads} DALI threads, prefetch {s.dali_prefetch_queue}; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; extra flags: {' '.join(train_flags) or '-'}")
    if args.dtypes:
        return dtypes(s, args)
    m = compare(s, args, ["imperative", "hybridized"], verbose=True)
    print(f"medians of {args.rounds} rounds x {args.steps} steps (after {measure.DRAIN} untimed): images/s, "
          "images per CPU-second of the process, share of the time in next():")
    for name, (rate, cpu_rate, wait) in m.items():
        print(f"  {name:22s} {rate:6.1f}  {cpu_rate:6.1f}  {wait:4.0%}")
    print(f"the input takes {input_share(m, 'imperative'):.1%} (imperative), {input_share(m, 'hybridized'):.1%} "
          "(hybridized) of the CPU time of training on real data (training per CPU-second / input per CPU-second)")
    ratio = {mode: m[f"real {mode}"][0] / m[f"synthetic {mode}"][0] for mode in ("imperative", "hybridized")}
    hybrid = {src: m[f"{src} hybridized"][0] / m[f"{src} imperative"][0] for src in ("synthetic", "real")}
    if args.sweep:
        sweep(args, train_flags)
    print(f"real/synthetic {ratio['imperative']:.2f} imperative, {ratio['hybridized']:.2f} hybridized; "
          f"hybridized/imperative {hybrid['synthetic']:.2f} synthetic, {hybrid['real']:.2f} real")


if __name__ == "__main__":
    run_cli(main, "bench/train_step.py")
