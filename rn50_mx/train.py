"""Train ResNet-50 v1.5 to the MLPerf target accuracy, logging the run as MLPerf Training does.

One process (CPU, the embedded default):
    python -m rn50_mx.train --data-train data/fashion-mnist/train.rec --data-val data/fashion-mnist/val.rec \
        --num-classes 10 --image-shape 3,32,32 ...            (see config/CPU.sh)
Two processes on one machine (Gloo):
    horovodrun -np 2 -H localhost:2 python -m rn50_mx.train --kv-store horovod ...
Eight GPUs (NCCL), as the reference:
    source config/NF5688M6.sh && ./run_with_docker.sh

Order as the reference (train_imagenet.py, common/fit.py and common/dali.py): build the model and the input
pipelines, initialise, broadcast and warm up -> run_start -> open the data (the first time it is touched) ->
epochs, with evals on the schedule -> run_stop as soon as top-1 reaches the target.
"""
import sys

from . import config, data
from .errors import run_cli, settings_first


def settings_and_files(argv):
    """(settings, origins) of `argv`, and the data files they name asked what they are (data.present: no byte
    read)."""
    resolved = config.resolve(argv)
    data.named_files(resolved[0], data.present)
    return resolved


# `python -m rn50_mx.train`: the settings and the data files' presence before MXNet and DALI load, so that a bad
# setting, a missing file or --help is answered at once
EARLY = settings_first(lambda: settings_and_files(sys.argv[1:]), "rn50_mx.train",
                       config.help_text) if __name__ == "__main__" else None

import faulthandler
import random
import signal
import time

import mxnet as mx
import numpy as np
from mlperf_logging.mllog import constants as K

from . import checkpoint, dist, ema, model, optim, watchdog
from . import mlperf_log as log
from .errors import InputError
from .updates import Updates


def train_step(net, loss_fn, trainer, batch, update=None):
    """Forward, loss, backward, optimizer step; returns the summed loss without waiting for it.

    `update`, with --batch-schedule only: the steps of the update this batch ends, whose gradients have added up
    (grad_req 'add'): the step divides by all their images, then the sums are cleared; 0 when it ends none (no
    step: the gradients go on adding up). None, without the schedule: every batch is one update."""
    x, y = batch.data[0], batch.label[0]
    with mx.autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    if update is None:
        trainer.step(x.shape[0])  # gradients are per-sample sums: the optimizer scales by 1/global batch
    elif update:
        trainer.step(update * x.shape[0])  # the allreduce of the summed gradients: once per update
        optim.zero_sums(trainer)
    return loss.sum()


def train_epoch(net, loss_fn, trainer, train_it, pos, s, stops, average, updates=None):
    """The local shard's pass of epoch `pos.epoch` from step `pos.step` (0, or where a resumed run stopped), the
    weight EMA `average` following the updates; returns (images/s, data-wait share, mean loss), or why the ranks
    agreed to stop (`stops`: RESUMABLE or a Divergence; `pos` says where). With --batch-schedule (`updates`, an
    updates.Updates) the EMA, the progress line and the stop agreement come at the ends of updates only, so that a
    stop never falls inside one."""
    epoch, steps = pos.epoch, train_it.steps_per_epoch
    if pos.step == 0:
        log.start(K.EPOCH_START, metadata={K.EPOCH_NUM: epoch + 1})
        if updates and epoch and updates.factor(epoch) != updates.factor(epoch - 1):
            log.batch_change(s, epoch)
        train_it.reset()
    factor = updates.factor(epoch) if updates else 1
    tic = time.time()
    loss_sum, images, resumed = mx.nd.array([pos.loss], ctx=train_it.context), pos.images, pos.images
    stops.begin(loss_sum, images, epoch * steps + pos.step)  # the loss it judges at each check
    for batch in watchdog.batches(train_it, epoch):  # each wait for a batch and each arrival marked
        size = updates.size(epoch, train_it.position) if updates else None
        loss_sum += train_step(net, loss_fn, trainer, batch, size)
        images += batch.data[0].shape[0]
        if size == 0:
            continue  # inside an update
        pos.step = train_it.position
        done = updates.count(epoch, pos.step) if updates else epoch * steps + pos.step  # updates over the run
        average.update(done)
        if pos.step % s.disp_batches == 0 and log.is_rank0():
            loss_sum.wait_to_read()  # the engine runs behind Python: wait for it, or the speed is fiction
            progress(epoch, pos.step, steps, (images - resumed) / (time.time() - tic), trainer.learning_rate)
        why = stops.agreed(epoch * steps + pos.step, images, factor)
        if why:
            pos.loss, pos.images = float(loss_sum.asscalar()), images
            return why
    mean_loss = loss_sum.asscalar() / max(images, 1)  # the one sync point of the epoch
    seconds = time.time() - tic
    log.end(K.EPOCH_STOP, metadata={K.EPOCH_NUM: epoch + 1})
    return (images - resumed) / seconds, train_it.wait_seconds / seconds, mean_loss


