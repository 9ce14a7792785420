"""The open-division levers (docs/open-division.md): eval resolution and flip averaging, weight EMA, and their
honest record (refused in the closed division, logged, scored as open). Tiny: the three_classes set at 32x32."""
import os
import shutil
import signal

import mxnet as mx
import numpy as np
import pytest

from rn50_mx import checkpoint, config, data, dist, ema, evaluate, memory, model, optim, timing, train
from rn50_mx.config import Settings
from rn50_mx.rehearse.stages import same_bits
from tests.support import runs
from tests.support.mllog import events, values
from tests.support.procs import assert_one_line_naming, run_train
from tests.support.settings import OPEN, open_settings
from tests.support.timing import edited_fixture, report_of

# --- eval resolution and flip averaging ---------------------------------------------------------------------

def test_the_default_val_preprocessing_is_the_reference_s():
    """256 -> 224 at any size, as before the levers: 37 for a 32 crop, 256 for 224."""
    assert Settings(image_shape="3,32,32").val_resize_side == 37 == round(256 * 32 / 224)
    assert Settings().val_resize_side == 256 and Settings().eval_chw == (3, 224, 224)
    s = Settings(image_shape="3,176,176", val_crop=224, val_resize=232, submission_division="open")
    assert s.eval_chw == (3, 224, 224) and s.val_resize_side == 232  # MosaicML's train 176, eval 232/224


def expected_top1(net_like, s, batches, flip):
    """Top-1 of the same weights in a fresh imperative network, each batch through it separately (and its mirror,
    summing the softmax), in NumPy."""
    fresh = model.build_model(s, mx.cpu())
    for p, q in zip(fresh.collect_params().values(), net_like.collect_params().values()):
        p.set_data(q.data().copy())
    right = total = 0
    for x, label, valid in batches:
        logits = fresh(x).asnumpy()
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        if flip:
            mirrored = fresh(mx.nd.array(x.asnumpy()[:, :, :, ::-1])).asnumpy()
            other = np.exp(mirrored - mirrored.max(1, keepdims=True))
            probs = probs + other / other.sum(1, keepdims=True)
        right += int((probs.argmax(1)[:valid] == label.asnumpy()[:valid]).sum())
        total += valid
    return right / total


@pytest.mark.parametrize("flip", [False, True])
def test_an_eval_at_another_size_than_training_counts_what_a_fresh_network_gives(three_classes, flip):
    """The hybridized, static-shape network trains at 32, is evaluated at 64 (and with the mirror), then trains at 32
    again; the eval's top-1 equals a fresh network's on the same weights and batches."""
    s = open_settings(three_classes, val_crop=64, eval_flip=flip)
    ctx = mx.cpu()
    train_it, val_it = data.make_iters(s, 0, 1, 1, ctx)
    net, loss_fn, trainer = train.parts(s, ctx, train_it.steps_per_epoch, mx.gluon.Trainer)
    train.warm_up(net, loss_fn, trainer, s, ctx)
    train_it.reset()
    for batch in train_it:
        train.train_step(net, loss_fn, trainer, batch)
    assert val_it.provide_data[0].shape == (4, 3, 64, 64)
    top1, _, images = train.accuracy(net, val_it, dist.Single(), train.flip_axis(s))
    val_it.reset()
    batches = [(b.data[0].copy(), b.label[0].copy(), 4 - b.pad) for b in val_it]
    assert batches[0][0].shape == (4, 3, 64, 64) and images == 12
    assert top1 == expected_top1(net, s, batches, flip)
    train_it.reset()
    loss = train.train_step(net, loss_fn, trainer, next(iter(train_it)))  # back at the training size
    assert np.isfinite(loss.asscalar())


def test_the_mirror_is_the_width_axis_of_each_layout():
    assert train.flip_axis(Settings(eval_flip=True, submission_division="open")) == 3
    assert train.flip_axis(Settings(eval_flip=True, submission_division="open", input_layout="NHWC",
                                    device="gpu")) == 2
    assert train.flip_axis(Settings()) is None


