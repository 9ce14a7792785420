"""The stand-ins for NVIDIA's fused operators (rn50_mx/standin/ngc.py): each against the same function from stock
MXNet operators (NCHW float32), forward and gradients; running statistics; hybridized with static_alloc on cpu(1);
every refusal rule with the fork's message; install() harmless twice, stock BatchNorm unchanged."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

from mxnet.ndarray import register

from rn50_mx import model, optim, standin
from rn50_mx.config import Settings
from rn50_mx.standin import ngc
from tests.support import devices, gpu_build

CTX = mx.cpu(1)  # a rank's stand-in device, not the default context
HALF = dict(rtol=2e-2, atol=2e-2)  # float16 data, float32 compute


@pytest.fixture
def fork(monkeypatch):
    """install(), undone after the test (so other tests see stock MXNet), and no refusal left pending: MXNet's engine
    keeps an operator's exception until a wait rethrows it, and a later test's waitall in the same process would
    (test_open's warm-up did, in the suite's worker after this file)."""
    for module, names in ((mx.nd, ngc.OPERATORS + ("BatchNorm",)), (mx.sym, ngc.OPERATORS + ("BatchNorm",)),
                          (mx.base, ("get_last_ffi_error",)), (mx.operator, ("print",))):
        for name in names:
            monkeypatch.setattr(module, name, getattr(module, name, None), raising=False)
    ngc.install()
    yield ngc
    try:
        mx.nd.waitall()
    except mx.MXNetError:
        pass  # a refusal the test provoked and did not wait for: rethrown once, then cleared


def rand(rng, shape, low=-1, high=1):
    return nd.array(rng.uniform(low, high, shape), ctx=CTX)


def nchw(a):
    return a.transpose((0, 3, 1, 2))


def nhwc(a):
    return a.transpose((0, 2, 3, 1))


def grads_of(fn, *arrays, head):
    """fn's output and the gradients of sum(output * head) with respect to arrays."""
    arrays = [a.copy() for a in arrays]
    for a in arrays:
        a.attach_grad()
    with autograd.record():
        out = fn(*arrays)
        (out * head).sum().backward()
    return out, [a.grad for a in arrays]


def bn_params(rng, c):
    return (rand(rng, (c,), 0.5, 1.5), rand(rng, (c,)), rand(rng, (c,)), rand(rng, (c,), 0.5, 2))


def stock_bn(x, gamma, beta, mean, var):
    """Stock BatchNorm on NCHW float32 (x given NHWC), result NHWC."""
    return nhwc(nd.BatchNorm(nchw(x.astype("float32")), gamma, beta, mean, var, eps=1e-5, momentum=0.9,
                             fix_gamma=False))


@pytest.mark.parametrize("addend", [False, True])
def test_fused_batchnorm_equals_stock_batchnorm_relu(fork, addend):
    rng = np.random.RandomState(0)
    x, z, head = rand(rng, (2, 3, 3, 8)), rand(rng, (2, 3, 3, 8)), rand(rng, (2, 3, 3, 8))
    gamma, beta, mean, var = bn_params(rng, 8)
    stock_stats, fused_stats = (mean.copy(), var.copy()), (mean.copy(), var.copy())
    kwargs = dict(eps=1e-5, momentum=0.9, fix_gamma=False, use_global_stats=False, axis=3)

    def fused(x, z, gamma, beta):
        if addend:
            return nd.BatchNormAddRelu(data=x, addend=z, gamma=gamma, beta=beta, moving_mean=fused_stats[0],
                                       moving_var=fused_stats[1], name="fwd", **kwargs)
        return nd.BatchNorm(x, gamma, beta, *fused_stats, act_type="relu", name="fwd", **kwargs)

    def stock(x, z, gamma, beta):
        y = stock_bn(x, gamma, beta, *stock_stats)
        return nd.relu(y + z if addend else y)

    half = [a.astype("float16") for a in (x, z)]
    got, got_grads = grads_of(fused, *half, gamma, beta, head=head.astype("float16"))
    want, want_grads = grads_of(stock, *[a.astype("float32") for a in half], gamma, beta, head=head)
    assert got.dtype == np.float16 and got.context == CTX and got_grads[0].dtype == np.float16
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), **HALF)
    for name, g, w in zip(("x", "z", "gamma", "beta"), got_grads, want_grads):
        if name != "z" or addend:
            assert g.context == CTX
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), err_msg=name, **HALF)
    # training moved the running statistics: the mean as stock's, the variance unbiased (nhwc_batch_norm.h:140-144)
    batch = x.astype("float16").astype("float32").reshape((-1, 8))
    np.testing.assert_allclose(fused_stats[0].asnumpy(), stock_stats[0].asnumpy(), rtol=1e-4, atol=1e-5)
    unbiased = np.var(batch.asnumpy(), axis=0, ddof=1)
    np.testing.assert_allclose(fused_stats[1].asnumpy(), 0.9 * var.asnumpy() + 0.1 * unbiased, rtol=1e-4)
    # inference reads them
    frozen = [s.copy() for s in fused_stats]
    inferred = fused(*half, gamma, beta)
    expected = nd.relu(stock_bn(half[0], gamma, beta, *frozen) + (half[1].astype("float32") if addend else 0))
    np.testing.assert_allclose(inferred.asnumpy(), expected.asnumpy(), **HALF)
    np.testing.assert_array_equal(fused_stats[0].asnumpy(), frozen[0].asnumpy())