def evaluate(net, val_it, d, epoch, flip=None):
    """The eval after epoch `epoch` (0-based), logged as MLPerf asks; returns (top-1, top-5, images)."""
    log.start(K.EVAL_START, metadata={K.EPOCH_NUM: epoch + 1})
    top1, top5, images = accuracy(net, val_it, d, flip)
    log.end(K.EVAL_STOP, metadata={K.EPOCH_NUM: epoch + 1})
    log.event(K.EVAL_ACCURACY, float(top1), metadata={K.EPOCH_NUM: epoch + 1})
    return top1, top5, images


def flip_axis(s):
    """The width axis of a batch in the layout in use when --eval-flip averages each image with its mirror, else
    None."""
    return s.input_layout.index("W") if s.eval_flip else None


def scores(net, x, flip):
    """The network's class scores for a val batch: its logits, or with `flip` (an axis) the sum of the softmax of
    the batch and of its mirror along that axis (the mean's ranking, one division saved)."""
    out = net(x)
    if flip is None:
        return out
    probs = mx.nd.softmax(out.astype("float32"))  # read before the mirror's forward reuses the network's memory
    return probs + mx.nd.softmax(net(mx.nd.flip(x, axis=flip)).astype("float32"))


def accuracy(net, val_it, d, flip=None):
    """Top-1 and top-5 over every val image exactly once across all ranks (padded samples are not counted); `flip`
    (flip_axis) averages each image with its mirror.

    The correct counts stay on the device until the end of the eval; the image count is a host integer."""
    val_it.reset()
    correct, images = mx.nd.zeros(2, ctx=val_it.context), 0  # top-1, top-5
    for batch in val_it:
        valid = batch.data[0].shape[0] - batch.pad
        if valid == 0:  # a rank whose shard is shorter than the padded one can get a batch of repeats only
            continue
        out = scores(net, batch.data[0], flip)
        top5 = mx.nd.topk(out, k=min(5, out.shape[1])).astype("float32")[:valid]
        label = batch.label[0][:valid].reshape((-1, 1))
        correct += mx.nd.concat((top5[:, :1] == label).sum(), (top5 == label).sum(), dim=0)
        images += valid
    counts = d.host_sum(np.append(correct.asnumpy(), images)).asnumpy()
    return counts[0] / counts[2], counts[1] / counts[2], int(counts[2])


def eval_epochs(s):
    """0-based epochs after which we evaluate: every eval_period from eval_offset, as the MLPerf rules allow (mlperf_fit
    in common/fit.py), plus the last epoch only when --eval-last-epoch asks for it (an off-schedule eval: not for
    submissions)."""
    scheduled = {e for e in range(s.epoch_limit) if e % s.eval_period == s.eval_offset}
    return sorted(scheduled | ({s.epoch_limit - 1} if s.eval_last_epoch else set()))


