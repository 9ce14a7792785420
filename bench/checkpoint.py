"""Checkpoints: their size and write time on the demo, their size for ImageNet on 8 GPUs, and what --checkpoint-every 1
costs a run, side by side with the code before checkpoints.

    .venv/bin/python bench/checkpoint.py [--rounds 3] [--steps 10] [--epochs 3] [--baseline /path/to/old/checkout]

1. Size and write time: config/CPU.sh's model, trainer and iterators, after two training steps (the optimizer
   states exist), written by rn50_mx.checkpoint (temporary folder, fsync, rename) `--rounds` times into a temporary
   folder; the median write time and each file's size.
2. ImageNet, 8 GPUs, by arithmetic: config/NF5688M6.sh's model (fp16, 1000 classes) counted element by element:
   params in the model's dtypes, the trainer's momentum and fp32 master weights (fp16 tensors), rank 0's files plus
   each rank's BatchNorm statistics, DALI states and JSON, as the demo's files measure them.
3. Overhead: python -m rn50_mx.train on the demo's configuration shortened to `--steps` steps an epoch and `--epochs`
   epochs (an eval after each), in fresh processes, `--rounds` rounds, contenders alternating: the code before this
   change (--baseline, a checkout of the commit before it; skipped when not given), this code without checkpoints,
   and this code with --checkpoint-every 1. Figures: run_start -> run_stop from each MLPerf log (median), and the
   images/s and data wait of the last epoch (median); the ratios to "no checkpoints".

Measured (2 cores shared with four other helpers' test runs, load average 8-18; MXNet 1.9.1, DALI 2.4), with
--rounds 1 --steps 3 --epochs 2: 1. 188.7 MB in 10.1 s (11.6 s median of 2 in another run); 2. 258 MB; 3. 129.7 s
before this change, 135.0 s without checkpoints, 55.8 s with --checkpoint-every 1: the load swung run times 2.4x, so
part 3 says nothing here; docs/checkpoints.md has the estimate from parts 1 and 2.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import train_step  # noqa: E402  (bench/train_step.py: the demo's environment and data)
from rn50_mx import config  # noqa: E402
from rn50_mx.errors import run_cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCH = re.compile(r"^epoch \d+: ([0-9.]+) img/s, data wait ([0-9.]+)%", re.M)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="bench/checkpoint.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="train steps an epoch in part 3")
    parser.add_argument("--epochs", type=int, default=3, help="epochs in part 3")
    parser.add_argument("--per-class", type=int, default=200, help="demo images per class")
    parser.add_argument("--baseline", default="", help="a checkout of the commit before checkpoints (part 3)")
    return parser.parse_args(argv)


def demo_settings(args, *flags):
    environ = train_step.demo_environ()
    prefix = train_step.demo_data(args.per_class, 32)
    val = os.path.join(os.path.dirname(prefix), "val.rec")
    return config.load(["--data-train", prefix + ".rec", "--data-val", val, "--seed", "1", *flags], environ,
                       prog="bench/checkpoint.py"), environ


def folder_sizes(folder):
    return {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}


def write_times(args):
    """Part 1: (median seconds, {file: bytes}) of a demo checkpoint."""
    import mxnet as mx
    from rn50_mx import checkpoint, data, dist, train

    tmp = tempfile.mkdtemp(prefix="rn50_mx_bench_ckpt_")
    try:
        s, _ = demo_settings(args, "--checkpoint-dir", tmp)
        d, ctx = dist.Single(), mx.cpu()
        steps = data.steps_per_epoch(s, 1)
        net, loss_fn, trainer = train.parts(s, ctx, steps, d.trainer)
        train_it, val_it = data.make_iters(s, 0, 1, 1, ctx)
        for _ in range(2):
            train.train_step(net, loss_fn, trainer, train_it.next())
        saver = checkpoint.Checkpoints(s, d)
        saver.attach(net, trainer, {"train": train_it, "val": val_it}, steps, 1)
        seconds = []
        for i in range(args.rounds):
            tic = time.perf_counter()
            folder = saver.save(checkpoint.Position(epoch=i, step=2))
            seconds.append(time.perf_counter() - tic)
        return statistics.median(seconds), folder_sizes(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def imagenet_bytes(demo_files):
    """Part 2: {file kind: bytes} of a checkpoint of config/NF5688M6.sh on 8 GPUs, and the total."""
    import numpy as np
    from rn50_mx import model

    result = subprocess.run(["bash", "-c", "source config/NF5688M6.sh && env -0"], cwd=ROOT, capture_output=True,
                            check=True)
    environ = dict(item.split("=", 1) for item in result.stdout.decode().split("\0") if "=" in item)
    s = config.load(["--device", "cpu", "--input-layout", "NCHW"], environ, prog="bench/checkpoint.py")
    net = model.build_model(s)  # NCHW on the CPU: the same tensors as the GPU's NHWC network
    params = list(net.collect_params().values())
    param_bytes = sum(p.data().size * np.dtype(p.dtype).itemsize for p in params)
    trainable = [p for p in params if p.grad_req != "null"]
    momentum = sum(p.data().size * 4 for p in trainable)
    masters = sum(p.data().size * 4 for p in trainable if np.dtype(p.dtype) == np.float16)
    aux = sum(p.data().size * np.dtype(p.dtype).itemsize for p in params if p.grad_req == "null")
    per_rank_small = sum(size for name, size in demo_files.items() if name.endswith((".json", ".dali")))
    world = s.world_size
    parts = {"params": param_bytes, "trainer": momentum + masters, "aux (all ranks)": aux * world,
             "json + DALI (all ranks)": per_rank_small * world}
    return s, parts, sum(parts.values())


def last_epoch(text):
    rows = EPOCH.findall(text)
    return (float(rows[-1][0]), float(rows[-1][1])) if rows else (float("nan"), float("nan"))


def run_seconds(log):
    with open(log) as f:
        times = {e["key"]: e["time_ms"] for e in (json.loads(line.split(":::MLLOG ", 1)[1]) for line in f
                                                  if ":::MLLOG " in line)}
    return (times["run_stop"] - times["run_start"]) / 1000


def one_run(args, checkout, flags, environ):
    """(run seconds, images/s, data wait %) of a shortened demo run of the code in `checkout`."""
    tmp = tempfile.mkdtemp(prefix="rn50_mx_bench_run_")
    try:
        log = os.path.join(tmp, "mlperf.log")
        command = [sys.executable, "-m", "rn50_mx.train", *flags, "--mllog-file", log]
        command = [arg.replace("{tmp}", tmp) for arg in command]
        result = subprocess.run(command, cwd=checkout, env={**environ, "PYTHONPATH": checkout}, capture_output=True,
                                text=True)
        if result.returncode != 0:
            raise SystemExit(f"bench/checkpoint.py: {checkout}: the run failed: {result.stderr[-2000:]}")
        return (run_seconds(log), *last_epoch(result.stdout))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def overhead(args):
    """Part 3: {contender: [(seconds, images/s, wait %) per round]}."""
    s, environ = demo_settings(args)
    flags = [*config.as_flags(s), "--num-examples", str(args.steps * s.batch_size), "--num-epochs",
             str(args.epochs), "--accuracy-threshold", "1.0", "--disp-batches", "1000"]
    drop = {"--checkpoint-dir", "--checkpoint-every", "--save-model"}  # flags the old code does not know
    old_flags = [f for i, f in enumerate(flags) if f not in drop and (i == 0 or flags[i - 1] not in drop)]
    contenders = {"no checkpoints": (ROOT, old_flags),
                  "--checkpoint-every 1": (ROOT, [*old_flags, "--checkpoint-dir", "{tmp}/ckpt",
                                                  "--checkpoint-every", "1"])}
    if args.baseline:
        contenders = {"before this change": (args.baseline, old_flags), **contenders}
    results = {name: [] for name in contenders}
    for i in range(args.rounds):
        for name in (list(contenders) if i % 2 == 0 else list(reversed(contenders))):
            results[name].append(one_run(args, *contenders[name], environ))
            print(f"  round {i + 1} {name}: {results[name][-1][0]:.1f} s, {results[name][-1][1]:.1f} img/s, "
                  f"data wait {results[name][-1][2]:.1f}%", flush=True)
    return results


def main(argv=None):
    args = parse_args(argv)
    seconds, files = write_times(args)
    total = sum(files.values())
    print(f"1. demo checkpoint (config/CPU.sh, ResNet-50 at 32x32, 10 classes): {total / 1e6:.1f} MB written in "
          f"{seconds:.2f} s (median of {args.rounds}): " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in files.items()))
    s, parts, size = imagenet_bytes(files)
    print(f"2. ImageNet on {s.dgxngpu} GPUs ({s.dtype}, {s.num_classes} classes): {size / 1e6:.0f} MB a checkpoint "
          "(two kept: twice that on disk): " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in parts.items()))
    results = overhead(args)
    base = statistics.median(r[0] for r in results["no checkpoints"])
    print(f"3. demo shortened to {args.epochs} epochs of {args.steps} steps, medians of {args.rounds} rounds:")
    for name, rows in results.items():
        run, speed, wait = (statistics.median(r[k] for r in rows) for k in range(3))
        print(f"   {name:22} run {run:6.1f} s ({run / base:.3f} x no checkpoints), last epoch {speed:.1f} img/s, "
              f"data wait {wait:.1f}%")
    return 0


if __name__ == "__main__":
    run_cli(main, "bench/checkpoint.py")