@pytest.mark.parametrize("op, stride, kernel", [("NormConvolution", 1, 1), ("NormalizedConvolution", 2, 3)])
def test_norm_convolutions_equal_stock_convolution_with_their_sums(fork, op, stride, kernel):
    rng = np.random.RandomState(1)
    x, w = rand(rng, (2, 5, 5, 32)).astype("float16"), rand(rng, (32, kernel, kernel, 32), -0.2, 0.2)
    w = w.astype("float16")
    geometry = dict(kernel=(kernel, kernel), stride=(stride, stride), pad=(kernel // 2,) * 2, num_filter=32)
    mode = {"NormConvolution": dict(no_norm=True), "NormalizedConvolution": dict(no_equiv_scale_bias=True)}[op]
    outs = getattr(nd, op)(x, w, act_type=None, layout="NHWC", **geometry, **mode)  # positional: see ND_ARGUMENTS
    stock = nhwc(nd.Convolution(nchw(x.astype("float32")), nchw(w.astype("float32")), no_bias=True, **geometry))
    assert [o.dtype for o in outs] == [np.float16, np.float32, np.float32] and outs[0].context == CTX
    np.testing.assert_allclose(outs[0].asnumpy(), stock.asnumpy(), **HALF)
    np.testing.assert_allclose(outs[1].asnumpy(), stock.sum(axis=(0, 1, 2)).asnumpy(), rtol=1e-2, atol=0.1)
    np.testing.assert_allclose(outs[2].asnumpy(), (stock ** 2).sum(axis=(0, 1, 2)).asnumpy(), rtol=1e-2)
    head = rand(rng, stock.shape)
    _, got = grads_of(lambda a, b: getattr(nd, op)(a, b, layout="NHWC", **geometry, **mode)[0], x, w,
                      head=head.astype("float16"))
    _, want = grads_of(lambda a, b: nhwc(nd.Convolution(nchw(a), nchw(b), no_bias=True, **geometry)),
                       x.astype("float32"), w.astype("float32"), head=head)
    for g, e in zip(got, want):
        assert g.dtype == np.float16 and g.context == CTX
        np.testing.assert_allclose(g.asnumpy(), e.asnumpy(), **HALF)


@pytest.mark.parametrize("mode", ["plain", "fused_add", "dual_scale_bias"])
def test_stats_finalize_then_scale_bias_add_relu_equal_stock_batchnorm(fork, mode):
    """BNStatsFinalize on a batch's sums, then ScaleBiasAddRelu, as the NormConv units wire them, against stock
    BatchNorm (+ the shortcut, or its own BatchNorm) + ReLU: output, gradients of data, gammas and betas, running
    statistics."""
    rng = np.random.RandomState(2)
    shape, c = (2, 3, 3, 32), 32
    x, z, head = rand(rng, shape).astype("float16"), rand(rng, shape).astype("float16"), rand(rng, shape)
    xp, zp = bn_params(rng, c), bn_params(rng, c)
    stats = [[p.copy() for p in side[2:]] for side in (xp, zp)]
    stock_stats = [[p.copy() for p in side[2:]] for side in (xp, zp)]

    def finalize(data, gamma, beta, moving):
        d = data.astype("float32")
        return nd.BNStatsFinalize(sum=d.sum(axis=(0, 1, 2)), sum_squares=(d * d).sum(axis=(0, 1, 2)), gamma=gamma,
                                  beta=beta, moving_mean=moving[0], moving_var=moving[1], eps=1e-5, momentum=0.9,
                                  fix_gamma=False, output_mean_var=True, elem_count=d.size // c)

    def apply(side, outputs):
        return {f"{side}_{k}": v for k, v in zip(("equiv_scale", "equiv_bias", "mean", "invvar", "gamma", "beta"),
                                                 outputs)}

    def fused(x, z, xg, xb, zg, zb):
        kwargs = dict(dataX=x, act_type="relu", layout="NHWC", dual_scale_bias=mode == "dual_scale_bias",
                      fused_add=mode != "plain", **apply("x", finalize(x, xg, xb, stats[0])))
        if mode != "plain":
            kwargs["dataZ"] = z
        if mode == "dual_scale_bias":
            kwargs.update(apply("z", finalize(z, zg, zb, stats[1])))
        return nd.ScaleBiasAddRelu(**kwargs)[0]

    def stock(x, z, xg, xb, zg, zb):
        y = stock_bn(x, xg, xb, *stock_stats[0])
        if mode == "fused_add":
            y = y + z
        elif mode == "dual_scale_bias":
            y = y + stock_bn(z, zg, zb, *stock_stats[1])
        return nd.relu(y)

    got, got_grads = grads_of(fused, x, z, *xp[:2], *zp[:2], head=head.astype("float16"))
    want, want_grads = grads_of(stock, x.astype("float32"), z.astype("float32"), *xp[:2], *zp[:2], head=head)
    assert got.dtype == np.float16 and got.context == CTX
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), **HALF)
    used = {"plain": (0, 2, 3), "fused_add": (0, 1, 2, 3), "dual_scale_bias": range(6)}[mode]
    for i in used:
        np.testing.assert_allclose(got_grads[i].asnumpy(), want_grads[i].asnumpy(), err_msg=str(i), rtol=2e-2,
                                   atol=5e-2)
    np.testing.assert_allclose(stats[0][0].asnumpy(), stock_stats[0][0].asnumpy(), rtol=1e-3, atol=1e-4)


class Fused(gluon.HybridBlock):
    """BN -> ReLU and BN -> add -> ReLU as the model wires them when the build has the fused kernels."""

    def __init__(self):
        super().__init__(prefix="net_")
        with self.name_scope():
            kwargs = dict(axis=3, epsilon=1e-5, momentum=0.9, in_channels=32, fused=True)
            self.bn1 = model.BatchNormReLU(prefix="bn1_", **kwargs)
            self.bn2 = model.BatchNormAddReLU(prefix="bn2_", **kwargs)

    def hybrid_forward(self, F, x):
        return self.bn2(self.bn1(x), x)


def train_step(net, x, dtype="float16", grad_req="write"):
    net.cast(dtype)
    net.initialize(ctx=CTX)
    net.collect_params().setattr("grad_req", grad_req)
    for p in net.collect_params().values():
        if p.name.endswith(("running_mean", "running_var")):
            p.grad_req = "null"
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "multi_precision": True})
    with autograd.record():
        out = net(x)
        loss = (out.astype("float32") ** 2).mean()
    loss.backward()
    trainer.step(x.shape[0])
    for p in net.collect_params().values():  # a failed backward surfaces where its results are read
        p.data(CTX).wait_to_read()
    return out


