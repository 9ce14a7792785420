"""ResNet-50 v1.5 as a Gluon HybridBlock, its initialisation, and the parameter roles LARS and weight decay use.

The network is the reference's `resnet-v1b-stats-fl` symbol (symbols/resnet-v1b-stats-fl.py) with the cuDNN NormConv
fusions unfolded into plain conv -> BN -> ReLU, which computes the same thing. Where the running MXNet has fused
BatchNorm kernels (NGC builds: BatchNorm with act_type='relu', and BatchNormAddRelu) and the layout is NHWC, BN -> ReLU
and BN -> add -> ReLU each run as one kernel, saving passes over every activation; stock MXNet, which has neither, runs
them as separate operators. Where it also has NVIDIA's NormConv operators and the network is NHWC float16, each
bottleneck runs as one of NVIDIA's NormConv wirings does (RN50_NORMCONV_WIRING: the reference's stats-fl, or the
mainloop-fl of NVIDIA's 24.04 runs; see Bottleneck.normconv_forward and docs/faithful-to-the-submission.md).
Either way the parameters and their names are the same. Parameter names are the reference's (`conv0_weight`,
`stage1_unit1_conv1sc_weight`, `fc1_bias`, ...), so the 161 trainable tensors can be logged under the names the MLPerf
checkers know.

What MXNet 1.9.1 on CPU can run (measured): NCHW in float32, and in bfloat16 where the CPU has the instructions
(oneDNN). Conv2D with layout NHWC fails (MKLDNN: "could not create a descriptor"; without MKLDNN: "Only support NCW,
NCHW and NCDHW layout"), and float16 Conv2D / Dense fail too ("FP16 gemm on cpu not implemented"). BatchNorm(axis=3)
and NHWC pooling do run. NHWC and float16 are the GPU path, bfloat16 the CPU's: the same code, switched by `Layout`
and `net.cast`.
"""
import dataclasses

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn

from . import config, standin
from .errors import InputError, one_line

# MXNet's bfloat16 (type code 12): NumPy has no such type, MXNet names it by a structured dtype (mxnet/ndarray/
# ndarray.py, _DTYPE_MX_TO_NP), which its operators and NDArray.astype take.
BFLOAT16 = mx.ndarray.ndarray._DTYPE_MX_TO_NP[12]
# The low-precision types: the network computes in them, BatchNorm, the loss and the optimizer's master weights stay
# float32.
LOW_PRECISION = (np.dtype(np.float16), BFLOAT16)


def mx_dtype(name):
    """The dtype MXNet takes for a DTYPE value (`float32`, `float16`, `bfloat16`)."""
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def is_low_precision(dtype):
    """Whether `dtype` trains with float32 BatchNorm and master weights (see LOW_PRECISION)."""
    return np.dtype(dtype) in LOW_PRECISION


# (bottleneck width, stride of the first unit) per stage; each unit outputs 4 x width channels.
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))
# Units per stage by depth (--num-layers: 3 layers a unit, the stem and fc): every depth has each stage's projection
# unit, 26 and 50 an identity unit after it too.
UNITS = {14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3)}
EXPANSION = 4
STEM_CHANNELS = 64


def fused_batchnorm_available(arguments_of=standin.operator_arguments, operators=standin.operators):
    """Whether this MXNet build has both fused BatchNorm kernels, judged by its operator registry (not by a
    version string): BatchNorm taking act_type, and BatchNormAddRelu. The arguments are the registry's
    functions (this build's, with the stand-in build's operators when a rehearsal installed them), so a test can
    present another build's registry."""
    return "act_type" in arguments_of("BatchNorm").names and "BatchNormAddRelu" in operators()


