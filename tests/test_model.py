"""ResNet-50 v1.5: size, names, parameter roles, initialisation, precision, hybridisation, and layouts."""
import dataclasses
import functools
import json
import re
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd
from mxnet.gluon import nn

from rn50_mx import model
from rn50_mx.config import Settings
from tests.support import bad_values, gpu_build, procs
from tests.support.bfloat16 import needs_bfloat16
from tests.support.ngc_ops import NdarrayConvention, NormConvOps, Registry, TraceOps

SMALL = Settings(num_classes=10, image_shape="3,32,32")
NHWC = Settings().replace(device="gpu", input_layout="NHWC")


@pytest.fixture(scope="module")
def net():
    mx.random.seed(0)
    return model.build_model(Settings())


def test_parameter_count_is_torchvision_resnet50(net):
    assert model.count_params(net) == 25_557_032
    four_channels = model.build_model(Settings(image_shape="4,224,224"))
    assert model.count_params(four_channels) - model.count_params(net) == 64 * 7 * 7  # the zero 4th channel


def test_a_model_built_without_draws_has_the_drawn_one_s_parameters_in_zeros_and_leaves_mx_random_alone(net):
    """What the checkpoint check, evaluate --checkpoint-dir and the memory estimate build: the same names, shapes and
    dtypes as the drawn model, every value 0, and MXNet's generator where it was (the drawn build moves it)."""
    def then_drawn(build):
        mx.random.seed(5)
        made = build()
        return made, mx.nd.random.uniform(shape=3).asnumpy()

    bare, after = then_drawn(lambda: model.build_model(Settings(), drawn=False))
    assert np.array_equal(after, then_drawn(lambda: None)[1]) and not np.array_equal(
        after, then_drawn(lambda: model.build_model(SMALL))[1])
    drawn, zero = net.collect_params(), bare.collect_params()
    assert [(p.name, p.shape, p.dtype) for p in drawn.values()] == [(p.name, p.shape, p.dtype) for p in zero.values()]
    assert all(not p.data().asnumpy().any() for p in zero.values())


def test_trainable_tensors_have_the_reference_names(net):
    names = [p.name for p in model.split_params(net)[0] + model.split_params(net)[1]]
    assert len(names) == 161
    assert sum(n.endswith("_weight") and "conv" in n for n in names) == 53
    assert sum(n.endswith("_gamma") for n in names) == sum(n.endswith("_beta") for n in names) == 53
    for name in ("conv0_weight", "bn0_gamma", "stage1_unit1_conv1sc_weight", "stage4_unit1_bnsc_beta",
                 "stage3_unit6_conv3_weight", "fc1_weight", "fc1_bias"):
        assert name in names


def test_roles_split_by_rank_54_lars_107_excluded(net):
    weights, excluded = model.split_params(net)
    assert len(weights) == 53 + 1 and all(len(p.shape) >= 2 for p in weights)
    assert len(excluded) == 53 * 2 + 1 and all(len(p.shape) == 1 for p in excluded)
    assert "fc1_bias" in {p.name for p in excluded}


def test_initialisation_follows_the_reference(net):
    params = net.collect_params()
    conv = params["stage4_unit1_conv2_weight"].data().asnumpy()  # 512 x 512 x 3 x 3, fan-in 4608
    assert conv.std() == pytest.approx(np.sqrt(2 / 4608), rel=0.01)
    assert np.abs(conv).max() > 4 * conv.std()  # a full normal, not truncated at 2 sigma
    fc = params["fc1_weight"].data().asnumpy()
    assert fc.std() == pytest.approx(0.01, rel=0.01) and abs(fc.mean()) < 1e-4
    assert not params["fc1_bias"].data().asnumpy().any()
    for suffix, value in (("gamma", 1), ("beta", 0), ("running_mean", 0), ("running_var", 1)):
        tensors = [p.data().asnumpy() for n, p in params.items() if n.endswith(suffix)]
        assert len(tensors) == 53 and all((t == value).all() for t in tensors)


def test_bn_gamma_init0_zeroes_only_the_last_bn_of_each_unit():
    params = model.build_model(SMALL.replace(bn_gamma_init0=True)).collect_params()
    gammas = {n: p.data().asnumpy() for n, p in params.items() if n.endswith("_gamma")}
    assert sum(not g.any() for g in gammas.values()) == 16
    assert all(not g.any() for n, g in gammas.items() if n.endswith("bn3_gamma"))
    assert all((g == 1).all() for n, g in gammas.items() if not n.endswith("bn3_gamma"))


def test_float16_keeps_batchnorm_in_float32():
    net = model.build_model(SMALL.replace(dtype="float16"))
    dtypes = {n: np.dtype(p.dtype) for n, p in net.collect_params().items()}
    assert {dtypes[n] for n in dtypes if n.startswith("bn") or "_bn" in n} == {np.dtype("float32")}
    assert {dtypes[n] for n in dtypes if "conv" in n or n.startswith("fc1")} == {np.dtype("float16")}
    # MXNet's CPU has no float16 conv, but BatchNorm runs: float16 data updates float32 statistics
    # (MXNet 1.9 moves them in the backward pass).
    bn = net.bn0
    with autograd.record():
        out = bn(nd.random.uniform(1, 2, shape=(2, 64, 4, 4), dtype="float16"))
    out.backward()
    assert out.dtype == np.float16 and bn.running_mean.data().dtype == np.float32
    assert bn.running_mean.data().asnumpy().min() > 0