def network(build):
    """The model's own blocks on the fused path: BN -> ReLU and BN -> add -> ReLU, or two NormConv units (a
    projection with stride 2, an identity); and an input for them."""
    if build == "fused_batchnorm":
        return Fused(), (2, 4, 4, 32)
    layout = model.Layout("NHWC", normconv_batch=2)
    net = gluon.nn.HybridSequential(prefix="stage1_")
    with net.name_scope():
        net.add(model.Bottleneck(layout, 32, 32, 2, True, False, "unit1_", (6, 6)),
                model.Bottleneck(layout, 128, 32, 1, False, False, "unit2_", (3, 3)))
    return net, (2, 6, 6, 32)


@pytest.mark.parametrize("build", ["fused_batchnorm", "normconv_units"])
def test_hybridized_static_alloc_network_trains_a_step_on_cpu1(fork, build, monkeypatch):
    """The model's own blocks, hybridized with static_alloc, on the stand-ins: a training step on cpu(1) with every
    output, gradient and statistic there, running statistics moved; then an inference forward. MXNet refuses mixed
    contexts here as a CUDA build does (tests/support/devices.py)."""
    monkeypatch.setattr(register, "_verify_all_legacy_ndarrays",
                        devices.same_context_check(register._verify_all_legacy_ndarrays))
    mx.random.seed(3)
    net, shape = network(build)
    x = nd.random.uniform(-1, 1, shape, ctx=CTX).astype("float16")
    out = train_step(net, x)
    params = net.collect_params().values()
    assert out.context == CTX and out.dtype == np.float16 and np.isfinite(out.asnumpy()).all()
    for p in params:
        assert p.data().context == CTX, p.name
        if p.grad_req != "null":
            assert np.abs(p.grad(CTX).asnumpy()).max() > 0, p.name
    means = [p for p in params if p.name.endswith("running_mean")]
    assert means and all(np.abs(p.data().asnumpy()).max() > 0 for p in means)
    assert net(x).context == CTX


@pytest.mark.parametrize("build, message", [
    # the first fused BatchNorm refuses; MXNet's engine runs the operators after it, and the error names the latest
    # stand-in refusal, which may be a BatchNormAddRelu's (its own float32 rule) when the engine got that far
    ("fused_batchnorm", "Fused ReLU activation is only supported with float16 NHWC Batchnorm on Volta|"
                        "BatchNormAddRelu outside float16 NHWC"),
    ("normconv_units", "This layer requires uniform type. Expected 'float32' v.s. given 'float16' at "
                       "'x_equiv_scale'")])
def test_hybridized_float32_network_fails_with_the_forks_message(fork, build, message):
    """GPU review 4, F1: the fused path in float32 dies at its first fused operator on NVIDIA's MXNet (the NormConv
    graph already at type inference: BNStatsFinalize's scale is float16 whatever its inputs, bn_stats_finalize.cc:
    71-75, and ScaleBiasAddRelu wants the data's type, scale_bias_add_relu.cc:131-165); hybridized (static_alloc) on
    the stand-ins, it fails so, with the fork's message in the MXNetError."""
    net, shape = network(build)
    refused(message, lambda: train_step(net, nd.random.uniform(-1, 1, shape, ctx=CTX), dtype="float32"))


@pytest.mark.parametrize("build", ["fused_batchnorm", "normconv_units"])
def test_hybridized_gradient_sums_are_refused(fork, build):
    """A batch-size schedule's grad_req 'add' on the fused path: the fused kernels overwrite the gradients they
    should add to (NhwcBatchNorm, BNStatsFinalize, the NormConv wgrad), so the step fails, naming the rule."""
    net, shape = network(build)
    refused("grad_req 'add' on|Unexpected req\\[\\] for gamma gradient: 3",
            lambda: train_step(net, nd.random.uniform(-1, 1, shape, ctx=CTX).astype("float16"), grad_req="add"))


def refused(match, fn):
    with pytest.raises(mx.MXNetError, match=match):
        out = fn()
        for o in out if isinstance(out, (list, tuple)) else [out]:
            o.wait_to_read()


def bn_inputs(shape=(2, 3, 3, 8), dtype="float16", axis=-1):
    c = shape[axis]
    return (nd.ones(shape, ctx=CTX, dtype=dtype), nd.ones((c,), ctx=CTX), nd.zeros((c,), ctx=CTX),
            nd.zeros((c,), ctx=CTX), nd.ones((c,), ctx=CTX))