NORMCONV_OPERATORS = ("NormConvolution", "NormalizedConvolution", "BNStatsFinalize", "ScaleBiasAddRelu")
# The parameters (keywords other than arrays) each NormConv wiring hands each of NVIDIA's NormConv operators
# (Bottleneck.normconv_forward; tests/test_model.py traces both wirings against it): the names an image's operator
# registry must list for that wiring to run (selftest/build.py). The arrays are composed by the operators' input
# names (FListInputNames), which a registry query does not list.
GEOMETRY = ("kernel", "stride", "pad", "num_filter", "layout")
FINALIZE = ("eps", "momentum", "fix_gamma")
NORMCONV_PARAMETERS = {
    "stats-fl": {"NormConvolution": ("act_type", "no_norm") + GEOMETRY,
                 "NormalizedConvolution": ("act_type", "no_equiv_scale_bias") + GEOMETRY,
                 "BNStatsFinalize": FINALIZE + ("output_mean_var", "elem_count"),
                 "ScaleBiasAddRelu": ("act_type", "layout", "dual_scale_bias", "fused_add")},
    "mainloop-fl": {"NormConvolution": ("act_type", "no_norm") + GEOMETRY + FINALIZE,
                    "NormalizedConvolution": ("act_type", "no_equiv_scale_bias") + GEOMETRY,
                    "BNStatsFinalize": FINALIZE + ("output_mean_var", "elem_count"),
                    "ScaleBiasAddRelu": ("act_type", "layout", "dual_scale_bias", "fused_add")},
}


def normconv_available(operators=standin.operators):
    """Whether this MXNet build has NVIDIA's NormConv operators (NGC builds), judged by its operator registry."""
    return set(NORMCONV_OPERATORS) <= set(operators())


@dataclasses.dataclass(frozen=True)
class Layout:
    """The layout and BatchNorm choices every layer shares, so the blocks never branch on them.

    `name` is "NCHW" (CPU) or "NHWC" (the reference's GPU layout). Conv weights are stored in the matching
    order: (out, in, kh, kw) for NCHW, (out, kh, kw, in) for NHWC. `fused`: BN -> ReLU and BN -> add -> ReLU
    run as the fused kernels (see fused_batchnorm_available). `normconv_batch` > 0: the bottlenecks run as the
    NormConv fusions, whose BatchNorm statistics count this many images per step: a fixed number, as in the
    reference's symbol, which bakes its batch size in; the block takes them while traced (hybridized), the unfused
    layers when run imperatively. `wiring`: which of NVIDIA's NormConv wirings (NORMCONV_PARAMETERS). `ops`: the
    namespace those fusions are called through; None is the block's F (MXNet's own operators), a test passes
    another build's.
    """
    name: str = "NCHW"
    bn_eps: float = 1e-5
    bn_mom: float = 0.9
    fused: bool = False
    normconv_batch: int = 0
    wiring: str = "stats-fl"
    ops: object = None

    def conv(self, channels, kernel, stride, padding, in_channels, prefix, block=nn.Conv2D):
        """Convolution without bias, He-normal on fan-in = in*kh*kw (train_imagenet.py, MLPerfInit), not truncated;
        `block` is nn.Conv2D or a subclass (StemConv)."""
        return block(channels, kernel, strides=stride, padding=padding, in_channels=in_channels, layout=self.name,
                     use_bias=False, prefix=prefix,
                     weight_initializer=mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))

    def batchnorm(self, channels, prefix, zero_gamma=False, then=None):
        """BatchNorm over the channel axis; gamma 1 (or 0), beta 0, running mean 0, running var 1.

        then: None, "relu" (BN -> ReLU) or "add_relu" (BN, plus a second input, -> ReLU)."""
        block = {None: BatchNorm, "relu": BatchNormReLU, "add_relu": BatchNormAddReLU}[then]
        fused = {} if then is None else dict(fused=self.fused)
        return block(axis=self.name.index("C"), epsilon=self.bn_eps, momentum=self.bn_mom, in_channels=channels,
                     prefix=prefix, gamma_initializer="zeros" if zero_gamma else "ones", **fused)

    def max_pool(self, prefix):
        return nn.MaxPool2D(pool_size=3, strides=2, padding=1, layout=self.name, prefix=prefix)

    def global_avg_pool(self, prefix):
        return nn.GlobalAvgPool2D(layout=self.name, prefix=prefix)