@pytest.mark.parametrize("env,name", [
    ({"RN50_VAL_CROP": "16"}, "RN50_VAL_CROP"),
    ({"RN50_VAL_CROP": "-1"}, "RN50_VAL_CROP"),
    ({"RN50_VAL_CROP": "4097"}, "RN50_VAL_CROP"),
    ({"RN50_VAL_CROP": "x"}, "RN50_VAL_CROP"),
    ({"RN50_EVAL_FLIP": "maybe"}, "RN50_EVAL_FLIP"),
    ({"VAL_RESIZE": "0"}, "VAL_RESIZE"),
])
def test_bad_eval_lever_values_are_one_line(env, name):
    with pytest.raises(config.SettingsError, match=name):
        config.load([], dict(env, SUBMISSION_DIVISION="open"))


@pytest.mark.parametrize("env,name", [
    ({"RN50_VAL_CROP": "64"}, "RN50_VAL_CROP"),
    ({"RN50_EVAL_FLIP": "1"}, "RN50_EVAL_FLIP"),
    ({"VAL_RESIZE": "232"}, "VAL_RESIZE"),
    ({"LABELSMOOTHING": "0.08"}, "LABELSMOOTHING"),  # the closed rules allow 0 or 0.1; no checker sees it
])
def test_a_lever_in_the_closed_division_is_refused(env, name):
    with pytest.raises(config.SettingsError, match=f"^{name}=.*open-division lever.*SUBMISSION_DIVISION=open "):
        config.load([], env)
    assert config.open_levers(config.load([], dict(env, SUBMISSION_DIVISION="open")))
    assert config.open_levers(config.load([], {})) == {}
    assert config.open_levers(config.load([], {"LABELSMOOTHING": "0"})) == {}  # closed: 0 or 0.1


def test_train_refuses_a_closed_lever_in_one_line():
    assert_one_line_naming(run_train(["--eval-flip", "1"]), "--eval-flip")


# --- weight EMA ---------------------------------------------------------------------------------------------

def host(params):
    return {p.name: p.data().asnumpy().astype(np.float64) for p in params}


def test_the_ema_after_n_steps_is_the_average_of_the_weights_every_k_steps(three_classes):
    """Decay 0.7 every 2 steps over 5 steps (updates after steps 2 and 4): each average, BatchNorm statistics
    included, equals decay * average + (1 - decay) * weights in NumPy, from the weights after each step."""
    s = open_settings(three_classes, ema_decay=0.7, ema_every=2)
    ctx = mx.cpu()
    train_it, _ = data.make_iters(s, 0, 1, 1, ctx)
    net, loss_fn, trainer = train.parts(s, ctx, train_it.steps_per_epoch, mx.gluon.Trainer)
    train.warm_up(net, loss_fn, trainer, s, ctx)
    average = ema.make(net, trainer, s)
    params = list(net.collect_params().values())
    expected = host(params)
    operands = {k: np.abs(v) for k, v in expected.items()}  # the largest |term| each element's sums met
    train_it.reset()
    for step in range(1, 6):
        train.train_step(net, loss_fn, trainer, train_it.next())
        average.update(step)
        mx.nd.waitall()  # BatchNorm's statistics, written in backward: read after it
        if step % 2 == 0:
            weights = host(params)
            operands = {k: np.maximum(operands[k], np.abs(weights[k])) for k in operands}
            expected = {k: 0.7 * v + 0.3 * weights[k] for k, v in expected.items()}
    got = {k: a.asnumpy() for k, a in average.state().items()}
    assert len(got) == len(params) and all(a.dtype == np.float32 for a in got.values())
    for name in expected:
        # float32 sums of terms near 1 that cancel to near 0 are off by a few units of float32's last place of the
        # terms, not of the result (a gamma of 1e-3 from 0.7 x 1.3 - ...): the bound is 8 such units, and 2e-6 of it
        bound = 2e-6 * np.abs(expected[name]) + 8 * np.finfo(np.float32).eps * operands[name]
        assert np.all(np.abs(got[name] - expected[name]) <= bound), name
    moved = [n for n in expected if "running" in n and not np.allclose(expected[n], host(params)[n])]
    assert moved  # the statistics changed after step 4: the average lags them