def fit(s, d, net, loss_fn, trainer, train_it, val_it, pos, saver, average=ema.Off()):
    """Epochs in blocks that end with an eval (of the weight EMA `average` when on), from `pos` (a resumed run's
    Position, or a new one); returns the run_stop status, or checkpoint.RESUMABLE or DIVERGED after a stop the ranks
    agreed on. Training stops after the last eval: epochs no eval would judge cannot change the outcome (the reference
    trained them, then aborted)."""
    evals = eval_epochs(s)
    last = evals[-1] if evals and val_it is not None else s.epoch_limit - 1
    stops = checkpoint.Stops(d, checkpoint.loss_limit(s.num_classes), signals=bool(saver))
    updates = Updates.of(s, train_it.steps_per_epoch)  # --batch-schedule's, or None
    for epoch in range(pos.epoch, last + 1):
        pos.epoch = epoch
        if epoch == pos.first and pos.step == 0:
            count = next(e for e in evals if e >= pos.first) - pos.first + 1 if evals else s.epoch_limit
            log.start(K.BLOCK_START, metadata={K.FIRST_EPOCH_NUM: pos.first + 1, K.EPOCH_COUNT: count})
        result = train_epoch(net, loss_fn, trainer, train_it, pos, s, stops, average, updates)
        if result == checkpoint.RESUMABLE:
            why = stops.settle()  # the steps since the check that agreed: no checkpoint of a diverged state
            return stop_diverged(s, d, trainer, pos, why) if why else stop_resumable(d, saver, pos)
        if isinstance(result, checkpoint.Divergence):
            return stop_diverged(s, d, trainer, pos, result)
        speed, wait, loss = result
        why = stops.settle()  # the steps since the last check, read before an eval judges the weights or a checkpoint
        if why:               # keeps them: a NaN model scored a constant answer's top-1, a success at a low target
            return stop_diverged(s, d, trainer, pos, why)
        log.event("throughput", speed * d.size, metadata={K.EPOCH_NUM: epoch + 1})
        line = f"epoch {epoch + 1}: {speed * d.size:.1f} img/s, data wait {wait:.1%}, loss {loss:.4f}"
        if epoch in evals and val_it is not None:
            watchdog.mark(watchdog.EVAL)
            with average.swapped_in():  # the EMA's weights and statistics, when on
                one_model(net, d)
                top1, top5, n = evaluate(net, val_it, d, epoch, flip_axis(s))
            line += f", top-1 {top1:.4f}, top-5 {top5:.4f} ({n} images)"
            log.end(K.BLOCK_STOP, metadata={K.FIRST_EPOCH_NUM: pos.first + 1})
            pos.first = epoch + 1
            if top1 >= s.accuracy_threshold:
                say(d, line)
                return K.SUCCESS
        say(d, line)
        pos.epoch, pos.step, pos.loss, pos.images = epoch + 1, 0, 0.0, 0
        if saver and saver.periodic(epoch) and epoch < last:
            try:
                say(d, f"checkpoint: {saver.save(pos)}")
            except InputError as err:  # the run goes on; the line names the checkpoint that stays current
                say(d, f"rn50_mx: {err}")
    return K.ABORTED


def one_model(net, d):
    """Every rank's BatchNorm running statistics replaced by their mean over the ranks, so that a multi-rank run has
    one model: the one its eval judges, its --save-model holds and `evaluate` scores to the logged figure (each rank's
    own statistics saw only its shard; docs/checkpoints.md). The weights are the same on every rank already.
    MXNet's CPU BatchNorm writes the statistics in backward without declaring it to the engine: wait first."""
    if d.size > 1:
        mx.nd.waitall()
        d.average_in_place(model.running_stats(net))


def stop_resumable(d, saver, pos):
    """A checkpoint at the step the ranks agreed on, and the MLPerf line that says the run can be resumed."""
    folder = saver.save(pos)
    log.event("resumable_stop", folder, metadata={K.EPOCH_NUM: pos.epoch + 1, "step": pos.step})
    say(d, f"stopped at epoch {pos.epoch + 1} step {pos.step}: resume from {folder}")
    d.barrier()  # no rank exits before the checkpoint is current: a launcher ends every rank when one exits
    return checkpoint.RESUMABLE


STEP_SIZE = ("optimizer", "lr", "warmup_epochs", "batch_size")  # the settings that set the step size


