"""Data-parallel scaling: the same global batch on 1 process and on N Horovod processes, step time and allreduce.

    .venv/bin/python bench/scaling.py [--procs 1,2] [--global-batch 16] [--image-size 64] [--steps 6]
                                      [--warmup 2] [rn50_mx.train flags, e.g. --device gpu --dtype float16]

Every process count trains the real ResNet-50 with LARS on synthetic data (`--synthetic 1`: one batch made once
on the device, no I/O), global batch GLOBAL_BATCH split evenly over the processes. 1 process runs plainly (no
Horovod); N > 1 run under `horovodrun --gloo -np N` on this machine (Gloo on CPU, NCCL on GPUs as Horovod was
built). Flags this script does not know are passed to every process as rn50_mx.train flags.

Per process count, from rank 0 (times in ms):
- step: mean time of a training step as train.py runs it (forward, backward, trainer.step; Horovod overlaps the
  allreduce with the rest), after WARMUP untimed steps;
- fwd+bwd, allreduce, update: the same number of extra steps taken apart, waiting for the engine after each part.
  The allreduce time includes waiting for the slowest rank. Its share is allreduce / (fwd+bwd + allreduce +
  update).
Last line: step-time and images/s ratios of each process count to 1 process, and the allreduce shares.

On a machine with fewer cores than processes x MXNet threads, the processes share the cores and the ratios say
little about a real node; run it where each process has its own device (GPU) or its own cores.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rn50_mx import config, measure  # noqa: E402
from rn50_mx.errors import InputError, run_cli  # noqa: E402

MARK = "SCALING_RESULT "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--procs", default="1,2", help="process counts to compare, the first is the baseline")
    parser.add_argument("--global-batch", type=int, default=16, help="images per step over all processes")
    parser.add_argument("--image-size", type=int, default=64, help="H = W of the synthetic images")
    parser.add_argument("--steps", type=int, default=6, help="timed steps, and as many taken-apart steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_known_args(argv)


def wait_ms(tic):
    """Milliseconds since tic, after the engine has finished everything queued (collectives included)."""
    import mxnet as mx
    mx.nd.waitall()
    return (time.perf_counter() - tic) * 1000


def settings(args, procs, train_flags):
    """The rn50_mx settings of each of `procs` processes: synthetic data, GLOBAL_BATCH / procs images each."""
    return config.load(["--synthetic", "1", "--num-examples", str(args.global_batch * 1000),
                        "--batch-size", str(args.global_batch // procs), "--image-shape",
                        f"3,{args.image_size},{args.image_size}", "--warmup-epochs", "0", "--seed", "1",
                        "--kv-store", "horovod" if procs > 1 else "device", "--dgxngpu", str(procs), *train_flags],
                       prog="bench/scaling.py")


def worker(args, train_flags):
    """One process of one process count: time the steps, and print rank 0's figures as one JSON line."""
    import mxnet as mx
    from rn50_mx import data, dist, train

    s = measure.timed(settings(args, int(args.procs), train_flags))  # a worker's --procs is its own process count
    d = dist.init(s)
    _, seed = train.rank_seed(s, d)
    ctx = dist.context(s, d.local_rank)
    net, loss_fn, trainer = train.parts(s, ctx, data.steps_per_epoch(s, d.size), d.trainer)  # hybridized: as trained
    d.broadcast_params(net.collect_params())
    train_it, _ = data.make_iters(s, d.rank, d.size, seed, ctx)
    batch = next(iter(train_it))
    x, y = batch.data[0], batch.label[0]

    for _ in range(args.warmup):
        train.train_step(net, loss_fn, trainer, batch)
    d.barrier()
    mx.nd.waitall()
    tic = time.perf_counter()
    for _ in range(args.steps):
        train.train_step(net, loss_fn, trainer, batch)
    step = wait_ms(tic) / args.steps

    parts = [0.0, 0.0, 0.0]  # fwd+bwd, allreduce, update
    for _ in range(args.steps):
        tic = time.perf_counter()
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        parts[0] += wait_ms(tic)
        tic = time.perf_counter()
        trainer.allreduce_grads()
        parts[1] += wait_ms(tic)
        tic = time.perf_counter()
        trainer.update(x.shape[0])
        parts[2] += wait_ms(tic)
    if d.rank == 0:
        fwd_bwd, allreduce, update = (p / args.steps for p in parts)
        print(MARK + json.dumps(dict(procs=d.size, step_ms=step, fwd_bwd_ms=fwd_bwd, allreduce_ms=allreduce,
                                     update_ms=update, images_s=args.global_batch / step * 1000,
                                     allreduce_share=allreduce / (fwd_bwd + allreduce + update))), flush=True)


def run(procs, args, train_flags):
    """Rank 0's figures for one process count, run in fresh processes."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", f"--procs={procs}",
               f"--global-batch={args.global_batch}",
               f"--image-size={args.image_size}", f"--steps={args.steps}", f"--warmup={args.warmup}", *train_flags]
    if procs > 1:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        command = [horovodrun, "--gloo", "-np", str(procs), "-H", f"localhost:{procs}", *command]
    result = subprocess.run(command, capture_output=True, text=True)
    lines = [line.split(MARK, 1)[1] for line in result.stdout.splitlines() if MARK in line]
    if result.returncode != 0 or not lines:
        sys.exit(f"bench/scaling.py: {procs} process(es) failed (exit {result.returncode}):\n"
                 f"{result.stderr[-3000:]}")
    return json.loads(lines[0])


def main():
    args, train_flags = parse_args()
    if args.worker:
        return worker(args, train_flags)
    counts = [int(n) for n in args.procs.split(",")]
    if any(args.global_batch % n for n in counts):
        raise InputError(f"--global-batch {args.global_batch} does not split evenly over {args.procs} processes")
    for n in counts:  # a bad flag stops here, in one line, before any process starts
        note = measure.left_out(settings(args, n, train_flags))
    print(f"ResNet-50, synthetic {args.image_size}x{args.image_size}, global batch {args.global_batch}, "
          f"{args.steps} steps after {args.warmup}; extra flags: {' '.join(train_flags) or '-'}"
          + (note and f"; {note}"))
    print(f"{'procs':>5} {'step ms':>9} {'images/s':>9} {'fwd+bwd':>9} {'allreduce':>9} {'update':>9} {'share':>6}")
    results = []
    for n in counts:
        r = run(n, args, train_flags)
        results.append(r)
        print(f"{n:5d} {r['step_ms']:9.1f} {r['images_s']:9.1f} {r['fwd_bwd_ms']:9.1f} {r['allreduce_ms']:9.1f} "
              f"{r['update_ms']:9.1f} {r['allreduce_share']:6.1%}", flush=True)
    base = results[0]
    print("; ".join(f"{r['procs']} vs {base['procs']} procs: step time x{r['step_ms'] / base['step_ms']:.2f}, "
                    f"images/s x{r['images_s'] / base['images_s']:.2f}, allreduce share {r['allreduce_share']:.1%}"
                    for r in results[1:]) or "only one process count: nothing to compare")


if __name__ == "__main__":
    run_cli(main, "bench/scaling.py")