def test_the_ema_follows_the_fp32_master_copy_of_a_float16_weight():
    """Under multi_precision the optimizer's state holds the float32 master; the average follows it, not the
    float16 weight, whose rounding would swallow small updates (the GPU path's class of bug, on the CPU)."""
    net = mx.gluon.nn.Dense(2, in_units=3, prefix="fc_")
    net.initialize(mx.init.Constant(1.0))
    net.cast("float16")
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-4, "multi_precision": True})
    def step():  # a gradient of 1 everywhere, through a backward (float16 Dense does not run on the CPU)
        with mx.autograd.record():
            total = mx.nd.add_n(*[p.data().astype("float32").sum() for p in net.collect_params().values()])
        total.backward()
        trainer.step(1)

    step()  # creates the (momentum, master) states: w = 1 - 1e-4, which float16 rounds back to 1
    average = ema.EMA(net, trainer, 0.5, 1)
    weight = net.collect_params()["fc_weight"]
    assert weight.data().asnumpy()[0, 0] == 1.0
    np.testing.assert_allclose(average.state()["fc_weight"].asnumpy(), 1 - 1e-4, rtol=1e-6)
    step()
    average.update(1)
    np.testing.assert_allclose(average.state()["fc_weight"].asnumpy(), 0.5 * (1 - 1e-4) + 0.5 * (1 - 2e-4),
                               rtol=1e-6)


def test_an_eval_swaps_the_average_in_and_the_weights_back_exactly(three_classes):
    s = open_settings(three_classes, ema_decay=0.5)
    net = model.build_model(s, mx.cpu())
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    average = ema.make(net, trainer, s)
    params = list(net.collect_params().values())
    for a in average.state().values():
        a[:] = 0.25
    before = host(params)
    with average.swapped_in():
        assert all((p.data().asnumpy() == 0.25).all() for p in params)
    after = host(params)
    assert all(same_bits(before[k], after[k]) for k in before)


def test_the_memory_statement_counts_what_the_ema_holds():
    s = Settings(num_classes=3, image_shape="3,32,32", ema_decay=0.9, submission_division="open")
    net = model.build_model(s, mx.cpu())
    average = ema.make(net, mx.gluon.Trainer(net.collect_params(), "sgd"), s)
    held = sum(a.size * np.dtype(a.dtype).itemsize for arrays in (average.average, average.live) for a in arrays.values())
    assert memory.ema_bytes(net, s) == held > 0 and memory.ema_bytes(net, Settings()) == 0


@pytest.mark.parametrize("env,name", [
    ({"RN50_EMA_DECAY": "1"}, "RN50_EMA_DECAY"),
    ({"RN50_EMA_DECAY": "-0.1"}, "RN50_EMA_DECAY"),
    ({"RN50_EMA_DECAY": "nan"}, "RN50_EMA_DECAY"),
    ({"RN50_EMA_DECAY": "0.9", "RN50_EMA_EVERY": "0"}, "RN50_EMA_EVERY"),
    ({"RN50_EMA_DECAY": "0.9", "RN50_EMA_EVERY": "two"}, "RN50_EMA_EVERY"),
])
def test_bad_ema_values_are_one_line(env, name):
    with pytest.raises(config.SettingsError, match=name):
        config.load([], dict(env, SUBMISSION_DIVISION="open"))


def test_the_ema_is_an_open_lever_and_its_period_goes_with_it():
    with pytest.raises(config.SettingsError, match="^RN50_EMA_DECAY=0.9: an open-division lever"):
        config.load([], {"RN50_EMA_DECAY": "0.9"})
    s = config.load([], {"RN50_EMA_DECAY": "0.9", "RN50_EMA_EVERY": "4", "SUBMISSION_DIVISION": "open"})
    assert config.open_levers(s) == {"ema_decay": 0.9, "ema_every": 4}