class StemConv(nn.Conv2D):
    """The first convolution, conv0. In bfloat16 (the CPU's, NCHW) an odd number of input channels, RGB's 3, gets one
    zero channel more on the images and on the weight, inside the graph: the parameter keeps its shape and its
    gradient (the padding's is dropped), the convolution adds zero terms only. oneDNN 2.4's bfloat16 jit convolution
    takes a first layer's input channels in pairs (its weights' OhwI16o2i format; src/cpu/x64/
    jit_avx512_core_bf16_conv_kernel.cpp at MXNet 1.9.1's oneDNN 5818c40), so with 3 the convolution runs oneDNN's
    gemm path, whose plain-layout output sends bn0 to oneDNN's generic plain-layout BatchNorm (ncsp_bnorm:any): at
    the demo's shape one thread took 25 + 47 ms a step in bn0's forward and backward there against about 1 + 1.5 in
    float32's blocked layout (DNNL_VERBOSE, docs/bfloat16.md). With 4 channels conv0 runs the jit kernel and its
    blocked output keeps bn0 and pool0 on their jit kernels. `even_channels` is set by ResNet50V15.cast.
    On a GPU (float16, NHWC) it stays False and the call is the parent's, whose signature NVIDIA's fork keeps
    (sneaxiy/NVIDIA-MxNet@ce30b18 python/mxnet/gluon/nn/conv_layers.py:183, _Conv.hybrid_forward(self, F, x, weight,
    bias=None)); the layer's _kwargs there are the stand-in's CONV_KEYS rule (rn50_mx/standin/python_layer.py)."""

    even_channels = False

    def hybrid_forward(self, F, x, weight, bias=None):
        if self.even_channels:
            x = F.concat(x, F.zeros_like(F.slice_axis(x, axis=1, begin=0, end=1)), dim=1)
            zeros = F.zeros(shape=(self._channels, 1, *self._kwargs["kernel"]), dtype=BFLOAT16)
            weight = F.concat(weight, zeros, dim=1)
        return super().hybrid_forward(F, x, weight, bias)


class BatchNorm(nn.BatchNorm):
    """Gluon's BatchNorm, whose parameters and running statistics stay float32 when the network is cast to either
    low precision: Gluon's cast keeps float32 for float16 only (gluon/nn/basic_layers.py, _BatchNorm.cast), and
    MXNet's BatchNorm refuses a bfloat16 gamma ("This layer requires uniform type")."""

    def cast(self, dtype):
        super().cast("float32" if is_low_precision(dtype) else dtype)


class BatchNormReLU(BatchNorm):
    """BatchNorm then ReLU: NGC's one-kernel BatchNorm(act_type='relu') when `fused`, else two operators."""

    def __init__(self, fused, **kwargs):
        super().__init__(**kwargs)
        self.fused = fused

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        if self.fused:
            return F.BatchNorm(x, gamma, beta, running_mean, running_var, name="fwd", **self.fused_kwargs("relu"))
        return F.Activation(super().hybrid_forward(F, x, gamma, beta, running_mean, running_var), act_type="relu")

    def fused_kwargs(self, act_type):
        """Gluon's BatchNorm arguments (`_kwargs`) for a fused kernel: act_type set, or left out. NVIDIA's Gluon keeps
        act_type (None unless given), bn_group and xbuf_ptr in every BatchNorm's `_kwargs` (sneaxiy/NVIDIA-MxNet@ce30b18
        python/mxnet/gluon/nn/basic_layers.py:344-348), stock Gluon none of them: a second act_type keyword would be
        a TypeError, and BatchNormAddRelu has no act_type at all (src/operator/nn/batch_norm_add_relu-inl.h:61-93),
        whose parser refuses even a None one (MXNet's generated functions pass it on as "None")."""
        kwargs = {k: v for k, v in self._kwargs.items() if k != "act_type"}
        return dict(kwargs, act_type=act_type) if act_type else kwargs