@pytest.mark.parametrize("case", ["float32", "axis 1", "channels % 4", "use_global_stats", "2-D", "cudnn_off"])
def test_batchnorm_act_type_refusals_are_the_forks(fork, case):
    """batch_norm.cu:1110-1114: act_type only through NhwcBatchNormOp (Supports, nhwc_batch_norm-inl.h:296-308)."""
    kwargs = dict(act_type="relu", axis=3, fix_gamma=False)
    shape, dtype = (2, 3, 3, 8), "float16"
    if case == "float32":
        dtype = "float32"
    elif case == "axis 1":  # NCHW
        shape, kwargs["axis"] = (2, 8, 3, 3), 1
    elif case == "channels % 4":
        shape = (2, 3, 3, 6)
    elif case in ("use_global_stats", "cudnn_off"):
        kwargs[case] = True
    else:
        shape, kwargs["axis"] = (4, 8), 1
    refused("Fused ReLU activation is only supported with float16 NHWC Batchnorm on Volta",
            lambda: nd.BatchNorm(*bn_inputs(shape, dtype, kwargs["axis"]), **kwargs))


def test_batchnorm_act_type_other_than_relu_is_refused(fork):
    refused("Only ReLU activation fusion supported", lambda: nd.BatchNorm(*bn_inputs(), act_type="tanh", axis=3))
    refused("Invalid Input: 'gelu'", lambda: nd.BatchNorm(*bn_inputs(), act_type="gelu", axis=3))


def test_batchnorm_add_relu_outside_float16_nhwc_is_refused(fork):
    """The fork's fallback computes a plain BatchNorm, silently (batch_norm_add_relu.cu:676-682)."""
    x, gamma, beta, mean, var = bn_inputs(dtype="float32")
    refused("compute BatchNorm without the addend and the ReLU",
            lambda: nd.BatchNormAddRelu(data=x, addend=x, gamma=gamma, beta=beta, moving_mean=mean, moving_var=var,
                                        axis=3))
    x16 = x.astype("float16")
    for act_type in ("relu", None):  # batch_norm_add_relu-inl.h:72-92; None reaches the parser as "None"
        refused("Cannot find argument 'act_type'", lambda: nd.BatchNormAddRelu(
            data=x16, addend=x16, gamma=gamma, beta=beta, moving_mean=mean, moving_var=var, axis=3, act_type=act_type))
        refused("Cannot find argument 'act_type'", lambda: mx.sym.BatchNormAddRelu(
            data=mx.sym.var("x"), addend=mx.sym.var("z"), axis=3, act_type=act_type))
    refused("Shape inconsistent", lambda: nd.BatchNormAddRelu(data=x16, addend=x16[:1], gamma=gamma, beta=beta,
                                                              moving_mean=mean, moving_var=var, axis=3))


def add_request_backward(fn, *arrays, add):
    """Backward of fn with grad_req 'add' on the arrays at positions `add`, 'write' on the others."""
    arrays = [a.copy() for a in arrays]
    for i, a in enumerate(arrays):
        a.attach_grad(grad_req="add" if i in add else "write")
    with autograd.record():
        out = fn(*arrays)
    out.backward()
    return [a.grad for a in arrays]


@pytest.mark.parametrize("add", [(0,), (1,), (2,)])
def test_fused_batchnorm_refuses_add_to_gradients(fork, add):
    """NhwcBatchNormOp::Backward never reads req (nhwc_batch_norm-inl.h:205-290): an 'add' would be overwritten."""
    x, gamma, beta, mean, var = bn_inputs()
    refused("grad_req 'add' on", lambda: add_request_backward(
        lambda a, g, b: nd.BatchNorm(a, g, b, mean, var, act_type="relu", axis=3, fix_gamma=False), x, gamma, beta,
        add=add))


def conv_call(op="NormConvolution", c=32, dtype="float16", **overrides):
    x = nd.ones((2, 4, 4, c), ctx=CTX, dtype=dtype)
    kwargs = dict(kernel=(1, 1), stride=(1, 1), pad=(0, 0), num_filter=32, layout="NHWC", no_norm=True)
    if op == "NormalizedConvolution":
        kwargs["no_equiv_scale_bias"] = kwargs.pop("no_norm")
    kwargs.update(overrides)
    w = nd.ones((kwargs["num_filter"],) + tuple(kwargs["kernel"]) + (c,), ctx=CTX, dtype=dtype)
    return lambda: getattr(nd, op)(x, w, **kwargs), x, w, kwargs


@pytest.mark.parametrize("op, message", [("NormConvolution", "No fallback impl for unsupported NormConvolution "
                                                              "configuration"),
                                         ("NormalizedConvolution", "Only cudnn-based NormalizedConvolution supported")])
@pytest.mark.parametrize("case", [dict(dtype="float32"), dict(c=16), dict(num_filter=48), dict(kernel=(5, 5)),
                                  dict(dilate=(2, 2)), dict(num_group=2)])
def test_norm_convolution_refusals_are_the_forks(fork, op, message, case):
    """Supports: cudnn_norm_convolution-inl.h:455-503, cudnn_normalized_convolution-inl.h:423-471."""
    refused(message, conv_call(op, **case)[0])


@pytest.mark.parametrize("op, message", [("NormConvolution", "No fallback impl for unsupported NormConvolution "
                                                              "configuration"),
                                         ("NormalizedConvolution", "Only cudnn-based NormalizedConvolution supported")])
