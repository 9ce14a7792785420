"""LARS against a float64 NumPy reference, the schedule at its corners, the loss, and one real training step."""
import functools

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from rn50_mx import config, ema, model, optim
from rn50_mx.config import Settings
from tests.support.bfloat16 import needs_bfloat16, round_bf16, to_nd, to_np

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


def in_dtype(a, dtype):
    """Float32 `a` as the values an array of `dtype` holds, in float32 (or float16)."""
    return round_bf16(a) if dtype == "bfloat16" else a.astype(dtype)


def random_tensors(rng, dtype):
    weights = [in_dtype(rng.standard_normal(s).astype(np.float32), dtype) for s in SHAPES]
    weights[2][...] = 0
    return weights


@pytest.mark.parametrize("dtype", ["float32", "float16", pytest.param("bfloat16", marks=needs_bfloat16)])
def test_lars_matches_numpy_over_two_steps(dtype):
    """The low-precision weights' float32 masters follow the float64 transcription as float32 weights do, and each
    weight is its master rounded."""
    rng = np.random.default_rng(0)
    weights = random_tensors(rng, dtype)
    mixed = dtype != "float32"
    opt = optim.LARS(momentum=MOM, eta=ETA, eps=EPS, wd=WD, rescale_grad=RESCALE, lr_scheduler=SCHEDULE,
                     multi_precision=mixed, correct_momentum=False)
    opt.set_wd_mult({i: 0.0 for i, s in enumerate(SHAPES) if len(s) == 1})
    updater = mx.optimizer.get_updater(opt)
    nd_weights = [to_nd(w, dtype) for w in weights]
    ref_weights = [w.astype(np.float64) for w in weights]
    ref_moms = [np.zeros(s) for s in SHAPES]
    for step in (1, 2):
        grads = [in_dtype((8 * rng.standard_normal(s)).astype(np.float32), dtype) for s in SHAPES]
        updater(list(range(len(SHAPES))), [to_nd(g, dtype) for g in grads], nd_weights)
        lars_reference(ref_weights, [g.astype(np.float64) for g in grads], ref_moms, SCHEDULE(step))
    for i, (w, ref_w, ref_m) in enumerate(zip(nd_weights, ref_weights, ref_moms)):
        state = updater.states[i]
        mom, master = state if mixed else (state, w)
        assert mom.dtype == np.float32 and master.dtype == np.float32
        np.testing.assert_allclose(master.asnumpy(), ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mom.asnumpy(), ref_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(to_np(w), in_dtype(master.asnumpy(), dtype))


@needs_bfloat16
@pytest.mark.parametrize("name", ["sgdwfastlars", "sgd"])
def test_bfloat16_masters_are_the_float32_run_bit_for_bit(name):
    """Both optimizers as make_optimizer builds them, on the same bfloat16-exact weights and gradients: the bfloat16
    weights' float32 masters are the float32 weights of the same steps, bit for bit (the same float32 kernels on the
    same inputs), the momenta too, and each weight is its master rounded."""
    rng = np.random.default_rng(2)
    weights = random_tensors(rng, "bfloat16")
    grads = [[round_bf16(rng.standard_normal(s).astype(np.float32)) for s in SHAPES] for _ in range(3)]
    runs = {}
    for dtype in ("float32", "bfloat16"):
        s = Settings(optimizer=name, lr=0.5, warmup_epochs=1, num_epochs=3, wd=WD, dtype=dtype)
        updater = mx.optimizer.get_updater(optim.make_optimizer(s, steps_per_epoch=2))
        nd_weights = [to_nd(w, dtype) for w in weights]
        for step in grads:
            updater(list(range(len(SHAPES))), [to_nd(g, dtype) for g in step], nd_weights)
        runs[dtype] = nd_weights, updater.states
    (full, full_states), (low, low_states) = runs["float32"], runs["bfloat16"]
    for i, (w32, w16) in enumerate(zip(full, low)):
        mom, master = low_states[i]
        np.testing.assert_array_equal(master.asnumpy(), w32.asnumpy())
        np.testing.assert_array_equal(mom.asnumpy(), full_states[i].asnumpy())
        np.testing.assert_array_equal(to_np(w16), round_bf16(master.asnumpy()))


@needs_bfloat16
def test_zero_sums_clears_bfloat16_gradients():
    """--batch-schedule's reset after each update, on a bfloat16 network's gradients (reset_arrays takes no
    bfloat16) and its float32 BatchNorm ones."""
    s = Settings(num_classes=10, dtype="bfloat16", batch_schedule="0:2")
    net = model.build_model(s)
    trainer = optim.make_trainer(net, s, steps_per_epoch=10)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    set_grads(params, [np.ones(p.shape, np.float32) for p in params])
    optim.zero_sums(trainer)
    assert {np.dtype(p.grad().dtype) for p in params} == {np.dtype(np.float32), model.BFLOAT16}
    assert all(not to_np(p.grad()).any() for p in params)


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


def test_the_loss_is_hybridized_and_computes_what_the_imperative_one_does():
    """make_loss hybridizes (one cached graph per step); values and gradients are bit-identical on the CPU."""
    rng = np.random.default_rng(2)
    logits, label = nd.array(rng.standard_normal((8, 10)) * 3), nd.array(rng.integers(0, 10, 8))
    results = []
    for loss_fn in (optim.make_loss(Settings()), optim.SmoothedCrossEntropy(0.1)):
        x = logits.copy()
        x.attach_grad()
        with autograd.record():
            loss = loss_fn(x, label)
        loss.backward()
        results.append((loss.asnumpy(), x.grad.asnumpy()))
    assert optim.make_loss(Settings())._active
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


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


@pytest.mark.parametrize("form", ["submitted", "tf"])
def test_trainer_excludes_1d_params_from_weight_decay(form):
    """The submission's form decays fc1_bias too (its set_wd_mult); the TF reference's no 1-D tensor."""
    net = model.build_model(Settings(num_classes=10))
    optim.make_trainer(net, Settings(num_classes=10, lars_form=form), steps_per_epoch=10)
    weights, excluded = model.split_params(net)
    decayed = {p.name for p in excluded if p.wd_mult == 1.0}
    assert {p.wd_mult for p in weights} == {1.0} and {p.wd_mult for p in excluded} <= {0.0, 1.0}
    assert decayed == ({"fc1_bias"} if form == "submitted" else set())


def set_grads(params, grads):
    """Gradients as backward would leave them (Gluon's Trainer updates only arrays marked fresh by backward), each
    in its parameter's dtype."""
    for p, g in zip(params, grads):
        p.grad()[:] = to_nd(g) if p.dtype == model.BFLOAT16 else g
        p.data()._fresh_grad = True


def submitted_update(weights, grads, moms, names, lr, last_lr, rescale, wd, eta, momentum, fc_bias_decay=True):
    """One step of the submission's SGDwFASTLARS (training_results_v1.0 common/fit.py), transcribed in float64:
    weight decay on every `*_weight` and on the fc bias (its set_wd_mult); LARS on every tensor whose name does not
    end in gamma, beta or bias; the momentum of the first aggregated call of a step, which under the submission's
    MXNET_OPTIMIZER_AGGREGATION_SIZE=54 holds the 54 LARS tensors, times lr_t / lr_{t-1}."""
    for name, w, g, m in zip(names, weights, grads, moms):
        g = rescale * g
        decay = wd if name.endswith("_weight") or (fc_bias_decay and "fc" in name and "bias" in name) else 0.0
        lars = not name.endswith(("gamma", "beta", "bias"))
        lr_i = lr
        if lars:
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            if w_norm > 0 and g_norm > 0:
                lr_i = lr * eta * w_norm / (g_norm + decay * w_norm)
        mom = momentum * (lr / last_lr) if lars else momentum
        m[...] = mom * m - lr_i * (decay * w + g)
        w += m


@pytest.mark.parametrize("form,dtype", [("submitted", "float32"), ("tf", "float32"),
                                        pytest.param("submitted", "bfloat16", marks=needs_bfloat16)])
def test_lars_follows_the_submitted_rule_on_resnet50_shapes(form, dtype):
    """All 161 trainable tensors of ResNet-50 (1000 classes), 2 warm-up updates, the poly decay, its end and past it,
    through make_trainer as training builds it (aggregation 54, so calls mix layer weights and 1-D tensors). The
    submitted form matches the transcription; the TF form differs from it (no momentum scaling, no fc1_bias
    decay) and matches it with those two turned off. In bfloat16 (its weights and gradients rounded to it, BatchNorm's
    float32) the float32 masters match the transcription as float32 weights do, and each weight is its master
    rounded to bfloat16."""
    s = Settings(num_classes=1000, lr=2.0, end_lr=1e-4, warmup_epochs=2, num_epochs=4, wd=1e-2,
                 optimizer_aggregation_size=54, lars_form=form, dtype=dtype)
    mx.random.seed(0)
    net = model.build_model(s)
    trainer = optim.make_trainer(net, s, steps_per_epoch=1)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    names = [p.name for p in params]
    assert len(params) == 161
    rng = np.random.default_rng(1)
    ref = [to_np(p.data()).astype(np.float64) for p in params]
    moms = [np.zeros_like(w) for w in ref]
    schedule = optim.schedule(s, 1)
    last_lr = schedule(1)
    for t in range(1, 6):  # the learning rate of each step is new: half, whole, the decay's, its end, the end again
        grads = [rng.standard_normal(w.shape, dtype=np.float32) * np.float32(10 ** rng.uniform(-3, 1)) for w in ref]
        grads = [round_bf16(g) if p.dtype == model.BFLOAT16 else g for p, g in zip(params, grads)]
        set_grads(params, grads)
        trainer.step(8)
        lr = schedule(t)
        if form == "submitted":
            submitted_update(ref, grads, moms, names, lr, last_lr, 1 / 8, s.wd, s.lars_eta, s.mom)
        else:
            submitted_update(ref, grads, moms, names, lr, lr, 1 / 8, s.wd, s.lars_eta, s.mom, fc_bias_decay=False)
        last_lr = lr
    masters = ema.masters(trainer) if dtype == "bfloat16" else {}
    assert len(masters) == (55 if dtype == "bfloat16" else 0)  # 53 conv kernels, fc1 weight and bias; not BatchNorm
    for name, p, w in zip(names, params, ref):
        master = masters[name].asnumpy() if name in masters else p.data().asnumpy()
        np.testing.assert_allclose(master, w, rtol=2e-4, atol=1e-6, err_msg=name)
        if name in masters:
            np.testing.assert_array_equal(to_np(p.data()), round_bf16(master), err_msg=name)


def test_lars_makes_no_host_to_device_copy_after_its_first_step(monkeypatch):
    """nd.array waits for the engine to take its write (a step-wide sync on the CPU, a blocking copy on the GPU):
    the learning rates and weight decays of each call are built once, then computed on the device."""
    s = Settings(num_classes=10, optimizer_aggregation_size=54)
    net = model.build_model(s)
    trainer = optim.make_trainer(net, s, steps_per_epoch=4)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    set_grads(params, [np.ones(p.shape, np.float32) for p in params])
    trainer.step(4)
    before = [p.data().asnumpy() for p in net.collect_params().values()]
    set_grads(params, [np.ones(p.shape, np.float32) for p in params])
    copies = []
    real = nd.NDArray._sync_copyfrom
    monkeypatch.setattr(nd.NDArray, "_sync_copyfrom", lambda self, src: (copies.append(self.shape), real(self, src)))
    trainer.step(4)
    mx.nd.waitall()
    assert copies == []
    after = [p.data().asnumpy() for p in net.collect_params().values()]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after)), "the step updated the weights"