class BatchNormAddReLU(BatchNormReLU):
    """BatchNorm, plus `addend` (the shortcut), then ReLU: NGC's BatchNormAddRelu kernel when `fused`."""

    def hybrid_forward(self, F, x, addend, gamma, beta, running_mean, running_var):
        if self.fused:
            return F.BatchNormAddRelu(data=x, addend=addend, gamma=gamma, beta=beta, moving_mean=running_mean,
                                      moving_var=running_var, name="fwd", **self.fused_kwargs(None))
        y = nn.BatchNorm.hybrid_forward(self, F, x, gamma, beta, running_mean, running_var)
        return F.Activation(y + addend, act_type="relu")


def shrink(hw, stride):
    """(height, width) after a convolution or pooling of this network with `stride` (every one pads to keep
    ceil(size / stride))."""
    return tuple((size - 1) // stride + 1 for size in hw)


def child_value(F, param, like):
    """A child block's parameter inside a parent's hybrid_forward: what Gluon passes a block for its own parameters
    (the symbol variable while tracing, else the data on `like`'s device)."""
    return param.var() if F is mx.sym else param.data(like.context)


class Bottleneck(gluon.HybridBlock):
    """1x1 reduce -> 3x3 (carries the stride: v1.5) -> 1x1 expand, plus a shortcut, then ReLU.

    The first unit of a stage has a projection shortcut (1x1 conv with the stride, then BN), stage 1 too.
    `zero_gamma` starts bn3's gamma at 0 so the unit begins as its shortcut (off in the reference).
    `in_hw`: the (height, width) of the unit's input, which the NormConv statistics count over.
    """

    def __init__(self, layout, in_channels, width, stride, projection, zero_gamma, prefix, in_hw=(0, 0)):
        super().__init__(prefix=prefix)
        out_channels = width * EXPANSION
        self.ops, self.batch, self.wiring = layout.ops, layout.normconv_batch, layout.wiring
        (h, w), (out_h, out_w) = in_hw, shrink(in_hw, stride)
        self.in_pixels, self.out_pixels = self.batch * h * w, self.batch * out_h * out_w
        with self.name_scope():
            self.conv1 = layout.conv(width, 1, 1, 0, in_channels, "conv1_")
            self.bn1 = layout.batchnorm(width, "bn1_", then="relu")
            self.conv2 = layout.conv(width, 3, stride, 1, width, "conv2_")
            self.bn2 = layout.batchnorm(width, "bn2_", then="relu")
            self.conv3 = layout.conv(out_channels, 1, 1, 0, width, "conv3_")
            self.bn3 = layout.batchnorm(out_channels, "bn3_", zero_gamma, then="add_relu")
            self.conv1sc = layout.conv(out_channels, 1, stride, 0, in_channels, "conv1sc_") if projection else None
            self.bnsc = layout.batchnorm(out_channels, "bnsc_") if projection else None

    def hybrid_forward(self, F, x):
        # The fused path only while tracing: NVIDIA's NormConvolution registers no `weight` argument for NDArrays
        # (it is among its FListInputNames only, which a traced symbol composes by), so an imperative call fails;
        # run imperatively, the unit takes the unfused path, which has the same parameters and the same math.
        if self.batch and F is mx.sym:
            return self.normconv_forward(F, self.ops or F, x)
        shortcut = self.bnsc(self.conv1sc(x)) if self.conv1sc is not None else x
        y = self.bn1(self.conv1(x))
        y = self.bn2(self.conv2(y))
        return self.bn3(self.conv3(y), shortcut)

    def normconv_forward(self, F, ops, x):
        """The same unit as one of NVIDIA's NormConv wirings: each convolution also emits its output's per-channel
        sum and sum of squares, from which the next operator finalizes BatchNorm's scale and bias and moves the
        running statistics; the last BatchNorm (and a projection's own) is applied by ScaleBiasAddRelu with the
        shortcut add and the ReLU. The weights, gammas, betas and running statistics are this unit's own children's,
        so names, shapes and checkpoints are unchanged, whichever the wiring.
        - stats-fl, the reference's (residual_unit_norm_conv of symbols/resnet-v1b-stats-fl.py): every BatchNorm a
          BNStatsFinalize, bn1 and bn2 applied by ScaleBiasAddRelu, conv2 and conv3 NormalizedConvolutions of
          their outputs;
        - mainloop-fl, NVIDIA's on the 24.04 image (mlcommons/training_results_v4.0@62f111b NVIDIA/benchmarks/resnet/
          implementations/eos_ngc24.04_mxnet/symbols/resnet-v1b-mainloop-fl.py:203-294): conv2 and conv3 are
          NormConvolutions given the previous convolution's sums and BatchNorm (:220-235), which finalize and apply
          it, with the ReLU, to their input; the projection's ScaleBiasAddRelu takes the fork's defaults (:76-82)."""
        def param(parameter):
            return child_value(F, parameter, x)

        def conv(op, layer, data, **mode):  # (output, sum, sum of squares)
            geometry = {k: layer._kwargs[k] for k in GEOMETRY}
            return op(data=data, weight=param(layer.weight), act_type=mode.pop("act_type", None), **geometry,
                      **mode)

        def statistics(bn):  # a BatchNorm's arrays and settings, under the names the NormConv operators take
            return dict(gamma=param(bn.gamma), beta=param(bn.beta), moving_mean=param(bn.running_mean),
                        moving_var=param(bn.running_var), eps=bn._kwargs["eps"], momentum=bn._kwargs["momentum"],
                        fix_gamma=False)

        def finalize(sums, bn, pixels):  # BNStatsFinalize's six outputs under ScaleBiasAddRelu's names for them
            stats = ops.BNStatsFinalize(sum=sums[1], sum_squares=sums[2], **statistics(bn), output_mean_var=True,
                                        elem_count=pixels)
            return {f"x_{name}": v for name, v in zip(("equiv_scale", "equiv_bias", "mean", "invvar", "gamma",
                                                      "beta"), stats)}

        def scale_bias_relu(data, stats, **kwargs):
            return ops.ScaleBiasAddRelu(dataX=data, act_type="relu", layout="NHWC", **stats, **kwargs)[0]

        out1 = conv(ops.NormConvolution, self.conv1, x, no_norm=True)
        if self.wiring == "mainloop-fl":
            out2 = conv(ops.NormConvolution, self.conv2, out1[0], no_norm=False, in_sum=out1[1],
                        in_sum_squares=out1[2], act_type="relu", **statistics(self.bn1))
            out3 = conv(ops.NormConvolution, self.conv3, out2[0], no_norm=False, in_sum=out2[1],
                        in_sum_squares=out2[2], act_type="relu", **statistics(self.bn2))
            dual = {}  # ScaleBiasAddRelu's defaults: dual_scale_bias and fused_add
        else:
            y = scale_bias_relu(out1[0], finalize(out1, self.bn1, self.in_pixels), dual_scale_bias=False,
                                fused_add=False)
            out2 = conv(ops.NormalizedConvolution, self.conv2, y, no_equiv_scale_bias=True)
            y = scale_bias_relu(out2[0], finalize(out2, self.bn2, self.out_pixels), dual_scale_bias=False,
                                fused_add=False)
            out3 = conv(ops.NormalizedConvolution, self.conv3, y, no_equiv_scale_bias=True)
            dual = dict(dual_scale_bias=True, fused_add=True)
        bn3 = finalize(out3, self.bn3, self.out_pixels)
        if self.conv1sc is None:
            return scale_bias_relu(out3[0], bn3, dataZ=x, dual_scale_bias=False, fused_add=True)
        shortcut = conv(ops.NormalizedConvolution, self.conv1sc, x, no_equiv_scale_bias=True)
        bnsc = {f"z_{k[2:]}": v for k, v in finalize(shortcut, self.bnsc, self.out_pixels).items()}
        return scale_bias_relu(out3[0], bn3, dataZ=shortcut[0], **bnsc, **dual)


def unit_geometry(image_hw, units=UNITS[50]):
    """Per stage, each bottleneck's Bottleneck arguments but the layout and zero_gamma, for input images of (height,
    width) `image_hw` and `units` bottlenecks a stage: in_channels, width, stride, projection, prefix and in_hw (the
    map the unit reads: conv0 and pool0 halve the images, each stage's first unit carries its stride)."""
    channels, hw, stages = STEM_CHANNELS, shrink(shrink(image_hw, 2), 2), []
    for count, (width, stride) in zip(units, STAGES):
        stages.append([])
        for u in range(1, count + 1):
            unit_stride = stride if u == 1 else 1
            stages[-1].append(dict(in_channels=channels, width=width, stride=unit_stride, projection=u == 1,
                                   prefix=f"unit{u}_", in_hw=hw))
            channels, hw = width * EXPANSION, shrink(hw, unit_stride)
    return stages


class ResNet50V15(gluon.HybridBlock):
    """ResNet-50 v1.5: 7x7/2 conv, BN, ReLU, 3x3/2 max-pool, stages of (3, 4, 6, 3) bottlenecks (fewer with
    `units`), average pool, fc.

    Parameters
    ----------
    layout : Layout
    num_classes : int
        Outputs of fc1 (with bias; weight N(0, 0.01), bias 0).
    in_channels : int
        3, or 4 for the reference's zero-padded input.
    zero_gamma : bool
        Zero-initialise the last BN gamma of each bottleneck.
    image_hw : (int, int)
        Height and width of the input images (the NormConv statistics count pixels).
    units : tuple of int
        Bottlenecks per stage (UNITS: ResNet-50's by default).
    """

    def __init__(self, layout, num_classes, in_channels, zero_gamma=False, image_hw=(224, 224), units=UNITS[50]):
        super().__init__(prefix="")
        self.conv0 = layout.conv(STEM_CHANNELS, 7, 2, 3, in_channels, "conv0_", block=StemConv)
        self.bn0 = layout.batchnorm(STEM_CHANNELS, "bn0_", then="relu")
        self.pool0 = layout.max_pool("pool0_")
        self.stages = nn.HybridSequential(prefix="")
        for s, stage_units in enumerate(unit_geometry(image_hw, units), start=1):
            stage = nn.HybridSequential(prefix=f"stage{s}_")
            with stage.name_scope():
                for unit in stage_units:
                    stage.add(Bottleneck(layout, zero_gamma=zero_gamma, **unit))
            self.stages.add(stage)
        channels = STAGES[-1][0] * EXPANSION
        self.pool1 = layout.global_avg_pool("pool1_")
        self.fc1 = nn.Dense(num_classes, in_units=channels, prefix="fc1_",
                            weight_initializer=mx.init.Normal(0.01), bias_initializer="zeros")
        self.image_cast = None

    def cast(self, dtype):
        """Cast as Gluon does; in bfloat16 the images come in float32 (config.Settings.input_dtype) and the first
        operator of the traced graph casts them: one cast per batch, on the device."""
        super().cast(dtype)
        self.image_cast = BFLOAT16 if np.dtype(dtype) == BFLOAT16 else None
        self.conv0.even_channels = (self.image_cast is not None and self.conv0._in_channels % 2 == 1
                                    and self.conv0._kwargs["layout"] == "NCHW")

    def hybrid_forward(self, F, x):
        if self.image_cast is not None:
            x = F.amp_cast(x, dtype=self.image_cast)
        x = self.pool0(self.bn0(self.conv0(x)))
        x = self.stages(x)
        return self.fc1(self.pool1(x))


def build_model(settings, ctx=None, drawn=True):
    """The network of `settings`, initialised on `ctx` (default CPU) and cast to `settings.dtype`.

    Seed `mx.random` first for a reproducible init. In float16 and bfloat16, BatchNorm keeps gamma, beta and the
    running statistics in float32; the float32 master weights live in the optimizer (multi_precision).
    drawn=False gives every parameter zeros instead, drawing nothing from mx.random: for a caller that reads only the
    shapes and dtypes, or sets every value from a file before it runs the network (the init's Gaussian draws for
    ResNet-50's 25.6M weights take 0.8 s of a CPU core, for a GPU's model too: Gluon fills each parameter on the host,
    then copies it, mxnet 1.9.1 gluon/parameter.py:340-353).
    """
    nhwc = settings.input_layout == "NHWC"
    # NVIDIA's fork refuses BatchNorm(act_type) where its NHWC kernel does not run, and that kernel takes float16
    # only (sneaxiy/NVIDIA-MxNet batch_norm.cu:1110-1114, cudnn/nhwc_batch_norm-inl.h:296-308, Supports); likewise
    # NormConv's cuDNN kernels (cudnn_normalized_convolution-inl.h, Supports).
    fused = settings.fused_bn and nhwc and settings.dtype == "float16" and fused_batchnorm_available()
    normconv = settings.normconv and nhwc and settings.dtype == "float16" and normconv_available()
    layout = Layout(settings.input_layout, settings.batchnorm_eps, settings.batchnorm_mom, fused,
                    settings.batch_size if normconv else 0, settings.normconv_wiring)
    net = ResNet50V15(layout, settings.num_classes, settings.image_chw[0], settings.bn_gamma_init0,
                      settings.image_chw[1:], UNITS[settings.num_layers])
    if drawn:
        net.initialize(ctx=ctx or mx.cpu())
    else:
        zeros(net, ctx or mx.cpu())
    net.cast(mx_dtype(settings.dtype))
    check_fused_kernels(layout, settings.batch_size, settings.image_chw[1:], ctx or mx.cpu())
    return net


WIRINGS = config.FIELDS["normconv_wiring"].metadata["choices"]  # the keys of NORMCONV_PARAMETERS


def check_fused_kernels(layout, batch, image_hw, ctx):
    """NVIDIA's fused kernels that `layout` asks for, run once on `ctx` in the network's own blocks at its smallest
    maps and the per-rank `batch` (probe_blocks: float16 NHWC, in training as the warm-up's first step runs them).
    Where they refuse (the NormConv family on a GPU its build's Supports() does not list, or Volta's 1x1 stride-2
    projection: cudnn_norm_convolution-inl.h:465-484 in the public fork; an LOG(FATAL) that MXNet raises at the next
    wait), the run stops here in one line naming the setting that avoids them (the other NormConv wiring when it
    runs here, else RN50_NORMCONV=0), not at its first forward with MXNet's error; a refusal here is one of the
    run's own shapes. Nothing to run without fused kernels, nor off a GPU (or the stand-in build's stand-in for
    one: a test that presents another build's registry on a CPU traces what it checks)."""
    if ctx.device_type != "gpu" and standin.compute_capability() is None:
        return
    refused = probe(layout, batch, image_hw, ctx)
    if refused is None:
        return
    setting, error = refused
    if setting == "RN50_NORMCONV":
        other = next(w for w in WIRINGS if w != layout.wiring)
        if probe(dataclasses.replace(layout, fused=False, wiring=other), batch, image_hw, ctx) is None:
            raise InputError(f"NVIDIA's NormConv kernels refuse the {layout.wiring} wiring on this GPU ({error}): "
                             f"set RN50_NORMCONV_WIRING={other}, which runs here, or RN50_NORMCONV=0")
    kernels = "fused BatchNorm" if setting == "RN50_FUSED_BN" else "NormConv"
    raise InputError(f"NVIDIA's {kernels} kernels do not run on this GPU ({error}): set {setting}=0")


def probe(layout, batch, image_hw, ctx):
    """(setting, MXNet's error in one line) of the first of probe_blocks that refuses on `ctx`, or None when all
    ran. The blocks' parameters are zeros, so MXNet's random state is left as it was."""
    for setting, block, shape in probe_blocks(layout, batch, image_hw):
        zeros(block, ctx)
        block.cast("float16")
        block.hybridize(static_alloc=True, static_shape=True)
        try:
            with mx.autograd.train_mode():
                block(mx.nd.zeros(shape, ctx=ctx, dtype="float16")).wait_to_read()
        except mx.base.MXNetError as err:
            return setting, one_line(str(err))
    return None


def zeros(block, ctx):
    """Every parameter of `block` initialised on `ctx` to zeros, with no draw from mx.random."""
    for param in block.collect_params().values():
        param.initialize(mx.init.Zero(), ctx=ctx)  # given here, it beats each parameter's own initializer


def probe_blocks(layout, batch, image_hw):
    """[(setting, block, input shape)]: the blocks of the network of `layout` that run NVIDIA's fused kernels, as
    the network builds them, at its smallest maps for images of `image_hw` and the per-rank `batch`, each with the
    setting that turns its kernels off. bn0 (BN -> ReLU, the fused BatchNorm's only block once the bottlenecks run
    NormConv) on the stem's map; the last stage's projection unit (stride 2: 1x1 and 3x3 kernels at stride 2) and
    its first identity unit (stride 1, the shortcut added as it is), on 14x14 and 7x7 maps at 224 px: every
    operator, mode and kernel the bottlenecks run, at each stride but one (stage 1's projection shortcut, a 1x1
    NormalizedConvolution of stride 1 on 56x56 maps, whose kernel and stride the other units' convolutions have)."""
    blocks = []
    if layout.fused:
        bn0 = layout.batchnorm(STEM_CHANNELS, "probe_bn0_", then="relu")
        blocks.append(("RN50_FUSED_BN", bn0, (batch, *shrink(image_hw, 2), STEM_CHANNELS)))
    if layout.fused or layout.normconv_batch:
        setting = "RN50_NORMCONV" if layout.normconv_batch else "RN50_FUSED_BN"
        for unit in unit_geometry(image_hw)[-1][:2]:
            block = Bottleneck(layout, **dict(unit, prefix="probe_" + unit["prefix"]), zero_gamma=False)
            blocks.append((setting, block, (batch, *unit["in_hw"], unit["in_channels"])))
    return blocks


def is_layer_weight(shape):
    """True for conv kernels and dense weights (>= 2-D): the tensors that LARS and weight decay act on.

    1-D tensors (BN gamma/beta, the fc bias) are excluded from both. The rule is structural, not by name.
    The reference differs for one tensor: it gives fc1_bias weight decay too (common/fit.py).
    """
    return len(shape) >= 2


def split_params(net):
    """(layer weights, excluded) lists of the trainable parameters: 54 and 107 for ResNet-50."""
    trainable = [p for p in net.collect_params().values() if p.grad_req != "null"]
    return ([p for p in trainable if is_layer_weight(p.shape)],
            [p for p in trainable if not is_layer_weight(p.shape)])


def running_stats(net):
    """The BatchNorm running means and variances (every parameter without a gradient)."""
    return [p.data() for p in net.collect_params().values() if p.grad_req == "null"]


def count_params(net):
    """Number of trainable scalars: 25,557,032 for 1000 classes and 3 input channels."""
    weights, excluded = split_params(net)
    return sum(p.data().size for p in weights + excluded)