def test_a_1x1_norm_convolution_of_stride_2_is_refused_on_volta_only(fork, monkeypatch, op, message):
    """GPU review 6, F1: on SM 70 the fork's Supports() takes a 1x1 kernel with stride 1 only (cudnn_norm_convolution-
    inl.h:481-484, cudnn_normalized_convolution-inl.h:449-452), so the projection shortcut of stages 2-4 (1x1, stride
    2) is refused there, a 3x3 of stride 2 taken; SM 80 takes both. The old stand-in took it on SM 70."""
    monkeypatch.setitem(ngc.GPU, "sm", 70)
    refused(message, conv_call(op, stride=(2, 2))[0])
    for taken in (dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1)), dict(stride=(1, 1))):
        conv_call(op, **taken)[0]()[0].wait_to_read()
    monkeypatch.setitem(ngc.GPU, "sm", 80)
    conv_call(op, stride=(2, 2))[0]()[0].wait_to_read()


class AppliedNormConv(gluon.HybridBlock):
    """NormConvolution without no_norm (NVIDIA's resnet-v1b-mainloop-fl: the previous convolution's sums and
    BatchNorm given, applied with the ReLU before the convolution), traced as the network traces it; its running
    statistics are the block's parameters, initialised to `stats` on the stand-in device."""

    def __init__(self, stats, **kwargs):
        super().__init__(prefix="applied_")
        self.kwargs = dict(dict(no_norm=False, act_type="relu", eps=1e-5, momentum=0.9, fix_gamma=False,
                                layout="NHWC"), **kwargs)
        with self.name_scope():
            self.moving_mean, self.moving_var = (self.params.get(name, shape=stats[0].shape, grad_req="null")
                                                 for name in ("moving_mean", "moving_var"))
        self.initialize(ctx=CTX)
        self.moving_mean.set_data(stats[0])
        self.moving_var.set_data(stats[1])

    def hybrid_forward(self, F, x, total, squares, gamma, beta, weight, moving_mean, moving_var):
        return F.NormConvolution(data=x, in_sum=total, in_sum_squares=squares, gamma=gamma, beta=beta,
                                 moving_mean=moving_mean, moving_var=moving_var, weight=weight, **self.kwargs)


def test_a_norm_convolution_applying_statistics_equals_stock_batchnorm_relu_convolution(fork):
    """NVIDIA's 24.04 wiring (mainloop-fl) makes conv2 and conv3 NormConvolutions that finalize the previous
    convolution's sums into BatchNorm's statistics and apply them with the ReLU (cudnn_norm_convolution-inl.h:
    595-663, 171-267, 342-446): against stock BatchNorm (training) -> ReLU -> convolution, NCHW float32: output, the
    output's sums, the gradients of data, gamma, beta and weight (none of the sums), the running statistics moved
    (the variance unbiased, as BNStatsFinalize's); then inference on them. The old stand-in refused the mode."""
    rng = np.random.RandomState(4)
    c, geometry = 32, dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), num_filter=32)
    x, w = rand(rng, (2, 5, 5, c)).astype("float16"), rand(rng, (32, 3, 3, c), -0.2, 0.2).astype("float16")
    gamma, beta, mean, var = bn_params(rng, c)
    head = rand(rng, (2, 3, 3, 32))
    block = AppliedNormConv((mean, var), **geometry)
    block.hybridize(static_alloc=True, static_shape=True)
    x32 = x.astype("float32")
    sums = [x32.sum(axis=(0, 1, 2)), (x32 * x32).sum(axis=(0, 1, 2))]
    outputs = []

    def applied(a, g, b, k):
        outputs.extend(block(a, *sums, g, b, k))
        return outputs[0]

    got, got_grads = grads_of(applied, x, gamma, beta, w, head=head.astype("float16"))
    stock_stats = [mean.copy(), var.copy()]

    def stock(a, g, b, k):
        return nhwc(nd.Convolution(nchw(nd.relu(stock_bn(a, g, b, *stock_stats))), nchw(k), no_bias=True,
                                   **geometry))

    want, want_grads = grads_of(stock, x32, gamma, beta, w.astype("float32"), head=head)
    assert got.dtype == np.float16 and got.context == CTX and [o.dtype for o in outputs[1:]] == [np.float32] * 2
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), **HALF)
    np.testing.assert_allclose(outputs[1].asnumpy(), want.sum(axis=(0, 1, 2)).asnumpy(), rtol=2e-2, atol=0.5)
    for name, g, e in zip(("data", "gamma", "beta", "weight"), got_grads, want_grads):
        np.testing.assert_allclose(g.asnumpy(), e.asnumpy(), err_msg=name, rtol=2e-2, atol=5e-2)
    moved = [block.moving_mean.data().asnumpy(), block.moving_var.data().asnumpy()]
    np.testing.assert_allclose(moved[0], stock_stats[0].asnumpy(), rtol=1e-3, atol=1e-4)
    unbiased = np.var(x32.reshape((-1, c)).asnumpy(), axis=0, ddof=1)
    np.testing.assert_allclose(moved[1], 0.9 * var.asnumpy() + 0.1 * unbiased, rtol=1e-3)
    frozen = [nd.array(m, ctx=CTX) for m in moved]
    inferred = nhwc(nd.Convolution(nchw(nd.relu(stock_bn(x, gamma, beta, *frozen))), nchw(w.astype("float32")),
                                   no_bias=True, **geometry))
    with autograd.predict_mode():
        np.testing.assert_allclose(block(x, *sums, gamma, beta, w)[0].asnumpy(), inferred.asnumpy(), **HALF)
    np.testing.assert_array_equal(block.moving_mean.data().asnumpy(), moved[0])


