"""The batch-size schedule (--batch-schedule, an open-division lever: docs/open-division.md): updates that sum the
gradients of several steps, on the linear-scaling learning rate, over unchanged data shards. Tiny: 32x32 images.

The two-rank test runs `python -m rn50_mx.train` under horovodrun through this file as a worker
(`python tests/test_batch_schedule.py worker OUT FLAGS...`), which records what each rank's steps saw."""
import dataclasses
import json
import os
import signal
import sys

import mxnet as mx
import numpy as np
import pytest

from rn50_mx import check, checkpoint, config, ema, optim, timing, train
from rn50_mx import mlperf_log as log
from rn50_mx.config import Settings
from rn50_mx.errors import run_cli
from rn50_mx.rehearse.stages import same_bits
from rn50_mx.updates import Updates
from tests.support import runs
from tests.support.data import one_per_class
from tests.support.mllog import events, values
from tests.support.nets import trained_parts
from tests.support.procs import assert_one_line_naming, gloo_ranks, run, run_train

THIS = os.path.abspath(__file__)
OPEN = {"SUBMISSION_DIVISION": "open"}


# --- the schedule: updates and learning rates ----------------------------------------------------------------

def test_an_epoch_whose_steps_the_factor_does_not_divide_ends_with_a_short_update():
    """5 steps an epoch, factor 1, then 2 from epoch 1, 4 from epoch 2: which steps end updates, their sizes, and
    the update count after each."""
    u = Updates.of(Settings(batch_schedule="1:2,2:4", num_epochs=3, submission_division="open"), 5)
    sizes = [[u.size(epoch, step) for step in range(1, 6)] for epoch in range(3)]
    assert sizes == [[1, 1, 1, 1, 1], [0, 2, 0, 2, 1], [0, 0, 0, 4, 1]]
    assert [u.count(1, step) for step in (2, 4, 5)] == [6, 7, 8] and [u.count(2, s) for s in (4, 5)] == [9, 10]
    assert [u.at(n) for n in (5, 6, 7, 8, 9, 10)] == [(5, 1), (7, 2), (9, 2), (10, 1), (14, 4), (15, 1)]
    assert u.at(11) == (19, 4)  # past the run's epochs the last factor goes on
    assert Updates.of(Settings(), 5) is None


def test_the_learning_rate_scales_with_each_updates_steps_on_the_epochs_of_the_schedule():
    """3 steps an epoch, 1 warmup epoch, 3 epochs, LR 1 to 0, factor 2 from epoch 1: update n ends after t steps and
    sums m of them; its rate is m x lr_at(t), by hand: warmup t/3, then (1 - (t - 3)/6)^2, 0 from t = 9. The momentum
    schedule is read at t too (0.5 at epoch 0 to 0.8 at epoch 3)."""
    s = Settings(batch_schedule="1:2", num_epochs=3, warmup_epochs=1, lr=1.0, end_lr=0.0, submission_division="open",
                 mom_schedule="0:0.5,3:0.8")
    opt = optim.make_optimizer(s, 3)
    #      n:    1      2      3    4 (t=5, m=2)      5 (t=6, m=1)  6 (t=8, m=2)       7 (t=9, m=1)
    table = [1 / 3, 2 / 3, 1.0, 2 * (1 - 2 / 6) ** 2, (1 - 3 / 6) ** 2, 2 * (1 - 5 / 6) ** 2, 0.0]
    assert [opt.lr_scheduler(n) for n in range(1, 8)] == pytest.approx(table, abs=1e-12)
    assert opt.momentum_of(4) == pytest.approx(0.5 + 0.3 * (5 / 3) / 3)
    plain = optim.make_optimizer(s.replace(batch_schedule=""), 3)
    assert [plain.lr_scheduler(n) for n in range(1, 8)] == [optim.lr_at(n, 1.0, 0.0, 3, 9) for n in range(1, 8)]


def test_the_log_gives_the_first_epochs_update_batch():
    s = Settings(batch_schedule="0:3,2:4", submission_division="open", dgxngpu=2, kv_store="horovod")
    logged = dict(log.hyperparameter_events(s))
    assert logged["global_batch_size"] == 3 * 2 * 408 and logged["gradient_accumulation_steps"] == 3
    assert dict(log.hyperparameter_events(Settings()))["gradient_accumulation_steps"] == 1


# --- one update --------------------------------------------------------------------------------------------

def micro_batches():
    rng = np.random.RandomState(0)
    return [mx.io.DataBatch(data=[mx.nd.array(rng.randn(4, 3, 32, 32))], label=[mx.nd.array(rng.randint(0, 3, 4))])
            for _ in range(2)]