@pytest.mark.slow
def test_hybridized_forward_equals_imperative():
    x = nd.random.uniform(shape=(2, 3, 32, 32))
    outputs = []
    for hybridize in (False, True):
        mx.random.seed(1)
        net = model.build_model(SMALL)
        if hybridize:
            net.hybridize(static_alloc=True, static_shape=True)
        # Read each output before the next call: with static_alloc, an unread train-mode output was
        # overwritten by the following inference-mode call (measured on MXNet 1.9.1 CPU).
        with autograd.train_mode():
            train = net(x).asnumpy()
        outputs.append((net(x).asnumpy(), train))
    for imperative, hybrid in zip(*outputs):
        np.testing.assert_allclose(hybrid, imperative, rtol=1e-4, atol=1e-5)


def test_nhwc_builds_the_same_network_with_transposed_kernels(net):
    nhwc = model.build_model(NHWC)
    params = nhwc.collect_params()
    assert list(params) == list(net.collect_params())
    assert model.count_params(nhwc) == 25_557_032
    assert params["conv0_weight"].shape == (64, 7, 7, 3)
    assert params["bn0_gamma"].shape == (64,)
    _, out_shapes, _ = nhwc(mx.sym.var("data")).infer_shape(data=(2, 224, 224, 3))
    assert out_shapes == [(2, 1000)]


def test_cpu_convolution_refuses_nhwc():
    """Why the NHWC comparison of the whole network needs a GPU (and why config refuses NHWC on CPU)."""
    x, w = nd.ones((1, 8, 8, 3)), nd.ones((4, 3, 3, 3))
    with pytest.raises(mx.MXNetError):
        nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True, layout="NHWC").wait_to_read()