def stop_diverged(s, d, trainer, pos, why):
    """The one line and the MLPerf event that say the loss diverged (`why`, a Divergence), at `pos`, where every rank
    stops; no checkpoint is written."""
    settings = " ".join(f"{config.FIELDS[name].metadata['env']}={getattr(s, name)}" for name in STEP_SIZE)
    where = f"steps {why.first}-{why.last}" if why.first < why.last else f"step {why.last}"
    found = f"loss {why.loss:.4g} over the run's {where} on {why.ranks} of {why.world} rank(s)"
    say(d, f"diverged at epoch {pos.epoch + 1} step {pos.step}: {found}, past any a learning run has "
           f"({checkpoint.stops.LOSS_LIMIT} ln {s.num_classes} = {checkpoint.loss_limit(s.num_classes):.1f}); its step "
           f"size: {settings} x {d.size} rank(s), lr {trainer.learning_rate:.4g} at the stop")
    log.event("diverged", found, metadata={K.EPOCH_NUM: pos.epoch + 1, "step": pos.step, "steps": why.last})
    d.barrier()  # every rank stops here: a launcher ends every rank when one exits
    return checkpoint.DIVERGED


def rank_seed(s, d):
    """The logged base seed and this rank's seed drawn from it, as the reference (train_imagenet.py and
    run_with_docker.sh)."""
    base = s.seed if s.seed is not None else random.SystemRandom().randint(0, 65535)
    if s.seed is None:  # each rank drew its own: take rank 0's (the one logged), the others adding 0
        base = int(d.host_sum([base if d.rank == 0 else 0]).asscalar())
    seeds = np.random.RandomState(base).randint(2**16, size=d.size)
    seed = int(seeds[d.rank])
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)
    return base, seed


def warm_up_runs(s):
    """Runs of each graph in the warm-up: two on a GPU, where MXNet runs a bulked segment conventionally once and
    captures its CUDA graph on the second run (src/imperative/cuda_graphs.h, CudaGraphsExec::RunAll, with
    MXNET_ENABLE_CUDA_GRAPHS); one on the CPU, which has no CUDA graph and whose first run builds and allocates all
    there is (a second cost every run a step's CPU for nothing). One on the stand-in GPU build too (--standin): it
    captures no CUDA graph either (the rehearsal lists CUDA graphs as GPU only), so its second run would only repeat
    the first, at about a CPU-second a rank and run."""
    return 2 if s.device == "gpu" and s.standin == "off" else 1


def warm_up(net, loss_fn, trainer, s, ctx):
    """Do every first-time cost before the clock starts, then undo its effects on the model.

    warm_up_runs(s) eval forwards at the val images' shape (--val-crop), then as many training steps on zeros (the
    first builds and allocates the static graphs, tunes cuDNN and creates the optimizer states; MXNet's CUDA graphs
    capture a segment on the second), with their gradient allreduce and update. Training comes last: a block
    hybridized with static_alloc keeps one state per device and re-allocates and re-initialises it whenever the
    `recording` flag differs from its last run (MXNet 1.9.1 src/imperative/cached_op.cc, StaticForward: `match =
    match && state.recording == recording`), so the first timed step finds the training graph as the warm-up left
    it. Then the weights, BatchNorm statistics, optimizer states and update count are put back as they were, so the
    timed run is exactly the run it would have been without the warm-up.

    With progressive resizing every training size is traced, the first epoch's last: the block keeps one static
    state per device, so each change of shape in the run re-infers shapes and re-allocates that state (cached_op.cc,
    StaticForward: SetForwardGraph finds the shapes differ, then StaticAllocMemory and StaticInitExec), once per
    size change; what the warm-up takes off the clock is each shape's first-time cost (cuDNN's algorithm search per
    shape, MXNet's kernel and memory-pool growth)."""
    params = list(net.collect_params().values())
    saved = [p.data().copy() for p in params]
    label = mx.nd.zeros((s.batch_size,), ctx=ctx)
    val_x = mx.nd.zeros(data.batch_shape(s, train=False), ctx=ctx, dtype=s.input_dtype)
    runs = warm_up_runs(s)
    for _ in range(runs):
        scores(net, val_x, flip_axis(s)).wait_to_read()  # read before the training graph reuses the static memory
        watchdog.mark(watchdog.WARM_UP)  # each graph build and run is progress: the floor covers the longest
    update = 1 if s.batch_schedule else None  # with --batch-schedule, each warm-up step clears its gradient sums
    for hw in reversed(s.train_sizes):  # every size of --prog-start-side's schedule; the first epoch's last
        zeros = mx.io.DataBatch(data=[mx.nd.zeros(data.batch_shape(s, hw=hw), ctx=ctx, dtype=s.input_dtype)],
                                label=[label])
        for _ in range(runs):
            train_step(net, loss_fn, trainer, zeros, update)
            mx.nd.waitall()
            watchdog.mark(watchdog.WARM_UP)
    for p, value in zip(params, saved):
        p.set_data(value)
    optim.reset_trainer(trainer)
    mx.nd.waitall()