def trainable(net):
    return {k: p for k, p in net.collect_params().items() if p.grad_req != "null"}


def test_one_update_of_two_steps_is_the_sgd_update_on_their_summed_gradients():
    """The hybridized network, factor 2 from the start: two train_steps (the first ends no update) move every
    weight as momentum SGD's first update transcribed in NumPy on the sum of the two steps' own gradients
    (computed apart), divided by the update's 8 images, at 2 x lr_at(2); the sums are zero after the update. Without
    the schedule the gradients are written, not added, and each step is an update, as before."""
    s = Settings(num_classes=3, image_shape="3,32,32", batch_size=4, optimizer="sgd", lr=0.5, wd=1e-2,
                 warmup_epochs=0, num_epochs=2, num_examples=16, batch_schedule="0:2", submission_division="open")
    b1, b2 = micro_batches()
    net, loss_fn, trainer = trained_parts(s, mx.cpu())
    params = trainable(net)
    assert {p.grad_req for p in params.values()} == {"add"}
    before = {k: p.data().asnumpy().astype(np.float64) for k, p in params.items()}
    apart = []
    for batch in (b1, b2):  # each step's own gradient, from the same weights (no update in between)
        train.train_step(net, loss_fn, trainer, batch, 0)
        apart.append({k: p.grad().asnumpy().astype(np.float64) for k, p in params.items()})
        optim.zero_sums(trainer)
    assert trainer._optimizer.num_update == 0
    train.train_step(net, loss_fn, trainer, b1, 0)
    train.train_step(net, loss_fn, trainer, b2, 2)
    lr = 2 * optim.lr_at(2, 0.5, s.end_lr, 0, 2 * 4)  # 16 images of batch 4: 4 steps an epoch
    moved = 0.0
    for k, p in params.items():
        wd = s.wd * p.wd_mult
        expected = before[k] - lr * ((apart[0][k] + apart[1][k]) / 8 + wd * before[k])
        np.testing.assert_allclose(p.data().asnumpy(), expected, rtol=1e-5, atol=2e-7, err_msg=k)
        assert not p.grad().asnumpy().any(), k
        moved = max(moved, np.abs(expected - before[k]).max())
    assert trainer._optimizer.num_update == 1 and moved > 1e-3
    net, loss_fn, trainer = trained_parts(dataclasses.replace(s, batch_schedule=""), mx.cpu())  # off: as before
    assert {p.grad_req for p in trainable(net).values()} == {"write"}
    train.train_step(net, loss_fn, trainer, b1)
    assert trainer._optimizer.num_update == 1 and trainer._optimizer.rescale_grad == 1 / 4


# --- two ranks: every image once per epoch ----------------------------------------------------------------

def schedule_worker(out, *flags):
    """`python -m rn50_mx.train FLAGS` under horovodrun, recording on each rank every train_step's labels and
    update size, the allreduces of the gradients, and what the EMA and the stop agreement were called with."""
    import horovod.mxnet as hvd
    seen, calls = [], {"allreduce": 0, "ema": [], "stops": []}
    step, allreduce, fit = train.train_step, hvd.DistributedTrainer._allreduce_grads, train.fit

    def recording_step(net, loss_fn, trainer, batch, update=None):
        seen.append([batch.label[0].asnumpy().astype(int).tolist(), update])
        return step(net, loss_fn, trainer, batch, update)

    def counting(self):
        calls["allreduce"] += 1
        return allreduce(self)

    def fit_and_save(s, d, net, loss_fn, trainer, *args):
        status = fit(s, d, net, loss_fn, trainer, *args)
        with open(f"{out}.rank{d.rank}.json", "w") as f:
            json.dump(dict(calls, seen=seen, num_update=trainer._optimizer.num_update), f)
        net.save_parameters(f"{out}.rank{d.rank}.params")
        return status

    train.train_step, hvd.DistributedTrainer._allreduce_grads, train.fit = recording_step, counting, fit_and_save
    ema.Off.update = lambda self, n: calls["ema"].append(n)
    agreed = checkpoint.Stops.agreed

    def recording_agreed(self, step, images, factor=1):
        calls["stops"].append([step, factor])
        return agreed(self, step, images, factor)

    checkpoint.Stops.agreed = recording_agreed
    sys.argv = ["rn50_mx.train", *flags]
    run_cli(train.main, "rn50_mx.train")


@pytest.fixture(scope="module")
def unique24(tmp_path_factory):
    """24 images, one per class, packed in order: a sample's label says which image it is."""
    return one_per_class(str(tmp_path_factory.mktemp("unique24")), 24, seed=5)