@pytest.mark.slow
def test_a_run_with_ema_stopped_mid_epoch_resumes_exactly_and_evaluate_uses_its_ema(three_classes, tmp_path):
    """SIGTERM in epoch 1 of a run with the EMA (every 3 steps, so the stop falls between updates) and a momentum
    schedule rising across the stop: the resumed run's evals (of the EMA) and its saved model (the EMA) equal the uninterrupted run's bit for bit."""
    recs = os.path.join(three_classes, "train.rec"), os.path.join(three_classes, "val.rec")
    lever = dict(ema_decay=0.6, ema_every=3, mom_schedule="0:0.5,1.5:0.9", submission_division="open")
    whole_log, whole_folder = str(tmp_path / "whole.log"), str(tmp_path / "whole_ckpt")
    reference = runs.run(recs, 1, tmp_path / "whole.txt", save_model=tmp_path / "whole", mllog_file=whole_log,
                         checkpoint_dir=whole_folder, checkpoint_every=1, **lever)
    folder, out = str(tmp_path / "ckpt"), tmp_path / "stopped.txt"
    proc = runs.start(recs, 1, out, held_at=3, checkpoint_dir=folder, **lever)
    runs.signal_held(proc, out, signal.SIGTERM)
    runs.finish(proc, out, code=checkpoint.RESUMABLE_EXIT)
    assert os.path.exists(os.path.join(folder, f"step-{runs.STEPS + 2}", "rank0.ema"))
    text = runs.run(recs, 1, tmp_path / "resumed.txt", checkpoint_dir=folder, save_model=tmp_path / "resumed",
                    **lever)
    runs.assert_same_params(str(tmp_path / "resumed"), str(tmp_path / "whole"))
    ours, theirs = runs.epoch_lines(text), runs.epoch_lines(reference)
    assert ours[2] == theirs[2] and "top-1" in ours[2]
    # python -m rn50_mx.evaluate on the checkpoint after epoch 1 gives that epoch's eval: the EMA's figure
    result = runs.evaluate(recs, 1, checkpoint_dir=whole_folder, **lever)
    assert f"top-1 {values(events(whole_log), 'eval_accuracy')[0]!r}, " in result.stdout, result.stderr[-2000:]
    step = os.path.join(whole_folder, f"step-{runs.STEPS}")
    net = evaluate.from_checkpoint(config.load(runs.argv(recs, 1, **lever)), whole_folder, mx.cpu())
    averages, live = mx.nd.load(os.path.join(step, "rank0.ema")), mx.nd.load(os.path.join(step, "params"))
    for name, p in net.collect_params().items():
        assert np.array_equal(p.data().asnumpy(), averages[name].asnumpy()), name
    assert not np.array_equal(live["conv0_weight"].asnumpy(), averages["conv0_weight"].asnumpy())


# --- momentum schedule -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["0.9", "0:1.0", "0:-0.1", "2:0.9,1:0.95", "1:0.9,1:0.95", "-1:0.9", "x:0.9",
                                  "0:nan", "0:0.9;1:0.9", " , ", "0:0.9,,1:0.95"])
def test_bad_momentum_schedules_are_one_line(text):
    with pytest.raises(config.SettingsError, match="^RN50_MOM_SCHEDULE=.*: .+") as err:
        config.load([], {"RN50_MOM_SCHEDULE": text, "SUBMISSION_DIVISION": "open"})
    assert "\n" not in str(err.value)


def test_the_momentum_schedule_is_an_open_lever_for_lars_only():
    with pytest.raises(config.SettingsError, match="^RN50_MOM_SCHEDULE=0:0.85,4:0.95: an open-division lever"):
        config.load([], {"RN50_MOM_SCHEDULE": "0:0.85,4:0.95"})
    with pytest.raises(config.SettingsError, match="^RN50_MOM_SCHEDULE: a momentum schedule needs LARS"):
        config.load([], {"RN50_MOM_SCHEDULE": "0:0.9", "OPTIMIZER": "sgd", "SUBMISSION_DIVISION": "open"})
    s = config.load(["--mom-schedule", " 0:0.85 , 4:0.95 "], {"SUBMISSION_DIVISION": "open"})
    assert s.momentum_points == [(0.0, 0.85), (4.0, 0.95)]
    assert config.open_levers(s) == {"mom_schedule": " 0:0.85 , 4:0.95 "}


def test_the_optimizer_follows_the_momentum_schedule_in_epochs():
    """4 steps an epoch, 0.5 at epoch 0 rising to 0.9 at epoch 1, then constant: the optimizer's momentum at each
    update; the submitted LARS form scales the layer weights' by the learning rate's ratio on top."""
    s = Settings(mom_schedule="0:0.5,1:0.9", submission_division="open", lr=1.0, warmup_epochs=1, num_epochs=3)
    opt = optim.make_optimizer(s, 4)
    assert [opt.momentum_of(t) for t in range(7)] == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9])
    opt.num_update = 3
    assert opt.layer_momentum() == pytest.approx(0.8 * (0.75 / 0.5))  # lr 0.75 after 0.5 in the warm-up
    assert optim.make_optimizer(Settings(), 4).momentum_of(2) == 0.9