def test_layout_switch_gives_the_same_bn_relu_pools_on_cpu():
    """The NHWC pieces that MXNet's CPU can run agree with NCHW: BatchNorm(axis=3), max-pool, average pool."""
    x = nd.random.uniform(-1, 1, shape=(2, 64, 8, 8))
    outputs = {}
    for name in ("NCHW", "NHWC"):
        layout = model.Layout(name)
        bn, pool, gap = layout.batchnorm(64, "bn_"), layout.max_pool("pool_"), layout.global_avg_pool("gap_")
        for block in (bn, pool, gap):
            block.initialize()
        data = x if name == "NCHW" else x.transpose((0, 2, 3, 1))
        with autograd.train_mode():
            outputs[name] = gap(pool(nd.relu(bn(data)))).reshape((2, 64))
    np.testing.assert_allclose(outputs["NHWC"].asnumpy(), outputs["NCHW"].asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(mx.context.num_gpus() == 0, reason="MXNet runs NHWC convolutions on GPU only")
def test_nhwc_equals_nchw_on_gpu():
    ctx = mx.gpu(0)
    nchw = model.build_model(SMALL, ctx)
    nhwc = model.build_model(SMALL.replace(device="gpu", input_layout="NHWC"), ctx)
    for (name, src), dst in zip(nchw.collect_params().items(), nhwc.collect_params().values()):
        data = src.data()
        dst.set_data(data.transpose((0, 2, 3, 1)) if "conv" in name else data)
    x = nd.random.uniform(shape=(2, 3, 32, 32), ctx=ctx)
    with autograd.train_mode():
        expected, got = nchw(x), nhwc(x.transpose((0, 2, 3, 1)))
    np.testing.assert_allclose(got.asnumpy(), expected.asnumpy(), rtol=1e-3, atol=1e-4)


def test_fused_batchnorm_is_chosen_by_the_operator_registry():
    stock = mx.operator.get_operator_arguments("BatchNorm").names
    ngc = Registry(stock + ["act_type"], lambda: ["BatchNorm", "BatchNormAddRelu"])
    assert model.fused_batchnorm_available(ngc.arguments_of, ngc.operators)
    half = Registry(stock + ["act_type"], lambda: ["BatchNorm"])
    assert not model.fused_batchnorm_available(half.arguments_of, half.operators)
    assert not model.fused_batchnorm_available()  # this stock MXNet 1.9.1 has neither


def op_counts(net):
    ops = [node["op"] for node in json.loads(net(mx.sym.var("data")).tojson())["nodes"]]
    return {op: ops.count(op) for op in set(ops)}


def test_stock_mxnet_runs_separate_kernels_with_the_same_parameters(net):
    counts = op_counts(net)
    assert counts["BatchNorm"] == 53 and counts["Activation"] == 49 and "BatchNormAddRelu" not in counts


def test_an_nhwc_model_takes_the_fused_kernels_when_the_build_has_them(monkeypatch):
    """The fused path is wired to NGC's operators: this stock MXNet does not know BatchNorm's act_type."""
    monkeypatch.setattr(model, "fused_batchnorm_available", lambda: True)
    nhwc = Settings(device="gpu", input_layout="NHWC", dtype="float16")
    fused = model.build_model(nhwc)
    assert fused.bn0.fused and fused.stages[0][0].bn3.fused
    with pytest.raises(mx.MXNetError, match="act_type"):
        fused(mx.sym.var("data"))
    assert not model.build_model(nhwc.replace(fused_bn=False)).bn0.fused
    assert not model.build_model(Settings()).bn0.fused  # NCHW (CPU): never


def test_the_fused_batchnorm_kernels_take_float16_only(monkeypatch):
    """GPU review 4, F1: NVIDIA's fork stops at a BatchNorm(act_type='relu') that its NHWC kernel does not take,
    and that kernel takes float16 only (batch_norm.cu:1110-1114, nhwc_batch_norm-inl.h:296-308): NHWC float32, the
    batch schedule's way out of its float16 refusal, must run separate kernels."""
    stock = mx.operator.get_operator_arguments("BatchNorm").names
    ngc = Registry(stock + ["act_type"], lambda: ["BatchNorm", "BatchNormAddRelu"])
    monkeypatch.setattr(model, "fused_batchnorm_available",
                        functools.partial(model.fused_batchnorm_available, ngc.arguments_of, ngc.operators))
    for dtype, count in (("float32", 0), ("float16", 49)):
        blocks = []
        model.build_model(NHWC.replace(dtype=dtype, num_classes=10)).apply(blocks.append)
        assert sum(isinstance(b, model.BatchNormReLU) and b.fused for b in blocks) == count, dtype


def two_units(layout, batch_hw):
    """A projection unit with stride 2, then an identity unit: every wiring the network's 16 units use."""
    stage = nn.HybridSequential(prefix="stage1_")
    with stage.name_scope():
        stage.add(model.Bottleneck(layout, 32, 16, 2, True, False, "unit1_", batch_hw[1:]),
                  model.Bottleneck(layout, 64, 16, 1, False, False, "unit2_", model.shrink(batch_hw[1:], 2)))
    stage.initialize()
    return stage


def fused_forward(stage, x):
    """The units' NormConv wiring, run imperatively on the stand-ins (what the traced graph computes)."""
    for unit in stage:
        x = unit.normconv_forward(nd, NormConvOps, x)
    return x


@pytest.mark.parametrize("wiring", model.WIRINGS)
def test_normconv_units_equal_plain_units_on_the_same_weights(wiring):
    """Each NormConv wiring (NHWC, through NormConvOps) against conv -> BN -> ReLU (NCHW, stock MXNet): outputs,
    every gradient, and the running statistics after a training step; then inference on those statistics."""
    n, h, w = 4, 9, 9  # odd: the stride-2 units' pixel counts round up
    plain = two_units(model.Layout("NCHW"), (n, h, w))
    fused = two_units(model.Layout("NHWC", normconv_batch=n, wiring=wiring, ops=NormConvOps), (n, h, w))
    rng = np.random.RandomState(0)
    for (name, p), q in zip(plain.collect_params().items(), fused.collect_params().values()):
        value = p.data()
        if name.endswith(("gamma", "beta", "running_mean")):
            value = nd.array(rng.uniform(-1, 1, p.shape) + (name.endswith("gamma")))
        elif name.endswith("running_var"):
            value = nd.array(rng.uniform(0.5, 2, p.shape))
        p.set_data(value)
        q.set_data(value.transpose((0, 2, 3, 1)) if value.ndim == 4 else value)
    x = nd.array(rng.uniform(-1, 1, (n, 32, h, w)))
    head = nd.array(rng.uniform(-1, 1, (n, 64, 5, 5)))
    results = []
    for net, run, to_net, from_net in (
            (plain, plain, lambda a: a, lambda a: a),
            (fused, lambda a: fused_forward(fused, a), lambda a: a.transpose((0, 2, 3, 1)),
             lambda a: a.transpose((0, 3, 1, 2)))):
        data = to_net(x)
        data.attach_grad()
        with autograd.record():
            out = run(data)
            loss = (from_net(out) * head).sum()
        loss.backward()
        params = net.collect_params()
        grads = {k: from_net(p.grad()) if p.grad().ndim == 4 else p.grad()
                 for k, p in params.items() if p.grad_req != "null"}
        stats = {k: p.data().copy() for k, p in params.items() if p.grad_req == "null"}
        results.append(dict(out=from_net(out), dx=from_net(data.grad), grads=grads, stats=stats,
                            infer=from_net(run(data))))
    plain_r, fused_r = results
    close = dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fused_r["out"].asnumpy(), plain_r["out"].asnumpy(), **close)
    np.testing.assert_allclose(fused_r["dx"].asnumpy(), plain_r["dx"].asnumpy(), **close)
    assert len(plain_r["grads"]) == 7 + 7 * 2  # 4 + 3 convolutions, 7 BatchNorms' gamma and beta
    for name, grad in plain_r["grads"].items():
        assert np.abs(grad.asnumpy()).max() > 0, name
        np.testing.assert_allclose(fused_r["grads"][name].asnumpy(), grad.asnumpy(), err_msg=name, **close)
    assert len(plain_r["stats"]) == 14
    for name, value in plain_r["stats"].items():
        np.testing.assert_allclose(fused_r["stats"][name].asnumpy(), value.asnumpy(), err_msg=name, **close)
    np.testing.assert_allclose(fused_r["infer"].asnumpy(), plain_r["infer"].asnumpy(), **close)


def test_an_imperative_normconv_unit_runs_the_unfused_layers():
    """GPU review 3, F3: the fused operators cannot run as NDArray functions (NormConvolution declares no `weight`),
    so a NormConv network run without hybridizing (bench/scaling.py did) must take the unfused layers: the same
    output as plain units on the same weights. The old units called the fused ops and were refused. (NCHW: this
    MXNet runs no NHWC convolution on the CPU; which path an imperative call takes does not depend on the layout.)"""
    n, h, w = 4, 9, 9
    plain = two_units(model.Layout("NCHW"), (n, h, w))
    fused = two_units(model.Layout("NCHW", normconv_batch=n, ops=NdarrayConvention()), (n, h, w))
    for p, q in zip(plain.collect_params().values(), fused.collect_params().values()):
        q.set_data(p.data())
    x = nd.array(np.random.RandomState(1).uniform(-1, 1, (n, 32, h, w)))
    with autograd.train_mode():
        np.testing.assert_array_equal(fused(x).asnumpy(), plain(x).asnumpy())