@pytest.mark.slow
def test_two_ranks_see_every_image_once_an_epoch_across_factor_changes(unique24, tmp_path):
    """2 Gloo ranks of 2 images a step, 6 steps an epoch, factor 1, then 2 from epoch 1 and 4 from epoch 2 (its 6 steps:
    an update of 4 and a short one of 2). Each epoch the two ranks' steps hold the 24 images once; both ranks end the
    same updates, allreduce once per update (the CPU's 1 warm-up step + 6 + 3 + 2), and call the EMA (with the update
    count) and the stop agreement (with the run's step and the epoch's factor) at update ends only; their weights
    agree. The log is open and says each epoch's update batch."""
    log_file = str(tmp_path / "mlperf.log")
    flags = dict(data_train=unique24 + ".rec", data_val=unique24 + ".rec", num_classes=24, image_shape="3,32,32",
                 batch_size=2, num_epochs=3, warmup_epochs=1, lr=0.5, eval_offset=2, eval_period=4,
                 accuracy_threshold=1.0, dali_threads=1, seed=7, kv_store="horovod", dgxngpu=2, disp_batches=1,
                 batch_schedule="1:2,2:4", submission_division="open", mllog_file=log_file)
    out = str(tmp_path / "run")
    result = run([*gloo_ranks(2), sys.executable, THIS, "worker", out,
                  *[f"{config.flag_name(k)}={v}" for k, v in flags.items()]], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.load(open(f"{out}.rank{r}.json")) for r in (0, 1)]
    sizes = [[1] * 6, [0, 2] * 3, [0, 0, 0, 4, 0, 2]]
    for rank in ranks:
        steps = rank["seen"][1:]  # after the warm-up's step
        assert [update for _, update in rank["seen"][:1]] == [1] and len(steps) == 18
        assert [[update for _, update in steps[e * 6:(e + 1) * 6]] for e in range(3)] == sizes
        assert rank["allreduce"] == 1 + 11 and rank["num_update"] == 11
        assert rank["ema"] == list(range(1, 12))
        assert rank["stops"] == [[step, 1] for step in range(1, 7)] + [[8, 2], [10, 2], [12, 2], [16, 4], [18, 4]]
    for epoch in range(3):
        images = [label for rank in ranks for labels, _ in rank["seen"][1 + epoch * 6:1 + (epoch + 1) * 6]
                  for label in labels]
        assert sorted(images) == list(range(24)), epoch
    weights = [mx.nd.load(f"{out}.rank{r}.params") for r in (0, 1)]
    assert all(same_bits(weights[0][k].asnumpy(), weights[1][k].asnumpy()) for k in weights[0])
    logged = events(log_file)
    assert values(logged, "submission_division") == ["open"] and values(logged, "batch_schedule") == ["1:2,2:4"]
    assert values(logged, "global_batch_size") == [4, 8, 16]
    assert values(logged, "gradient_accumulation_steps") == [1, 2, 4]
    assert [meta.get("epoch_num") for key, _, meta in logged if key == "global_batch_size"] == [None, 2, 3]
    assert timing.check_compliance(log_file, "1.0.0") == ("SUCCESS", "")


# --- a stop and its resume --------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stop_lands_one_update_after_the_signal_s_and_resumes_exactly(three_classes, tmp_path):
    """Every update sums 3 steps (2 updates an epoch, 6 in the run). SIGTERM once update 1 (steps 1-3) and its check
    have ended, the run held at step 5's batch in update 2 (runs.signal_held); the check at update 2's end carries
    the request and the next one reads it: the stop lands after update 3, step 3 of epoch 2 (step-9), between
    updates. The resumed run's evals and final model equal the uninterrupted run's bit for bit. Counting updates, the
    checks came at updates 4 and 8: the stop never landed and the run ended, exit 0."""
    recs = os.path.join(three_classes, "train.rec"), os.path.join(three_classes, "val.rec")
    lever = dict(batch_schedule="0:3", num_epochs=3, submission_division="open")
    reference = runs.run(recs, 1, tmp_path / "whole.txt", save_model=tmp_path / "whole", **lever)
    folder, out = str(tmp_path / "ckpt"), tmp_path / "stopped.txt"
    proc = runs.start(recs, 1, out, held_at=5, checkpoint_dir=folder, **lever)
    runs.signal_held(proc, out, signal.SIGTERM)  # at step 5, in update 2
    text = runs.finish(proc, out, code=checkpoint.RESUMABLE_EXIT)
    assert "stopped at epoch 2 step 3" in text and sorted(os.listdir(folder)) == ["lock", "step-9"], text[-3000:]
    text = runs.run(recs, 1, tmp_path / "resumed.txt", checkpoint_dir=folder, save_model=tmp_path / "resumed", **lever)
    runs.assert_same_params(str(tmp_path / "resumed"), str(tmp_path / "whole"))
    ours, theirs = runs.epoch_lines(text), runs.epoch_lines(reference)
    assert ours[2] == theirs[2] and ours[3] == theirs[3] and "top-1" in ours[3]