@pytest.mark.parametrize("case, message", [
    (dict(fix_gamma=True), "fix_gamma=True: the stand-in models fix_gamma=False only"),
    (dict(use_global_stats=True), "use_global_stats=True: the stand-in models use_global_stats=False only"),
    ("add", "NormConvolution dgrad output summation not supported when applying stats"),
], ids=["fix_gamma", "use_global_stats", "data gradient added"])
def test_a_norm_convolution_applying_statistics_refuses_what_the_fork_would_not_run_as_modelled(fork, case, message):
    """The finalize's switches the network never sets (fix_gamma would write 1 into gamma, cudnn_norm_convolution-
    inl.h:626; the others change the outputs), and a data gradient to add to, which the fork refuses with its
    statistics applied (:352-354)."""
    rng = np.random.RandomState(5)
    x, w = rand(rng, (2, 4, 4, 32)).astype("float16"), rand(rng, (32, 1, 1, 32)).astype("float16")
    gamma, beta, mean, var = bn_params(rng, 32)
    block = AppliedNormConv((mean, var), kernel=(1, 1), num_filter=32, **(case if case != "add" else {}))
    block.hybridize()
    sums = [x.astype("float32").sum(axis=(0, 1, 2)), (x.astype("float32") ** 2).sum(axis=(0, 1, 2))]
    refused(message, lambda: add_request_backward(lambda a: block(a, *sums, gamma, beta, w)[0], x,
                                                  add=(0,) if case == "add" else ()))


def test_scale_bias_add_relu_composes_with_the_forks_default_flags(fork):
    """NVIDIA's mainloop-fl projection unit calls ScaleBiasAddRelu without dual_scale_bias and fused_add
    (resnet-v1b-mainloop-fl.py:76-82), whose defaults are true (scale_bias_add_relu-inl.h:128-131): its inputs are
    dataZ and the z_ statistics too. The old stand-in took the flags as false and refused dataZ."""
    names = ["dataX", "dataZ", "x_equiv_scale", "x_equiv_bias", "z_equiv_scale", "z_equiv_bias", "x_gamma", "x_beta",
             "x_mean", "x_invvar", "z_gamma", "z_beta", "z_mean", "z_invvar"]
    out = mx.sym.ScaleBiasAddRelu(**{n: mx.sym.var(n) for n in names}, layout="NHWC", act_type="relu")
    assert out.list_inputs() == names
    plain = mx.sym.ScaleBiasAddRelu(**{n: mx.sym.var(n) for n in names if "Z" not in n and "z_" not in n},
                                    layout="NHWC", act_type="relu", dual_scale_bias=False, fused_add=False)
    assert "dataZ" not in plain.list_inputs()


def test_norm_convolution_layout_and_weight_keyword(fork):
    """NCHW is not NHWC; and the NDArray function declares no `weight` (norm_convolution.cc:475-481), so the fork
    refuses it by keyword (which is why model.py takes NormConv only while tracing)."""
    call, x, w, kwargs = conv_call(layout="NCHW")
    refused("No fallback impl", call)
    kwargs["layout"] = "NHWC"
    refused("Cannot find argument 'weight'", lambda: nd.NormConvolution(data=x, weight=w, **kwargs))


def test_norm_convolution_weight_gradient_refuses_add_and_data_gradient_adds(fork):
    """wgrad overwrites (no output blending, cudnn_norm_convolution-inl.h:326-340); dgrad adds on kAddTo when only
    the convolution is present (:349-351)."""
    call, x, w, kwargs = conv_call()
    fn = lambda a, b: nd.NormConvolution(a, b, **kwargs)[0]  # noqa: E731
    refused("grad_req 'add' on weight", lambda: add_request_backward(fn, x, w, add=(1,)))
    once = add_request_backward(fn, x, w, add=())[0]
    arrays = [x.copy(), w.copy()]
    arrays[0].attach_grad(grad_req="add")
    arrays[1].attach_grad()
    for _ in range(2):
        with autograd.record():
            out = fn(*arrays)
        out.backward()
    np.testing.assert_allclose(arrays[0].grad.asnumpy(), 2 * once.asnumpy(), rtol=1e-3)


def finalize_inputs():
    c = 32
    return [nd.ones((c,), ctx=CTX) for _ in range(4)], dict(moving_mean=nd.zeros((c,), ctx=CTX),
                                                            moving_var=nd.ones((c,), ctx=CTX))


def test_bn_stats_finalize_refusals_are_the_forks(fork):
    (total, squares, gamma, beta), aux = finalize_inputs()
    kwargs = dict(eps=1e-5, momentum=0.9, fix_gamma=False, output_mean_var=True, elem_count=8)

    def call(*arrays, **extra):
        return nd.BNStatsFinalize(*arrays, **aux, **dict(kwargs, **extra))

    refused("No fallback impl for unsupported BNStatsFinalize configuration",
            lambda: call(total, squares, gamma, beta, use_global_stats=True))
    refused("Required parameter elem_count", lambda: call(total, squares, gamma, beta, elem_count=None))
    refused("Expected 'float32' v.s. given 'float16' at 'sum'",
            lambda: call(total.astype("float16"), squares, gamma, beta))
    for i, name in ((2, "gamma"), (3, "beta")):  # cudnn_bn_stats_finalize-inl.h:257-284
        refused(f"BNStatsFinalize::Backward\\(\\): Unexpected req\\[\\] for {name} gradient: 3",
                lambda: add_request_backward(lambda *a: call(*a)[4 if name == "gamma" else 5], total, squares,
                                             gamma, beta, add=(i,)))