def test_normconv_is_chosen_by_the_registry_for_nhwc_float16_only(monkeypatch):
    """The whole network with NormConv units keeps today's 161 trainable tensors (names, shapes, the 54/107 split)
    and counts each unit's statistics over the batch's pixels at that unit; the traced graph calls the registry's
    NormConvolution (which this stock MXNet lacks)."""
    assert not model.normconv_available()
    assert model.normconv_available(lambda: ["Convolution"] + list(model.NORMCONV_OPERATORS))
    monkeypatch.setattr(model, "normconv_available", lambda: True)
    gpu = Settings(device="gpu", input_layout="NHWC", dtype="float16", batch_size=8, fused_bn=False)
    net = model.build_model(gpu)
    units = [unit for stage in net.stages for unit in stage]
    assert {unit.batch for unit in units} == {8}
    assert (units[0].in_pixels, units[0].out_pixels) == (8 * 56 * 56, 8 * 56 * 56)
    assert (units[3].in_pixels, units[3].out_pixels) == (8 * 56 * 56, 8 * 28 * 28)
    assert (units[-1].in_pixels, units[-1].out_pixels) == (8 * 7 * 7, 8 * 7 * 7)
    plain = model.build_model(gpu.replace(normconv=False))
    shapes = lambda n: [(k, p.shape, p.grad_req) for k, p in n.collect_params().items()]  # noqa: E731
    assert shapes(net) == shapes(plain)
    assert [len(group) for group in model.split_params(net)] == [54, 107]
    with pytest.raises(AttributeError, match="NormConvolution"):
        net(mx.sym.var("data"))
    assert not plain.stages[0][0].batch
    assert not model.build_model(gpu.replace(dtype="float32")).stages[0][0].batch  # the kernels are float16 only
    assert not model.build_model(Settings()).stages[0][0].batch  # NCHW (CPU): never


def test_traced_normconv_graph_takes_every_parameter_by_its_name(monkeypatch):
    """The symbol the hybridized network runs hands the fused operators this network's own variables: its inputs
    are the data and exactly the parameters (weights, gammas, betas, running statistics) by name."""
    monkeypatch.setattr(model, "normconv_available", lambda: True)
    net = model.build_model(Settings(device="gpu", input_layout="NHWC", dtype="float16", fused_bn=False))
    for stage in net.stages:
        for unit in stage:
            unit.ops = TraceOps()
    graph = net(mx.sym.var("data"))
    assert set(graph.list_inputs()) == {"data"} | set(net.collect_params())
    assert {node["op"] for node in json.loads(graph.tojson())["nodes"]} >= {"Convolution", "BatchNorm", "sum"}


class Recorder:
    """NVIDIA's NormConv operators as a traced unit calls them: each call recorded as (operator, {input: the name of
    what feeds it}, {parameter: value}), its outputs new variables '<call number>.<output>' named after the fork's
    FListOutputNames (norm_convolution.cc:442-446, normalized_convolution.cc:413-416, bn_stats_finalize.cc:235-238,
    scale_bias_add_relu.cc:297-300)."""
    OUTPUTS = {"NormConvolution": ("output", "sum", "sum_squares"),
               "NormalizedConvolution": ("output", "sum", "sum_squares"),
               "BNStatsFinalize": ("equiv_scale", "equiv_bias", "mean", "var", "gamma_out", "beta_out"),
               "ScaleBiasAddRelu": ("output", "bitmask")}

    def __init__(self):
        self.calls = []

    def __getattr__(self, op):
        if op not in self.OUTPUTS:
            raise AttributeError(op)

        def call(**kwargs):
            arrays = {k: v.name for k, v in kwargs.items() if isinstance(v, mx.sym.Symbol)}
            self.calls.append((op, arrays, {k: v for k, v in kwargs.items() if k not in arrays}))
            return [mx.sym.var(f"{len(self.calls)}.{out}") for out in self.OUTPUTS[op]]
        return call


def traced_unit(wiring, projection, batch=8, in_hw=(14, 14)):
    """The calls a NormConv unit of `wiring` makes while traced (a stage-4 unit: 1024 or 2048 channels in, width 512,
    the projection with stride 2)."""
    ops = Recorder()
    layout = model.Layout("NHWC", normconv_batch=batch, wiring=wiring, ops=ops)
    in_channels, stride = (1024, 2) if projection else (2048, 1)
    model.Bottleneck(layout, in_channels, 512, stride, projection, False, "unit_", in_hw)(mx.sym.var("data"))
    return ops.calls