# --- settings and the record --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["2", "2:0", "2:1025", "x:2", "1.5:2", "2:2.5", "-1:2", "3:2,2:4", "2:2,2:4", " ",
                                  " , ", "2:2,,3:4", "2:2;3:4", "37:2"])
def test_bad_batch_schedules_are_one_line(text):
    with pytest.raises(config.SettingsError, match="^RN50_BATCH_SCHEDULE=.*: .+") as err:
        config.load([], {"RN50_BATCH_SCHEDULE": text, **OPEN})
    assert "\n" not in str(err.value)
    with pytest.raises(config.SettingsError, match="^--batch-schedule="):
        config.load([f"--batch-schedule={text}"], OPEN)


def test_train_refuses_a_bad_schedule_in_one_line():
    assert_one_line_naming(run_train(["--batch-schedule", "1:0", "--submission-division", "open"]),
                           "--batch-schedule='1:0': '1:0': the factor must be 1 to 1024")


def test_the_schedule_is_refused_where_nvidias_batchnorm_overwrites_gradients():
    gpu = {"DEVICE": "gpu", "INPUT_LAYOUT": "NHWC", "DTYPE": "float16", **OPEN}
    with pytest.raises(config.SettingsError, match="^RN50_BATCH_SCHEDULE: NVIDIA's NHWC float16 BatchNorm .*"
                                                   "INPUT_LAYOUT=NCHW or DTYPE=float32$"):
        config.load([], {"RN50_BATCH_SCHEDULE": "1:2", **gpu})
    assert config.load([], {"RN50_BATCH_SCHEDULE": "1:2", **gpu, "DTYPE": "float32"}).batch_points == [(1, 2)]


def test_the_schedule_is_an_open_lever_listed_by_check(capsys):
    with pytest.raises(config.SettingsError, match="^RN50_BATCH_SCHEDULE=1:2: an open-division lever"):
        config.load([], {"RN50_BATCH_SCHEDULE": "1:2"})
    s = config.load(["--batch-schedule", " 0:1 , 2:2 , 36:8"], OPEN)
    assert s.batch_points == [(0, 1), (2, 2), (36, 8)] and [s.batch_factor(e) for e in (0, 1, 2, 35, 36)] == [
        1, 1, 2, 2, 8]
    assert config.open_levers(s) == {"batch_schedule": " 0:1 , 2:2 , 36:8"}
    check.main(["--submission-division", "open", "--batch-schedule", "1:2"])
    assert "open-division levers: --batch-schedule 1:2\n" in capsys.readouterr().out
    assert "--batch-schedule" in config.help_text() and "RN50_BATCH_SCHEDULE" in config.help_text()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        schedule_worker(*sys.argv[2:])


# --- measurements --------------------------------------------------------------------------------------------

def test_the_timed_step_of_a_schedule_config_is_one_update_on_its_own_gradients(three_classes):
    """GPU review 4, F4: the tuner's and the self-test's timed step called trainer.step at every step on the sums that
    the schedule's grad_req 'add' kept and nothing cleared: an update each step on every gradient so far. They now
    time the step without the schedule, as a run at factor 1 takes it, and say so. A zero rate keeps the
    weights still, so every step's own gradient is the same."""
    from rn50_mx.selftest import checks
    from rn50_mx.tune import workers
    from tests.support.settings import open_settings

    s = open_settings(three_classes, batch_schedule="0:4", optimizer="sgd", lr=0.0, end_lr=0.0,
                      warmup_epochs=0)
    local = workers.Local(s, mx.cpu())
    trainer, batch = local.step.args[2], next(local.batches(None))
    weight = next(p for p in trainer._params if p.name == "fc1_weight")
    grads = []
    for _ in range(3):
        local.step(batch).wait_to_read()
        grads.append(weight.grad().asnumpy())
    assert trainer._optimizer.num_update == 3
    np.testing.assert_array_equal(grads[2], grads[0])
    assert "timed without the batch-size schedule" in checks.timed_steps(s, mx.cpu(), 1)
