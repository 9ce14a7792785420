"""LARS against a float64 NumPy reference, the schedule at its corners, the loss, and one real training step."""
import functools

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from rn50_mx import config, model, optim
from rn50_mx.config import Settings

# Shapes of a conv kernel, a dense weight, a zero conv kernel (trust ratio falls back to lr) and two 1-D tensors.
SHAPES = [(4, 3, 3, 3), (6, 8), (2, 2, 1, 1), (5,), (6,)]
WD, MOM, ETA, EPS, RESCALE = 1e-2, 0.9, 0.001, 1e-9, 1 / 8
SCHEDULE = functools.partial(optim.lr_at, base_lr=2.0, end_lr=1e-4, warmup_steps=3, total_steps=10)


def lars_reference(weights, grads, moms, lr):
    """One LARS step in float64, as sgdwfastlars optimizer, lars_multi_mp_sgd_mom_update without the
    momentum-correction quirk; 1-D tensors: no LARS, no wd."""
    for w, g, m in zip(weights, grads, moms):
        g = RESCALE * g
        wd = WD if w.ndim >= 2 else 0.0
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        lr_i = lr * ETA * w_norm / (g_norm + wd * w_norm + EPS) if w.ndim >= 2 and w_norm > 0 and g_norm > 0 else lr
        m[...] = MOM * m - lr_i * (wd * w + g)
        w += m


def random_tensors(rng, dtype):
    weights = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    weights[2][...] = 0
    return weights


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_lars_matches_numpy_over_two_steps(dtype):
    rng = np.random.default_rng(0)
    weights = random_tensors(rng, dtype)
    opt = optim.LARS(momentum=MOM, eta=ETA, eps=EPS, wd=WD, rescale_grad=RESCALE, lr_scheduler=SCHEDULE,
                     multi_precision=dtype == "float16")
    opt.set_wd_mult({i: 0.0 for i, s in enumerate(SHAPES) if len(s) == 1})
    updater = mx.optimizer.get_updater(opt)
    nd_weights = [nd.array(w, dtype=dtype) for w in weights]
    ref_weights = [w.astype(np.float64) for w in weights]
    ref_moms = [np.zeros(s) for s in SHAPES]
    for step in (1, 2):
        grads = [(8 * rng.standard_normal(s)).astype(dtype) for s in SHAPES]
        updater(list(range(len(SHAPES))), [nd.array(g, dtype=dtype) for g in grads], nd_weights)
        lars_reference(ref_weights, [g.astype(np.float64) for g in grads], ref_moms, SCHEDULE(step))
    for i, (w, ref_w, ref_m) in enumerate(zip(nd_weights, ref_weights, ref_moms)):
        state = updater.states[i]
        mom, master = state if dtype == "float16" else (state, w)
        assert mom.dtype == np.float32 and master.dtype == np.float32
        np.testing.assert_allclose(master.asnumpy(), ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mom.asnumpy(), ref_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(w.asnumpy(), master.asnumpy().astype(dtype))


def test_both_names_create_this_lars():
    assert type(mx.optimizer.create("lars")) is optim.LARS
    assert isinstance(mx.optimizer.create("sgdwfastlars"), optim.LARS)


@pytest.mark.parametrize("name", ["sgdwfastlars", "sgd"])
def test_the_aggregation_size_of_the_configs_is_honoured(name):
    """MXNET_OPTIMIZER_AGGREGATION_SIZE=54 (the reference's configs) sets the tensors per update call; the old LARS
    kept 60 whatever the configs said."""
    s = config.load([f"--optimizer={name}"], {"MXNET_OPTIMIZER_AGGREGATION_SIZE": "54"})
    assert optim.make_optimizer(s, 10).aggregate_num == 54
    assert optim.make_optimizer(Settings(optimizer=name), 10).aggregate_num == optim.MAX_TENSORS_PER_CALL
    with pytest.raises(config.SettingsError, match="MXNET_OPTIMIZER_AGGREGATION_SIZE='61'|must be <= 60"):
        config.load([], {"MXNET_OPTIMIZER_AGGREGATION_SIZE": "61"})


def test_schedule_corners():
    base, end, tw, total = 10.5, 1e-4, 786, 14541
    lr = functools.partial(optim.lr_at, base_lr=base, end_lr=end, warmup_steps=tw, total_steps=total)
    assert lr(1) == pytest.approx(base / tw)
    assert lr(tw) == pytest.approx(base)
    assert lr(tw + 1) == pytest.approx(end + (base - end) * (1 - 1 / (total - tw)) ** 2)
    assert lr(total - 1) == pytest.approx(end + (base - end) / (total - tw) ** 2)
    assert lr(total) == pytest.approx(end)
    assert lr(total + 100) == end


def test_schedule_from_settings_uses_epochs_times_steps():
    lr = optim.schedule(Settings(), steps_per_epoch=393)  # the reference: 786 warmup, 14541 total steps
    assert lr.keywords == dict(base_lr=10.5, end_lr=1e-4, warmup_steps=786, total_steps=14541)


def test_loss_is_per_sample_and_its_gradient_is_p_minus_q():
    k, a = 5, 0.1
    logits = np.random.default_rng(1).standard_normal((3, k))
    label = np.array([0, 4, 2])
    x = nd.array(logits)
    x.attach_grad()
    with autograd.record():
        loss = optim.make_loss(Settings(label_smoothing=a))(x, nd.array(label))
    loss.backward()
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    q = np.full((3, k), a / k)
    q[np.arange(3), label] += 1 - a
    np.testing.assert_allclose(loss.asnumpy(), -(q * np.log(p)).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(x.grad.asnumpy(), p - q, atol=1e-6)  # summed over samples: no 1/batch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lars", "sgd"])
def test_one_step_lowers_the_loss_and_scales_by_one_over_batch(name):
    # 64x64 and 4 images: at 32x32 with 2, stage 4's BatchNorm normalises 2 values and gradients reach 1e9.
    s = Settings(num_classes=10, image_shape="3,64,64", optimizer=name, lr=1e-3, warmup_epochs=0)
    mx.random.seed(0)
    net = model.build_model(s)
    trainer = optim.make_trainer(net, s, steps_per_epoch=10)
    loss_fn = optim.make_loss(s)
    x, y = nd.random.uniform(shape=(4, 3, 64, 64)), nd.array([1, 7, 3, 3])
    with autograd.record():
        before = loss_fn(net(x), y)
    before.backward()
    trainer.step(4)
    with autograd.train_mode():
        after = loss_fn(net(x), y)
    assert trainer.optimizer.rescale_grad == 1 / 4
    assert after.sum().asscalar() < before.sum().asscalar()


def test_trainer_excludes_1d_params_from_weight_decay():
    net = model.build_model(Settings(num_classes=10))
    optim.make_trainer(net, Settings(num_classes=10), steps_per_epoch=10)
    weights, excluded = model.split_params(net)
    assert {p.wd_mult for p in weights} == {1.0} and {p.wd_mult for p in excluded} == {0.0}