def nvidia_mainloop_unit(projection, batch=8, in_hw=(14, 14)):
    """NVIDIA's unit in its resnet-v1b-mainloop-fl wiring, call by call, transcribed from
    mlcommons/training_results_v4.0@62f111b NVIDIA/benchmarks/resnet/implementations/eos_ngc24.04_mxnet/symbols/
    resnet-v1b-mainloop-fl.py (the line of each call; fuse_bn_add_relu on, as its run_and_time.sh:128 sets it) for
    the unit traced_unit traces: the dataflow inputs as NVIDIA's file passes them, then, where its node makes its
    own variables (<name>_weight, <name>_gamma, ...), the parameters of ours that play their part (convbn2's gamma
    is the BatchNorm after conv1: NormConvolution applies the statistics of its input)."""
    stride, width, out_channels = (2, 512, 2048) if projection else (1, 512, 2048)
    elem = batch * (in_hw[0] // stride) * (in_hw[1] // stride)  # element_count(), :162-164 and :238, :256

    def geometry(k, s, f):
        return dict(kernel=(k, k), stride=(s, s), pad=((k - 1) // 2,) * 2, num_filter=f, layout="NHWC")

    def own(conv, bn=None):
        names = {"weight": f"unit_{conv}_weight"}
        if bn:
            names.update({k: f"unit_{bn}_{v}" for k, v in (("gamma", "gamma"), ("beta", "beta"),
                                                           ("moving_mean", "running_mean"),
                                                           ("moving_var", "running_var"))})
        return names

    def stats_of(bn):
        return {k: f"unit_{bn}_{v}" for k, v in (("gamma", "gamma"), ("beta", "beta"), ("moving_mean", "running_mean"),
                                                 ("moving_var", "running_var"))}

    def applied(side, call):  # ScaleBiasAddRelu's statistics inputs from BNStatsFinalize's outputs, :76-81, :91-94
        return {f"{side}_{k}": f"{call}.{v}" for k, v in (("equiv_scale", "equiv_scale"), ("equiv_bias", "equiv_bias"),
                                                          ("gamma", "gamma_out"), ("beta", "beta_out"),
                                                          ("mean", "mean"), ("invvar", "var"))}

    finalize = dict(eps=1e-5, momentum=0.9, fix_gamma=False)
    calls = [
        (210, "NormConvolution", {"data": "data", **own("conv1")},
         dict(no_norm=True, act_type=None, **geometry(1, 1, width))),
        (221, "NormConvolution", {"data": "1.output", "in_sum": "1.sum", "in_sum_squares": "1.sum_squares",
                                  **own("conv2", "bn1")},
         dict(no_norm=False, act_type="relu", **geometry(3, stride, width), **finalize)),
        (232, "NormConvolution", {"data": "2.output", "in_sum": "2.sum", "in_sum_squares": "2.sum_squares",
                                  **own("conv3", "bn2")},
         dict(no_norm=False, act_type="relu", **geometry(1, 1, out_channels), **finalize)),
        (240, "BNStatsFinalize", {"sum": "3.sum", "sum_squares": "3.sum_squares", **stats_of("bn3")},
         dict(output_mean_var=True, elem_count=elem, **finalize)),
    ]
    if not projection:  # :245-246 shortcut = data; :291-294 -> scale_bias_add_relu, :91-96
        return calls + [(91, "ScaleBiasAddRelu", {"dataX": "3.output", "dataZ": "data", **applied("x", 4)},
                         dict(dual_scale_bias=False, fused_add=True, layout="NHWC", act_type="relu"))]
    return calls + [
        (252, "NormalizedConvolution", {"data": "data", **own("conv1sc")},
         dict(no_equiv_scale_bias=True, act_type=None, **geometry(1, stride, out_channels))),
        (258, "BNStatsFinalize", {"sum": "5.sum", "sum_squares": "5.sum_squares", **stats_of("bnsc")},
         dict(output_mean_var=True, elem_count=elem, **finalize)),
        (76, "ScaleBiasAddRelu", {"dataX": "3.output", "dataZ": "5.output", **applied("x", 4), **applied("z", 6)},
         dict(layout="NHWC", act_type="relu")),  # :284-289 -> dual_scale_bias_add_relu: the fork's default flags
    ]


@pytest.mark.parametrize("projection", [False, True], ids=["identity", "projection"])
def test_the_mainloop_wiring_calls_nvidias_operators_as_its_v4_0_symbol_file_line_by_line(projection):
    """Issue 47 item 5: the second NormConv wiring, NVIDIA's own on the 24.04 image (resnet-v1b-mainloop-fl; the v4.0
    results publish the Python that builds the symbol, no symbol JSON), traced: its calls, in order, are NVIDIA's,
    each with the same operator, the same inputs from the same producers (and, for the variables NVIDIA's nodes
    make, this unit's own parameters), and exactly the same parameters."""
    ours, theirs = traced_unit("mainloop-fl", projection), nvidia_mainloop_unit(projection)
    assert len(ours) == len(theirs), [c[0] for c in ours]
    for (op, arrays, params), (line, want_op, want_arrays, want_params) in zip(ours, theirs):
        assert (op, arrays, params) == (want_op, want_arrays, want_params), f"resnet-v1b-mainloop-fl.py:{line}"


@pytest.mark.parametrize("wiring", model.WIRINGS)
def test_each_wiring_hands_each_operator_the_parameters_model_names_for_it(wiring):
    """The self-test's `fused operators` row requires of an image the parameters the network passes
    (model.NORMCONV_PARAMETERS, GPU review 6, F3): they are those the traced units pass, no more, no fewer."""
    passed = {}
    for projection in (False, True):
        for op, _, params in traced_unit(wiring, projection):
            passed.setdefault(op, set()).update(params)
    assert passed == {op: set(names) for op, names in model.NORMCONV_PARAMETERS[wiring].items()}
    assert model.WIRINGS == tuple(model.NORMCONV_PARAMETERS) == ("stats-fl", "mainloop-fl")


@pytest.mark.parametrize("then", ["relu", "add_relu"])
def test_the_fused_blocks_run_under_nvidias_gluon(monkeypatch, then):
    """GPU review 5, F1 and F2, on the stand-in build, which now gives Gluon NVIDIA's BatchNorm `_kwargs` (act_type
    None, bn_group, xbuf_ptr: standin/python_layer.py) and passes a None keyword on as MXNet does. F1: the BN-ReLU
    block passed act_type twice ("got multiple values for keyword argument 'act_type'"); F2: the BN-add-ReLU block
    handed act_type=None to BatchNormAddRelu, which has no act_type ("Cannot find argument 'act_type'")."""
    ctx = gpu_build.install(monkeypatch)
    block = model.Layout("NHWC", fused=True).batchnorm(32, "bn_", then=then)
    assert block._kwargs["act_type"] is None and block._kwargs["bn_group"] == 1 and block._kwargs["xbuf_ptr"] == 0
    block.initialize(ctx=ctx)
    block.cast("float16")
    block.hybridize(static_alloc=True, static_shape=True)
    x = nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 4, 4, 32)), ctx=ctx, dtype="float16")
    with autograd.train_mode():
        out = block(x) if then == "relu" else block(x, x)
    assert out.dtype == np.float16 and out.shape == x.shape and out.min().asscalar() == 0 < out.max().asscalar()