def arm_exit_alarm(seconds):
    """After run_stop, a process that hangs on its way out (a collective library's teardown, a stuck thread)
    must not stall the trials after it: SIGALRM with its default action ends the process whatever it is
    doing, even inside C code (the reference's signal.alarm(90)). run_and_time.sh reports it."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(seconds)


def run(s, origins):
    """The whole timed run of `s` (`origins`: config.resolve's); returns the run_stop status, or
    checkpoint.RESUMABLE or DIVERGED."""
    d = dist.init(s)
    data.named_files(s, data.present)  # asked what they are before any work, not read: that waits for run_start
    with checkpoint.model_output(s, d):  # checked and owned before any work
        saver = checkpoint.Checkpoints(s, d) if s.checkpoint_dir else None
        if saver and saver.meta and s.seed is None:  # the resumed run draws from the seed the checkpoint's run drew
            s = s.replace(seed=saver.meta["seed"])
        log.configure(d.rank, s.mllog_file, saver.resumes() if saver else None)
        config.say_fallback(origins)  # each process, once nothing is left to refuse
        with watchdog.watching(s, d.rank):  # from here to run_stop (train_on stops it)
            log.start(K.INIT_START, every_rank=True)
            if saver and saver.meta:
                log.event("resumed_from", saver.resume, metadata={K.EPOCH_NUM: saver.meta["epoch"] + 1,
                                                                  "step": saver.meta["step"]})
            log.submission(s)
            base_seed, seed = rank_seed(s, d)
            log.event(K.SEED, base_seed)
            ctx = dist.context(s, d.local_rank)
            with ctx:  # an array made without an explicit context lands on the run's device, never on cpu(0)
                return train_on(s, d, ctx, base_seed, seed, saver)


def network(s, ctx, hybridize=True, drawn=True):
    """The network of `s` on `ctx` as training runs it: hybridized with static_alloc and static_shape (NVIDIA's fused
    NormConv operators run only in the traced graph). Evaluate and the self-test take theirs here; an imperative
    network (hybridize=False) is for bench/train_step.py's comparison only. drawn: as model.build_model's."""
    net = model.build_model(s, ctx, drawn)
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)  # runs nothing before the first forward
    return net


def parts(s, ctx, steps, new_trainer, hybridize=True, drawn=True):
    """(network, loss, trainer) as training runs them: `network`, the smoothed loss, the optimizer on the schedule
    of `steps` per epoch built by `new_trainer` (dist's d.trainer). The benches, measure and the tests build theirs
    here too."""
    net = network(s, ctx, hybridize, drawn)
    return net, optim.make_loss(s), optim.make_trainer(net, s, steps, new_trainer)


def draws_weights(d, saver):
    """Whether this rank draws the initial weights: rank 0 of a fresh run only. The broadcast gives every other rank
    rank 0's weights (dist.Horovod.broadcast_params zeroes theirs first), so their Gaussian draws, 0.8 s of a core
    for ResNet-50's 25.6M weights, would be thrown away; a resumed run's weights come from its checkpoint."""
    return d.rank == 0 and not (saver and saver.resume)


def train_on(s, d, ctx, base_seed, seed, saver):
    """Build, warm up, run_start, train and evaluate on `ctx`; returns the run_stop status."""
    steps = data.steps_per_epoch(s, d.size)  # the ImageNet configs' NUMEXAMPLES: no data file read
    if saver:
        saver.check_fits(steps)
    net, loss_fn, trainer = parts(s, ctx, steps, d.trainer, drawn=draws_weights(d, saver))
    for name, param in net.collect_params().items():  # the 161 tensors rulesets 1.1-2.1 require by name
        if param.grad_req != "null":
            log.event(K.WEIGHTS_INITIALIZATION, metadata={"tensor": name})
    d.broadcast_params(net.collect_params())
    iters = data.build_iters(s, d.rank, d.size, seed, ctx)  # set-up: the pipelines, their readers not yet opened
    watchdog.mark(watchdog.WARM_UP)  # the model, its broadcast and the pipelines done: progress
    warm_up(net, loss_fn, trainer, s, ctx)
    average = ema.make(net, trainer, s)  # after the warm-up: its first update made the master copies
    log.hyperparameters(s)
    log.end(K.INIT_STOP)
    d.barrier()
    log.start(K.RUN_START)
    watchdog.mark(watchdog.DATA_WAIT)  # the run's pace counts from here
    train_it, val_it = data.open_iters(iters)  # the first time the data are touched
    assert train_it.steps_per_epoch == steps
    log.event(K.TRAIN_SAMPLES, train_it.num_samples)
    log.event(K.EVAL_SAMPLES, val_it.num_samples if val_it else 0)
    if saver:
        saver.attach(net, trainer, {"train": train_it, "val": val_it}, steps, base_seed, average)
    pos = saver.restore() if saver else checkpoint.Position()
    status = fit(s, d, net, loss_fn, trainer, train_it, val_it, pos, saver, average)
    if saver:
        checkpoint.default_signals()
    mx.nd.waitall()  # the last update's allreduces: a rank that exits with collectives queued fails its peers'
    watchdog.stop()  # run_stop, or the resumable stop's exit, is the verdict now
    if status == checkpoint.RESUMABLE:
        return status
    log.end(K.RUN_STOP, metadata={K.STATUS: K.ABORTED if status == checkpoint.DIVERGED else status})
    if saver:
        saver.finish(status)
    if s.save_model and status != checkpoint.DIVERGED:  # a diverged model is no run's result
        with average.swapped_in():  # the weights the evals judged
            if not (eval_epochs(s) and val_it is not None) or average.state() is not None:
                one_model(net, d)  # otherwise the last eval made it one model already (the EMA's is swapped back)
                mx.nd.waitall()  # every rank's share of that allreduce done: Horovod shuts down as a rank exits
            if d.rank == 0:
                say(d, "model: " + ", ".join(checkpoint.save_model(net, s.save_model, s)))
    return status


def say(d, line):
    if d.rank == 0:
        print(line, flush=True)


def progress(epoch, step, steps, speed, lr):
    print(f"  epoch {epoch + 1} step {step}/{steps}: {speed:.1f} img/s, lr {lr:.4g}", flush=True)


def parser():
    """Training's options: one per setting (config.FIELDS), each also read from its variable."""
    return config.settings_parser("rn50_mx.train")


def main():
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
        print(config.help_text())
        return 0
    faulthandler.enable(all_threads=True)  # a rank that dies in native code (CUDA, NCCL, Gloo) says where it was
    settings, origins = EARLY or config.resolve(sys.argv[1:])
    status = run(settings, origins)
    arm_exit_alarm(settings.exit_timeout)
    codes = {checkpoint.RESUMABLE: checkpoint.RESUMABLE_EXIT, checkpoint.DIVERGED: checkpoint.DIVERGED_EXIT}
    return codes.get(status, 0)


if __name__ == "__main__":
    run_cli(main, "rn50_mx.train")