def sbar_inputs(c=32, dtype="float16", layout="NHWC"):
    x = nd.ones((2, 3, 3, c), ctx=CTX, dtype=dtype)
    vec = lambda t: nd.ones((c,), ctx=CTX, dtype=t)  # noqa: E731
    return dict(dataX=x, x_equiv_scale=vec(dtype), x_equiv_bias=vec(dtype), x_gamma=vec("float32"),
                x_beta=vec("float32"), x_mean=vec("float32"), x_invvar=vec("float32"), act_type="relu",
                layout=layout, dual_scale_bias=False, fused_add=False)


@pytest.mark.parametrize("case", [dict(dtype="float32"), dict(c=16)])
def test_scale_bias_add_relu_refusals_are_the_forks(fork, case):
    """Supports (cudnn_scale_bias_add_relu-inl.h:401-423) else ScaleBiasAddReluOp::Init (scale_bias_add_relu-inl.h:
    185)."""
    kwargs = sbar_inputs(**case)
    if case.get("dtype") == "float32":
        for k in ("x_gamma", "x_beta", "x_mean", "x_invvar"):
            kwargs[k] = kwargs[k].astype("float32")
    refused("Only cudnn-based ScaleBiasAddRelu supported", lambda: nd.ScaleBiasAddRelu(**kwargs))


def test_scale_bias_add_relu_type_layout_and_add_refusals(fork):
    kwargs = sbar_inputs()
    kwargs["x_gamma"] = kwargs["x_gamma"].astype("float16")
    refused("Expected 'float32' v.s. given 'float16' at 'x_gamma'", lambda: nd.ScaleBiasAddRelu(**kwargs))
    refused("Invalid Input: 'NCHW'", lambda: nd.ScaleBiasAddRelu(**sbar_inputs(layout="NCHW")))
    kwargs = sbar_inputs()
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, nd.NDArray)}
    params = {k: v for k, v in kwargs.items() if k not in arrays}
    names = list(arrays)
    refused("grad_req 'add' on dataX", lambda: add_request_backward(
        lambda *a: nd.ScaleBiasAddRelu(**dict(zip(names, a)), **params)[0], *arrays.values(), add=(0,)))


def test_symbols_compose_by_the_forks_input_names(fork):
    """A traced call names its inputs as the fork's FListInputNames; an unknown name is refused."""
    data, weight = mx.sym.var("data"), mx.sym.var("weight")
    out = mx.sym.NormConvolution(data=data, weight=weight, no_norm=True, kernel=(1, 1), num_filter=32,
                                 layout="NHWC", name="c")
    assert out.list_inputs() == ["data", "weight"] and len(out.list_outputs()) == 3
    with pytest.raises(mx.MXNetError, match="Keyword argument name in_sum not found"):
        mx.sym.NormConvolution(data=data, in_sum=weight, no_norm=True, kernel=(1, 1), num_filter=32, layout="NHWC")


def test_install_twice_keeps_stock_batchnorm_unchanged(fork):
    stock = mx.nd.BatchNorm.stock
    fork.install()
    assert mx.nd.BatchNorm.stock is stock and mx.sym.BatchNorm.stock.__name__ == "BatchNorm"
    x, gamma, beta, mean, var = bn_inputs(dtype="float32")
    x = nd.random.uniform(shape=x.shape, ctx=CTX)
    np.testing.assert_array_equal(mx.nd.BatchNorm(x, gamma, beta, mean, var, axis=3).asnumpy(),
                                  stock(x, gamma, beta, mean, var, axis=3).asnumpy())
    assert "BatchNorm" in mx.sym.BatchNorm(mx.sym.var("x"), name="bn").tojson()
    assert "act_type" in fork.batchnorm_arguments() and "eps" in fork.batchnorm_arguments()
    assert set(model.NORMCONV_OPERATORS) <= set(fork.OPERATORS) and "BatchNormAddRelu" in fork.OPERATORS


def test_the_whole_gpu_network_traces_onto_the_stand_ins(fork, monkeypatch):
    """ResNet-50 as the GPU path builds it (NHWC float16, fused BatchNorm, NormConv units) traced on the stand-ins:
    its inputs are exactly the data and the parameters, by name, and float16 types and shapes carry through every
    fused operator to the logits."""
    monkeypatch.setattr(model, "fused_batchnorm_available", lambda: True)
    monkeypatch.setattr(model, "normconv_available", lambda: True)
    net = model.build_model(Settings(device="gpu", input_layout="NHWC", dtype="float16", batch_size=2,
                                     image_shape="3,64,64"))
    graph = net(mx.sym.var("data"))
    assert set(graph.list_inputs()) == {"data"} | set(net.collect_params())
    types = {node["attrs"]["op_type"] for node in json.loads(graph.tojson())["nodes"] if node["op"] == "Custom"}
    assert types == {ngc.op_type(name) for name in ("BatchNorm", "NormConvolution", "NormalizedConvolution",
                                                    "BNStatsFinalize_stats", "BNStatsFinalize", "ScaleBiasAddRelu")}
    assert graph.infer_type(data="float16")[1] == [np.float16]
    assert graph.infer_shape(data=(2, 64, 64, 3))[1] == [(2, 1000)]