def graph_of(symbol, **shapes):
    """[(op, name, [input node names], [control dependencies])] of the forward and backward graph MXNet makes for
    `symbol` (an executor's debug_str; nnvm's gradient pass, as a hybridized block's CachedOp runs it)."""
    graph = []
    for block in symbol.simple_bind(mx.cpu(), **shapes).debug_str().split("--------------------"):
        head = re.search(r"Op:(\S+), Name=(\S+)", block)
        if head:
            graph.append((head[1], head[2], re.findall(r"arg\[\d+\]=(\S+?)\(", block),
                          re.findall(r"cdep\[\d+\]=(\S+)", block)))
    return graph


@pytest.mark.parametrize("path", ["plain", "fused BatchNorm", "NormConv"])
@pytest.mark.parametrize("projection", [False, True], ids=["identity", "projection"])
def test_conv1s_data_gradient_is_the_later_input_of_the_unit_inputs_gradient_sum(monkeypatch, path, projection):
    """Under MXNET_EXEC_ENABLE_ADDTO=1 NVIDIA's MXNet gives a two-way gradient sum's later producer kAddTo
    (sneaxiy/NVIDIA-MxNet@ce30b18 src/executor/inplace_addto_detect_pass.cc:72-81), which only the convolutions honour:
    NhwcBatchNorm(AddRelu) and ScaleBiasAddRelu overwrite. A unit's input feeds conv1 and the shortcut (the addend,
    ScaleBiasAddRelu's dataZ, or conv1sc): conv1's data gradient must stay the sum's later input (GPU review 5,
    section 5 item 3). nnvm's gradient pass orders the sum as the forward graph's depth-first order does, which
    the joining operator's inputs set (the main branch first), not the order of the calls: checked on each path,
    stock (NCHW float32), and on the stand-in build NHWC float16 with the fused BatchNorm and with NormConv units
    (the shortcut first as the add's input, `addend + y`, fails the plain projection unit)."""
    monkeypatch.setenv("MXNET_SUBGRAPH_BACKEND", "NONE")  # oneDNN's fusions would rename the forward nodes
    layout, dtype = model.Layout("NCHW"), "float32"
    if path != "plain":
        gpu_build.install(monkeypatch)
        layout, dtype = model.Layout("NHWC", fused=True, normconv_batch=2 if path == "NormConv" else 0), "float16"
    channels, width = (32, 32) if projection else (64, 16)
    unit = model.Bottleneck(layout, channels, width, 1, projection, False, "unit_", (4, 4))
    unit.initialize()
    unit.cast(dtype)
    shape = (2, channels, 4, 4) if layout.name == "NCHW" else (2, 4, 4, channels)
    graph = graph_of(unit(mx.sym.relu(mx.sym.var("data", dtype=dtype), name="pre")), data=shape,
                     type_dict={"data": dtype})
    nodes = {(op.startswith("_backward"), name): (op, inputs, deps) for op, name, inputs, deps in graph}
    total = (True, "pre_backward")  # relu's backward reads the sum of its output's gradients, here or through the
    while nodes[total][0] not in ("add_n", "ElementWiseSum"):  # one cast of the stand-in's twins (deduplicated)
        total = next(key for key in nodes if key[1] == nodes[total][1][0])
    terms = nodes[total][1]
    forward = [nodes[True, term][2][0] for term in terms]  # each term's backward node depends on its forward node
    conv1 = [name for (back, name), (_, inputs, _) in nodes.items()
             if not back and (name.startswith("unit_conv1_") or "unit_conv1_weight" in inputs)]
    assert len(terms) == 2 and forward[1] in conv1 and forward[0] not in conv1, (terms, forward, conv1)


def test_a_gpu_whose_normconv_kernels_refuse_stops_the_build_in_one_line_naming_the_setting(monkeypatch):
    """GPU review 5, section 4: on a GPU that NVIDIA's NormConv kernels do not list (here the stand-in build as SM 89:
    ngc.NORMCONV_SM), the model's build runs them once and stops in one line naming RN50_NORMCONV=0, before the
    warm-up's first forward would end in MXNet's error; with RN50_NORMCONV=0 it builds, the fused BatchNorm kept."""
    from rn50_mx.errors import InputError

    ctx = gpu_build.install(monkeypatch, sm=89)
    s = Settings(device="gpu", input_layout="NHWC", dtype="float16", batch_size=2, image_shape="4,32,32",
                 num_classes=4, standin="gpu", standin_sm=89)
    with pytest.raises(InputError, match=r"^NVIDIA's NormConv kernels do not run on this GPU \(No fallback impl for "
                                         r"unsupported NormConvolution configuration\.\): set RN50_NORMCONV=0$"):
        model.build_model(s, ctx)
    assert model.build_model(s.replace(normconv=False), ctx).bn0.fused