def test_each_update_takes_the_scheduled_momentum():
    """Three LARS updates of a conv weight and a bias with the schedule give exactly the weights of an optimizer
    whose one momentum is set by hand to the schedule's value before each update; with the one momentum 0.9 they
    differ (the schedule is not ignored)."""
    rng = np.random.RandomState(0)
    grads = [[mx.nd.array(rng.randn(*shape)) for shape in ((4, 3, 3, 3), (4,))] for _ in range(3)]

    def updated(momentum_by_step=None, schedule=None):
        opt = optim.LARS(momentum=0.9, learning_rate=0.1, wd=1e-4, momentum_scheduler=schedule)
        weights = [mx.nd.array(np.random.RandomState(1).randn(*g.shape)) for g in grads[0]]
        states = [opt.create_state(i, w) for i, w in enumerate(weights)]
        for step, grad in enumerate(grads, 1):
            if momentum_by_step:
                opt.momentum = momentum_by_step(step)
            opt.update_multi_precision([0, 1], weights, grad, states)
        return [w.asnumpy() for w in weights]

    def schedule(t):
        return optim.momentum_at(t, [(0, 0.2), (1, 0.8)], 2)

    scheduled, by_hand, constant = updated(schedule=schedule), updated(momentum_by_step=schedule), updated()
    assert all(np.array_equal(a, b) for a, b in zip(scheduled, by_hand))
    assert not np.allclose(scheduled[0], constant[0])


# --- the record: logged, checked and scored as open ---------------------------------------------------------

LEVERS = dict(val_crop=48, eval_flip=1, ema_decay=0.8, ema_every=2, mom_schedule="0:0.8,1:0.9",
              submission_division="open")


@pytest.fixture(scope="module")
def open_run(three_classes, tmp_path_factory):
    """A run with every lever on, its threshold reached at the first eval: (stdout, MLPerf log)."""
    log = str(tmp_path_factory.mktemp("open_run") / "mlperf.log")
    flags = dict(OPEN, data_train=os.path.join(three_classes, "train.rec"),
                 data_val=os.path.join(three_classes, "val.rec"), num_epochs=2, warmup_epochs=0, lr=0.5,
                 eval_offset=0, eval_period=1, accuracy_threshold=0.0, mllog_file=log, **LEVERS)
    result = run_train([f"{config.flag_name(k)}={v}" for k, v in flags.items()])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout, log


def test_an_open_run_logs_its_division_and_each_lever(open_run):
    logged = events(open_run[1])
    assert values(logged, "submission_division") == ["open"]
    for name, value in dict(LEVERS, submission_division=None).items():
        if value is not None:
            assert values(logged, name) == [value], name
    assert values(logged, "run_stop", "status") == ["success"]


def test_the_checker_takes_the_open_rules_from_the_log_and_passes_it(open_run):
    assert timing.check_compliance(open_run[1], "1.0.0") == ("SUCCESS", "")


def test_timing_scores_open_runs_only_among_themselves(open_run, tmp_path):
    text = open(open_run[1]).read()
    assert text.count('"key": "seed", "value": 3') == 1
    for i in range(1, 6):  # five runs, each with a seed of its own (timing refuses copies of one run)
        (tmp_path / f"result_{i}.txt").write_text(text.replace('"key": "seed", "value": 3', f'"key": "seed", "value": {i}'))
    report = report_of([tmp_path], with_rcp=True)
    assert [run["division"] for run in report["runs"]] == ["open"] * 5
    assert report["score"]["division"] == "open" and report["score"]["minutes"] is not None
    assert report["rcp"]["passed"] is None and "closed-division runs only" in report["rcp"]["message"]
    assert "open-division score: " in timing.format_report(report)
    mixed = edited_fixture(tmp_path / "mixed", {})
    shutil.copy(open_run[1], mixed / "result_5.txt")
    report = report_of([mixed])
    assert report["score"]["minutes"] is None
    assert report["score"]["verdict"] == ("no score: the runs are not of one division (closed: "
                                          "result_1.txt, result_2.txt, result_3.txt, result_4.txt; open: result_5.txt)")


def test_check_lists_the_levers_on(capsys):
    from rn50_mx import check
    check.main(["--submission-division", "open", "--val-crop", "256", "--eval-flip", "1"])
    assert "open-division levers: --val-crop 256, --eval-flip True\n" in capsys.readouterr().out
    check.main([])
    assert "open-division levers: none" in capsys.readouterr().out