def test_nvidias_updater_hands_every_tensor_of_a_dtype_at_once_and_the_optimizers_cut_it(monkeypatch):
    """NVIDIA's Updater makes one update_multi_precision call per dtype (sneaxiy/NVIDIA-MxNet@ce30b18 python/mxnet/
    optimizer/optimizer.py:2208-2220), and its multi-tensor LARS kernels are lars_multi_*, holding 60 tensors
    unchecked (src/operator/lars_multi_sgd-inl.h:156): the stand-in build hands 70 tensors at once and refuses more than
    60 a kernel call. LARS cuts the call into aggregate_num pieces itself, SGD as the fork's does (optimizer.py:
    629-672), and both give stock MXNet's update. LARS called NVIDIA's kernels by stock names before: AttributeError
    on the stand-in build, and 70 tensors a call overran the kernel."""
    rng = np.random.RandomState(0)
    values = [(rng.uniform(-1, 1, (3, 3, 1, 1) if i % 2 else (3,)), rng.uniform(-1, 1, (3, 3, 1, 1) if i % 2 else (3,)))
              for i in range(70)]

    def step(make):
        opt = make()
        opt.aggregate_num = 54
        updater = mx.optimizer.get_updater(opt)
        weights = [nd.array(w, ctx=CTX) for w, _ in values]
        for _ in range(2):
            updater(list(range(70)), [nd.array(g, ctx=CTX) for _, g in values], weights)
        return [w.asnumpy() for w in weights]

    makers = (lambda: optim.LARS(momentum=0.9, eta=0.001, wd=1e-4, learning_rate=0.1),
              lambda: optim.SGD(momentum=0.9, wd=1e-4, learning_rate=0.1))
    stock = [step(make) for make in makers]
    gpu_build.install(monkeypatch)
    assert not hasattr(nd, "preloaded_multi_sgd_mom_update") and "lars_multi_mp_sgd_mom_update" in standin.operators()
    with pytest.raises(mx.MXNetError, match="num_weights=61, more than the 60 tensors"):
        nd.lars_multi_sgd_mom_update(*[nd.zeros((1,))] * (3 * 61 + 2), num_weights=61)
    for make, expected in zip(makers, stock):
        for got, want in zip(step(make), expected):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["sgd", "sgd_mom", "mp_sgd", "mp_sgd_mom"])
def test_the_lars_kernels_give_the_stock_kernel_s_floats_of_one_call(monkeypatch, kind):
    """The stand-in's lars_multi_* compute tensor by tensor (python_layer.lars_kernel: the stock kernel's one call
    visits every tensor at each of its largest tensor's indices): weights, momenta and float32 masters equal, bit for
    bit, those of stock preloaded_multi_* in one call over tensors of unequal sizes, each with its own lr and wd, with
    and without a gradient clip; a call whose inputs do not match num_weights is the stock kernel's own error."""
    rng = np.random.RandomState(0)
    shapes = [(3, 3, 8, 8), (5,), (2, 7), (64,), (1, 1, 16, 8)]
    lrs, wds = rng.uniform(0.01, 1, len(shapes)), rng.uniform(0, 0.1, len(shapes))
    momentum, mixed = kind.endswith("mom"), kind.startswith("mp")
    per_tensor = 2 + momentum + mixed  # weight, gradient[, momentum][, float32 master]

    def tensors(seed):
        draw = np.random.RandomState(seed)
        arrays = []
        for shape in shapes:
            w = draw.uniform(-1, 1, shape)
            arrays.append([nd.array(w, ctx=CTX, dtype="float16" if mixed else "float32"),
                           nd.array(draw.uniform(-3, 3, shape), ctx=CTX, dtype="float16" if mixed else "float32")]
                          + [nd.array(draw.uniform(-1, 1, shape), ctx=CTX)] * momentum + [nd.array(w, ctx=CTX)] * mixed)
        return arrays

    def run(kernel, clip):
        arrays = tensors(1)
        flat = [a for per in arrays for a in per]
        for _ in range(2):
            kernel(*flat, nd.array(lrs, ctx=CTX), nd.array(wds, ctx=CTX), out=[per[0] for per in arrays],
                   num_weights=len(shapes), rescale_grad=0.25, **({"momentum": 0.9} if momentum else {}), **clip)
        return [a.asnumpy() for a in flat]

    clips = ({}, {"clip_gradient": 0.5})
    stock = getattr(nd, f"preloaded_multi_{kind}_update")  # gone from mx.nd once the stand-in build is installed
    wanted = [run(stock, clip) for clip in clips]
    gpu_build.install(monkeypatch)
    fork = getattr(nd, f"lars_multi_{kind}_update")
    for clip, want in zip(clips, wanted):
        for got, expected in zip(run(fork, clip), want):
            np.testing.assert_array_equal(got, expected)
    kwargs = dict(num_weights=1, rescale_grad=0.25, **({"momentum": 0.9} if momentum else {}))
    lr, wd = nd.array(lrs[:1], ctx=CTX), nd.array(wds[:1], ctx=CTX)
    for kernel in (stock, fork):  # without `out`: MXNet 1.9.1's own error, the stock kernel's call either way
        with pytest.raises(mx.MXNetError, match="Unknown type_flag=-1"):
            kernel(*tensors(1)[0], lr, wd, **kwargs).wait_to_read()
    with pytest.raises(mx.MXNetError, match="expects .* inputs, but got"):
        fork(*[nd.zeros((2,), ctx=CTX)] * (per_tensor * 3), nd.ones(3, ctx=CTX), nd.ones(3, ctx=CTX),
             out=[nd.zeros((2,), ctx=CTX)] * 3, num_weights=2, **({"momentum": 0.9} if momentum else {}))