def test_the_probe_runs_the_networks_own_units_at_its_smallest_maps_and_the_per_rank_batch():
    """GPU review 6, item 2: the probe ran batch 2 on 4x4 maps of 32 channels, stride 1, shapes the network never
    runs, so a refusal of it was not a refusal of the run (nor its pass a pass: F1). Now it runs the network's own
    blocks: bn0 on the stem's map, and the last stage's projection (stride 2) and identity units, at the smallest
    maps and the configured per-rank batch (NF5688M6: 408 images of 224 px)."""
    layout = model.Layout("NHWC", fused=True, normconv_batch=408, wiring="mainloop-fl")
    net = model.ResNet50V15(layout, 1000, 4, image_hw=(224, 224))
    blocks = model.probe_blocks(layout, 408, (224, 224))
    assert [(setting, shape) for setting, _, shape in blocks] == [
        ("RN50_FUSED_BN", (408, 112, 112, 64)), ("RN50_NORMCONV", (408, 14, 14, 1024)),
        ("RN50_NORMCONV", (408, 7, 7, 2048))]
    assert blocks[0][1].fused and blocks[0][1]._kwargs == net.bn0._kwargs
    for (_, probe, _), unit in zip(blocks[1:], net.stages[-1]):
        assert (probe.batch, probe.wiring, probe.in_pixels, probe.out_pixels) == (unit.batch, unit.wiring,
                                                                                  unit.in_pixels, unit.out_pixels)
        for name in ("conv1", "conv2", "conv3", "conv1sc"):
            theirs = getattr(unit, name)
            assert (getattr(probe, name) and getattr(probe, name)._kwargs) == (theirs and theirs._kwargs), name
    assert [shape for _, _, shape in model.probe_blocks(model.Layout("NHWC", fused=True), 4, (64, 64))] == [
        (4, 32, 32, 64), (4, 4, 4, 1024), (4, 2, 2, 2048)]  # fused BatchNorm only: the units' fused blocks


def test_the_build_probes_the_units_as_the_run_will_and_a_volta_gets_one_line_naming_rn50_normconv_0(monkeypatch):
    """GPU review 6, F1: on SM 70 the fork refuses the 1x1 stride-2 projection shortcut of stages 2-4; the old probe
    (one stride-1 unit) passed, and a V100 died at the warm-up's first forward with MXNet's traceback. Now the build
    runs the stage-4 units at the configured batch (the stand-in's NormConv saw its inputs at those shapes, on SM 80)
    and its probe stops on SM 70 in one line naming RN50_NORMCONV=0 (both wirings run that shortcut); without
    NormConv the probe passes, the fused BatchNorm kept."""
    from rn50_mx.errors import InputError
    from rn50_mx.standin import ngc

    ctx = gpu_build.install(monkeypatch)
    seen = []
    check = ngc.NormConv.check
    monkeypatch.setattr(ngc.NormConv, "check", lambda self, x: (seen.append(x.shape), check(self, x))[1])
    s = Settings(device="gpu", input_layout="NHWC", dtype="float16", batch_size=3, image_shape="4,64,64",
                 num_classes=4, standin="gpu")
    model.build_model(s, ctx)
    assert (3, 4, 4, 1024) in seen and (3, 2, 2, 2048) in seen and (2, 4, 4, 32) not in seen, sorted(set(seen))
    monkeypatch.setitem(ngc.GPU, "sm", 70)
    for wiring in model.WIRINGS:  # what build_model runs once the network is built
        with pytest.raises(InputError, match=r"^NVIDIA's NormConv kernels do not run on this GPU \(Only cudnn-based "
                                             r"NormalizedConvolution supported\.\): set RN50_NORMCONV=0$"):
            model.check_fused_kernels(model.Layout("NHWC", fused=True, normconv_batch=3, wiring=wiring), 3, (64, 64),
                                      ctx)
    assert model.check_fused_kernels(model.Layout("NHWC", fused=True), 3, (64, 64), ctx) is None


def test_a_gpu_that_refuses_one_wiring_is_told_the_other_before_rn50_normconv_0(monkeypatch):
    """Issue 47 item 5: where an image refuses the configured NormConv wiring and runs the other, the build's one
    line names RN50_NORMCONV_WIRING before RN50_NORMCONV=0 (here a stand-in NormalizedConvolution that refuses 3x3
    kernels: stats-fl's conv2, which mainloop-fl runs as a NormConvolution); the other wiring's probe passes."""
    from rn50_mx.errors import InputError
    from rn50_mx.standin import ngc

    ctx = gpu_build.install(monkeypatch)
    check = ngc.NormalizedConv.check

    def no_3x3(self, x):
        if self.p["kernel"] == (3, 3):
            ngc.refuse("Only cudnn-based NormalizedConvolution supported.")
        check(self, x)
    monkeypatch.setattr(ngc.NormalizedConv, "check", no_3x3)
    layout = model.Layout("NHWC", fused=True, normconv_batch=2)
    with pytest.raises(InputError, match=r"^NVIDIA's NormConv kernels refuse the stats-fl wiring on this GPU \(Only "
                                         r"cudnn-based NormalizedConvolution supported\.\): set "
                                         r"RN50_NORMCONV_WIRING=mainloop-fl, which runs here, or RN50_NORMCONV=0$"):
        model.check_fused_kernels(layout, 2, (64, 64), ctx)  # as build_model runs it
    mainloop = dataclasses.replace(layout, wiring="mainloop-fl")
    assert model.check_fused_kernels(mainloop, 2, (64, 64), ctx) is None


def test_the_wiring_is_a_setting_checked_like_the_others():
    """RN50_NORMCONV_WIRING (--normconv-wiring): stats-fl by default (the v1.0 submission's), mainloop-fl, nothing
    else; a bad value is one line naming where it came from."""
    from rn50_mx import config

    assert config.load([], {}).normconv_wiring == "stats-fl"
    assert config.load([], {"RN50_NORMCONV_WIRING": "mainloop-fl"}).normconv_wiring == "mainloop-fl"
    assert config.load(["--normconv-wiring", "stats-fl"], {"RN50_NORMCONV_WIRING": "mainloop-fl"}).normconv_wiring \
        == "stats-fl"
    cases = [([], {"RN50_NORMCONV_WIRING": "mainloop"}, "RN50_NORMCONV_WIRING='mainloop': must be one of stats-fl, "
                                                        "mainloop-fl"),
             ([], {"RN50_NORMCONV_WIRNG": "mainloop-fl"}, "RN50_NORMCONV_WIRNG: unknown variable; did you mean "
                                                          "RN50_NORMCONV_WIRING?")]
    for value in bad_values.NAMES.values():  # the empty variable is unset: the default
        cases += [([], {"RN50_NORMCONV_WIRING": value}, "RN50_NORMCONV_WIRING=") if value else ([], {}, None),
                  ([f"--normconv-wiring={value}"], {}, "--normconv-wiring")]
    for argv, environ, words in cases:
        if words is None:
            assert config.load(argv, environ).normconv_wiring == "stats-fl"
            continue
        with pytest.raises(config.SettingsError) as refused:
            config.load(argv, environ)
        message = str(refused.value)
        assert message.startswith(words) and "\n" not in message, message
    assert config.FIELDS["normconv_wiring"].metadata["choices"] == model.WIRINGS


STEM_STEP = """
import mxnet as mx
from rn50_mx import model
from rn50_mx.config import Settings
net = model.build_model(Settings(num_classes=10, image_shape="3,32,32", dtype="bfloat16"))
net.hybridize(static_alloc=True, static_shape=True)
x = mx.nd.random.uniform(shape=(8, 3, 32, 32))
with mx.autograd.record():
    y = net(x)
y.backward()
mx.nd.waitall()
print("GRAD", net.conv0.weight.grad().shape)
"""


@needs_bfloat16
def test_the_bfloat16_stem_runs_onednns_jit_kernels():
    """Issue 51: in bfloat16 conv0 (3 input channels, padded to 4 inside the graph) runs oneDNN's jit convolution,
    whose blocked output keeps bn0 on the jit BatchNorm, not the gemm path and the generic plain-layout BatchNorm
    (ncsp_bnorm, 25 + 47 ms a step on one thread at the demo's shape); the parameter keeps its 3 channels."""
    result = procs.run([sys.executable, "-c", STEM_STEP], env={"DNNL_VERBOSE": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    executed = [line.split(",") for line in result.stdout.splitlines() if line.startswith("dnnl_verbose,exec")]
    conv0 = [f for f in executed if f[3] == "convolution" and f[5] == "forward_training" and "oc64_ih32" in f[-2]]
    assert conv0 and all(f[4].startswith("jit") and "_ic4oc64_" in f[-2] for f in conv0), conv0
    assert not [f for f in executed if f[3] == "batch_normalization" and not f[4].startswith("bnorm_jit")]
    assert "GRAD (64, 3, 7, 7)" in result.stdout


@needs_bfloat16
def test_the_padded_stem_computes_the_three_channel_convolution():
    """conv0 with its zero channel and without, on the same bfloat16 weights and images: the same outputs and
    weight gradients up to bfloat16's rounding (the two oneDNN kernels sum in other orders)."""
    outs = {}
    for even in (True, False):
        mx.random.seed(3)
        conv = model.Layout().conv(64, 7, 2, 3, 3, "conv0_", block=model.StemConv)
        conv.initialize()
        conv.cast(model.BFLOAT16)
        conv.even_channels = even
        x = nd.random.uniform(shape=(4, 3, 32, 32)).astype(model.BFLOAT16)
        with autograd.record():
            y = conv(x)
        y.backward(nd.ones_like(y))
        outs[even] = [nd.amp_cast(a, dtype="float32").asnumpy() for a in (y, conv.weight.grad())]  # astype fails
        # on an array in oneDNN's blocked layout (the padded convolution's output): "The size of NDArray doesn't
        # match the requested MKLDNN memory desc"
    for padded, plain in zip(outs[True], outs[False]):
        np.testing.assert_allclose(padded, plain, rtol=2e-2, atol=1e-2)
    assert outs[True][1].shape == (64, 3, 7, 7)


def stage_and_unit(name):
    """(stage, unit) of a bottleneck's parameter name (stage3_unit5_conv1_weight: (3, 5)); None for the stem's and
    fc's."""
    found = re.match(r"stage(\d)_unit(\d+)_", name)
    return found and (int(found[1]), int(found[2]))


@pytest.mark.parametrize("layers", [14, 26])
def test_fewer_layers_are_resnet_50_s_first_units_of_each_stage(net, layers):
    """--num-layers 14 and 26 (the tests' and the rehearsal's shrunk runs) build ResNet-50's code with 1 and 2 units a
    stage: each of their parameters is ResNet-50's of that name and shape, and what they lack is exactly the later
    units."""
    small = model.build_model(Settings(num_layers=layers), drawn=False)
    units = model.UNITS[layers]
    assert [len(stage) for stage in small.stages] == list(units)
    ours = {p.name: p.shape for p in small.collect_params().values()}
    resnet50 = {p.name: p.shape for p in net.collect_params().values()}
    assert all(resnet50[name] == shape for name, shape in ours.items())
    later = {name for name in resnet50 if (at := stage_and_unit(name)) and at[1] > units[at[0] - 1]}
    assert set(resnet50) - set(ours) == later and later
