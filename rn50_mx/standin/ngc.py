"""Stand-ins for the fused operators of NVIDIA's MXNet (NGC builds) that stock MXNet 1.9.1 lacks: BatchNorm with
act_type, BatchNormAddRelu, NormConvolution, NormalizedConvolution, BNStatsFinalize and ScaleBiasAddRelu, as MXNet
custom operators, so that the GPU path's network runs on a CPU, imperatively and hybridized (static_alloc), with
autograd.

A FAKE, named as one. Each computes the function we read in the fork's source, in float32 on the CPU, and refuses,
with the fork's own message, what the fork's kernels refuse: dtype, layout/axis, act_type, shapes, grad_req kAddTo.
It checks our wiring and those rules as read from the source; it says nothing of NVIDIA's kernels' numerics, speed or
memory. The GPU's compute capability is a setting (RN50_STANDIN_SM, default 80: an A100), checked against
NORMCONV_SM, an assumption (see there), and against Volta's own kernel rule (NormConv.check).

Source: NVIDIA's MXNet fork as mirrored in sneaxiy/NVIDIA-MxNet @ ce30b18 (1.8-based); every file cited is under its
src/operator/nn/. Where the fork accepts an input and computes something else, or ignores grad_req kAddTo (it
overwrites the gradient it should add to), there is no fork message: the stand-in refuses in its own words, citing
the line, as a silent wrong result is what a rehearsal is for.
"""
import ast

import numpy as np
import mxnet as mx
from mxnet import autograd, nd

# The fused operators a stand-in build has that stock MXNet lacks (BatchNorm's act_type is an argument, see
# batchnorm_arguments); what an operator-registry query of NVIDIA's build lists besides stock MXNet's.
OPERATORS = ("BatchNormAddRelu", "NormConvolution", "NormalizedConvolution", "BNStatsFinalize", "ScaleBiasAddRelu")

# The inputs each operator takes by name in a symbol (its FListInputNames) per mode, then its auxiliary states.
# batch_norm.cc (BatchNorm); batch_norm_add_relu.cc:522-525; norm_convolution.cc:433-441 (without no_norm: the
# previous convolution's sums, the BatchNorm they finalize, then the weight; the running statistics are inputs the
# operator mutates, FMutateInputs :468-474, here auxiliary states); normalized_convolution.cc:406-412;
# bn_stats_finalize.cc:230-234; scale_bias_add_relu.cc:279-295.
SCALE_BIAS_X = ("x_equiv_scale", "x_equiv_bias")
STATS_X = ("x_gamma", "x_beta", "x_mean", "x_invvar")
INPUTS = {
    ("BatchNorm", ""): ("data", "gamma", "beta"),
    ("BatchNormAddRelu", ""): ("data", "gamma", "beta", "addend"),
    ("NormConvolution", "no_norm"): ("data", "weight"),
    ("NormConvolution", ""): ("data", "in_sum", "in_sum_squares", "gamma", "beta", "weight"),
    ("NormalizedConvolution", "no_equiv_scale_bias"): ("data", "weight"),
    ("BNStatsFinalize", ""): ("sum", "sum_squares", "gamma", "beta"),
    ("ScaleBiasAddRelu", ""): ("dataX",) + SCALE_BIAS_X + STATS_X,
    ("ScaleBiasAddRelu", "fused_add"): ("dataX", "dataZ") + SCALE_BIAS_X + STATS_X,
    ("ScaleBiasAddRelu", "dual_scale_bias fused_add"): (
        "dataX", "dataZ") + SCALE_BIAS_X + ("z_equiv_scale", "z_equiv_bias") + STATS_X + (
        "z_gamma", "z_beta", "z_mean", "z_invvar"),
}
STATISTICS = ("moving_mean", "moving_var")
AUX = {"BatchNorm": STATISTICS, "BatchNormAddRelu": STATISTICS, "BNStatsFinalize": STATISTICS,
       ("NormConvolution", ""): STATISTICS}
# The NDArray functions' declared arguments (add_argument), in order: a generated function binds arrays to these and
# hands them to the operator in this order, whatever their names (mxnet/ndarray/register.py); an NDArray under any
# other keyword is refused. NormConvolution declares no `weight` (norm_convolution.cc:475-481).
ND_ARGUMENTS = {
    "BatchNorm": ("data", "gamma", "beta", "moving_mean", "moving_var"),
    "BatchNormAddRelu": ("data", "gamma", "beta", "moving_mean", "moving_var", "addend"),
    "NormConvolution": ("data", "sum", "sum_squares", "gamma", "beta", "moving_mean", "moving_var"),
    "NormalizedConvolution": ("data", "equiv_scale", "equiv_bias", "mean", "var", "gamma", "beta", "weight"),
    "BNStatsFinalize": ("sum", "sum_squares", "gamma", "beta", "moving_mean", "moving_var"),
    "ScaleBiasAddRelu": ("dataX", "dataZ") + SCALE_BIAS_X + ("z_equiv_scale", "z_equiv_bias") + STATS_X + (
        "z_gamma", "z_beta", "z_mean", "z_invvar"),
}
MODE_FLAGS = ("no_norm", "no_equiv_scale_bias", "dual_scale_bias", "fused_add")

# The fork's messages, quoted.
FUSED_RELU = "Fused ReLU activation is only supported with float16 NHWC Batchnorm on Volta."  # batch_norm.cu:1114
RELU_ONLY = "Only ReLU activation fusion supported."  # cudnn/nhwc_batch_norm-inl.h:64-66
NO_FALLBACK = "No fallback impl for unsupported {} configuration."  # norm_convolution.cu:104, bn_stats_finalize.cu:100
CUDNN_ONLY = "Only cudnn-based {} supported."  # scale_bias_add_relu-inl.h:185, normalized_convolution-inl.h:171
IGNORES_ADD = ("{op}: grad_req 'add' on {name}: NVIDIA's kernel never reads req there and overwrites the gradient "
               "({where}); the stand-in refuses what would silently drop the sum")

# The compute capabilities (major * 10 + minor) on which NormConvolution, NormalizedConvolution and ScaleBiasAddRelu
# run. The public fork's Supports() lists 70, 75, 80 and 86 (cudnn/cudnn_norm_convolution-inl.h:465-468,
# cudnn_normalized_convolution-inl.h:433-436, cudnn_scale_bias_add_relu-inl.h:410-413); 90 is ASSUMED for the
# nvcr.io/nvidia/mxnet:24.04-py3 image, whose source is not public: NVIDIA's MLPerf v4.0 ResNet-50 ran these operators
# on H100s in it (mlcommons/training_results_v4.0@62f111b NVIDIA/benchmarks/resnet/implementations/
# eos_ngc24.04_mxnet: Dockerfile:15, symbols/resnet-v1b-mainloop-fl.py; its result_0.txt ended in success). The
# self-test's "kernels" row checks it on the real GPU. NhwcBatchNorm(AddRelu) and BNStatsFinalize list none.
NORMCONV_SM = (70, 75, 80, 86, 90)
GPU = {"sm": 80}  # the stood-in GPU's compute capability (install)
REQUIRED = object()
REGISTERED = []  # the custom operators are registered once a process
LAST_REFUSAL = [None]  # the message of the latest refusal inside a callback, for the MXNetError that surfaces


class Refusal(mx.MXNetError):
    """What a stand-in raises for an input NVIDIA's build refuses (or would compute wrongly)."""


def refuse(message):
    LAST_REFUSAL[0] = message
    raise Refusal(message)


def with_refusal(get_last_ffi_error):
    """MXNet prints a custom operator's exception and raises its own 'Check failed: ... callbacks[...]' in its place
    (mxnet/operator.py, forward_entry/backward_entry/infer_*_entry; src/operator/custom/custom.cc): put the latest
    stand-in refusal's message back into the MXNetError that surfaces from a custom operator, as the fork's
    LOG(FATAL) text surfaces there. (mxnet.base.check_call reads this function from its module at each call.)"""
    def get_error():
        error = get_last_ffi_error()
        if LAST_REFUSAL[0] and "custom" in str(error):
            return type(error)(f"{LAST_REFUSAL[0]}\n{error}")
        return error
    get_error.standin = True
    return get_error


def quiet_refusals(print_):
    """MXNet's print of a custom operator's exception (mxnet/operator.py, forward_entry and the like), without the
    traceback of a refusal: its message surfaces in the MXNetError (with_refusal), alone, as the fork's LOG(FATAL)
    text does; any other exception is printed as MXNet prints it."""
    def quiet(*args, **kwargs):
        if not (args and f"{__name__}.Refusal:" in str(args[0])):
            print_(*args, **kwargs)
    quiet.standin = True
    return quiet


def guarded(callback):
    """A callback whose exceptions other than refusals clear the last refusal (so a bug is not named as one)."""
    def run(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except Refusal:
            raise
        except Exception:
            LAST_REFUSAL[0] = None
            raise
    return run


# ---- parameters, as dmlc's parser reads the strings mx.sym/nd.Custom pass --------------------------------------

def to_bool(text):
    return str(text).lower() in ("true", "1")


def to_shape(text):
    value = ast.literal_eval(str(text))
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def enum(*values):
    def parse(text):
        if text not in values:
            refuse(f"Invalid Input: '{text}', valid values are: {{{', '.join(repr(v) for v in values)}}}")
        return text
    return parse


def parse_params(op, spec, kwargs):
    """The operator's parameters from their strings, refused in dmlc's words (dmlc/parameter.h) when unknown or a
    required one is missing; a value of None is the field's default (dmlc's optional reads "None" so)."""
    for name in kwargs:
        if name not in spec:
            refuse(f"Cannot find argument '{name}', Possible Arguments: {', '.join(spec)}, in operator {op}")
    params = {}
    for name, (parse, default) in spec.items():
        text = kwargs.get(name)
        if text is None or text == "None":
            if default is REQUIRED:
                refuse(f"Required parameter {name} of uint64_t is not presented, in operator {op}")
            params[name] = default
        else:
            params[name] = parse(text)
    return params


ADD_RELU_PARAMS = {"eps": (float, 1e-3), "momentum": (float, 0.9), "fix_gamma": (to_bool, True),
                   "use_global_stats": (to_bool, False), "output_mean_var": (to_bool, False), "axis": (int, 1),
                   "cudnn_off": (to_bool, False), "bn_group": (int, 1),
                   "xbuf_ptr": (int, 0)}  # batch_norm_add_relu-inl.h:72-92: no act_type
BN_PARAMS = dict(ADD_RELU_PARAMS, act_type=(enum("relu", "sigmoid", "tanh", "softrelu"), None),
                 min_calib_range=(float, None), max_calib_range=(float, None))  # batch_norm-inl.h:86-128
CONV_PARAMS = {"kernel": (to_shape, REQUIRED), "stride": (to_shape, (1, 1)), "dilate": (to_shape, (1, 1)),
               "pad": (to_shape, (0, 0)), "num_filter": (int, REQUIRED), "num_group": (int, 1),
               "layout": (enum("NCW", "NCHW", "NCDHW", "NHWC", "NDHWC"), "NCHW"),
               "act_type": (enum("relu", "sigmoid", "tanh", "softrelu"), None)}  # norm_convolution-inl.h:119-165
STATS_PARAMS = {"eps": (float, 1e-3), "momentum": (float, 0.9), "fix_gamma": (to_bool, True),
                "use_global_stats": (to_bool, False), "output_mean_var": (to_bool, False),
                "elem_count": (int, REQUIRED)}  # bn_stats_finalize-inl.h:70-86
SBAR_PARAMS = {"eps": (float, 1e-3), "dual_scale_bias": (to_bool, True), "fused_add": (to_bool, True),
               "fused_relu": (to_bool, True), "layout": (enum("NHWC"), None),
               "act_type": (enum("relu"), None)}  # scale_bias_add_relu-inl.h:123-143


# ---- the math, in float32, channel last -------------------------------------------------------------------------

def f32(a):
    return a.astype("float32", copy=False)


def channels(v, ndim):
    """A per-channel vector shaped to broadcast over a channel-last array."""
    return v.reshape((1,) * (ndim - 1) + (-1,))


def batch_stats(x):
    """Mean and biased variance per channel (the saved statistics: 1/nhw, cudnn/nhwc_batch_norm.h:138-139)."""
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes)
    return mean, ((x - channels(mean, x.ndim)) ** 2).mean(axis=axes)


def move(moving, batch, momentum):
    (moving * momentum + batch * (1 - momentum)).copyto(moving)  # not moving[:] =: the slice's Python costs more


def unbiased(var, count):
    """The running variance's update uses the unbiased variance by default (nhwc_batch_norm.h:140-144,
    MXNET_CUDNN_NHWC_BN_UNBIASED_RUNNING_VAR); BNStatsFinalize's cuDNN kernel is assumed the same."""
    return var * (count / (count - 1)) if count > 1 else var


def normalize(x, mean, inv_std, gamma, beta):
    return (x - channels(mean, x.ndim)) * channels(inv_std * gamma, x.ndim) + channels(beta, x.ndim)


def bn_backward(dy, x, mean, inv_std, gamma):
    """BatchNorm's gradients (data, gamma, beta) from the saved batch mean and inverse std."""
    n = x.size // x.shape[-1]
    axes = tuple(range(x.ndim - 1))
    x_hat = (x - channels(mean, x.ndim)) * channels(inv_std, x.ndim)
    d_beta, d_gamma = dy.sum(axis=axes), (dy * x_hat).sum(axis=axes)
    dx = channels(gamma * inv_std / n, x.ndim) * (n * dy - channels(d_beta, x.ndim) - x_hat * channels(d_gamma, x.ndim))
    return dx, d_gamma, d_beta


# ---- the operators ----------------------------------------------------------------------------------------------

class Prop(mx.operator.CustomOpProp):
    """What every stand-in's CustomOpProp shares: its parameters, its inputs for the mode, its outputs."""
    name, spec, outputs = "", {}, ()

    def __init__(self, **kwargs):
        super().__init__(need_top_grad=True)
        self.p = parse_params(self.name, self.spec, kwargs)
        self.mode = " ".join(f for f in MODE_FLAGS if self.p.get(f))

    @classmethod
    def validate(cls, params):
        """The parameters' refusals, made by the caller before the custom node exists: an exception in a custom
        operator's creator crashes MXNet 1.9.1 (a segmentation fault, measured), where the fork refuses at the
        call."""
        return parse_params(cls.name, cls.spec, {k: str(v) for k, v in params.items()})

    def list_arguments(self):
        return list(input_names(self.name, self.mode))

    def list_auxiliary_states(self):
        return list(aux_names(self.name, self.mode))

    def list_outputs(self):
        return list(self.outputs)

    def create_operator(self, ctx, shapes, dtypes):
        return self.op(self)


def fork_inputs(op, mode):
    """Every input of op in mode by its name in the fork (its FListInputNames): arguments, then statistics."""
    return input_names(op, mode) + aux_names(op, mode)


def aux_names(op, mode):
    """The running statistics op takes in mode (its auxiliary states here)."""
    return AUX.get((op, mode), AUX.get(op, ()))


def input_names(op, mode):
    if (op, mode) not in INPUTS:
        refuse(f"{op} with {mode or 'no mode flag'}: the stand-in models only the modes our network uses, "
               f"{[m or 'none' for o, m in INPUTS if o == op]}")
    return INPUTS[op, mode]


def uniform_types(in_type, expected, names):
    """The inputs' types, each the expected one (unknown ones set so), else the fork's UNIFORM_TYPE_CHECK message
    (operator_common.h)."""
    out = []
    for got, want, name in zip(in_type, expected, names):
        if got is not None and got != -1 and np.dtype(got) != np.dtype(want):
            refuse(f"This layer requires uniform type. Expected '{np.dtype(want).name}' v.s. given "
                   f"'{np.dtype(got).name}' at '{name}'")
        out.append(want)
    return out


def accreal(dtype):
    """The statistics' type for a data type: float32 for float16 (MSHADOW_REAL_TYPE_SWITCH_EX's AccReal)."""
    return np.float32 if np.dtype(dtype) == np.float16 else dtype


class StandIn(mx.operator.CustomOp):
    """A node: the prop's parameters; forward and backward in float32 on the inputs' device."""

    def __init__(self, prop):
        super().__init__()
        self.p, self.mode, self.names = prop.p, prop.mode, prop.list_arguments()
        self.forward = guarded(self.forward)
        self.backward = guarded(self.backward)

    def write(self, dst, req, value=None):
        """`value` (None: zeros) into `dst` as `req` asks, in one operator with the cast: CustomOp.assign's slice
        assignment costs more Python than the arithmetic at the rehearsal's sizes."""
        if req == "null" or (value is None and req == "add"):
            return
        if value is None:
            nd.zeros_like(dst, out=dst)
        elif req == "add":
            dst += value.astype(dst.dtype, copy=False)
        else:
            nd.Cast(value, dtype=dst.dtype, out=dst)

    def no_add(self, req, where, names=None):
        for name, r in zip(self.names, req):
            if r == "add" and (names is None or name in names):
                refuse(IGNORES_ADD.format(op=self.prop_name, name=name, where=where))


# BatchNorm with act_type and BatchNormAddRelu ----------------------------------------------------------------------

def nhwc_bn_supports(p, x):
    """NhwcBatchNormOp::Supports (cudnn/nhwc_batch_norm-inl.h:296-308) and NhwcBatchNormAddReluOp::Supports
    (cudnn/nhwc_batch_norm_add_relu-inl.h:286-302): not use_global_stats, 3 to 5 dimensions, float16, the channel
    axis last, channels a multiple of 4 (and a GPU with cooperative launch, assumed); taken unless cudnn_off
    (batch_norm.cu:1111, batch_norm_add_relu.cu:677)."""
    axis = p["axis"] + x.ndim if p["axis"] < 0 else p["axis"]  # GetRealAxis, batch_norm.cu:1107
    return (not p["cudnn_off"] and not p["use_global_stats"] and 3 <= x.ndim <= 5 and x.dtype == np.float16
            and axis == x.ndim - 1 and x.shape[-1] % 4 == 0)


class FusedBatchNorm(StandIn):
    """BatchNorm -> [+ addend] -> ReLU over the last axis; running statistics moved in training, used otherwise."""
    prop_name = "BatchNorm"

    def check(self, x):
        """The fork takes act_type only through NhwcBatchNormOp (batch_norm.cu:1110-1114 forward, 1142-1146
        backward), whose Init wants ReLU (nhwc_batch_norm-inl.h:64-66)."""
        if not nhwc_bn_supports(self.p, x):
            refuse(FUSED_RELU)
        if self.p["act_type"] != "relu":
            refuse(RELU_ONLY)

    def stats(self, x, aux, is_train):
        if is_train:
            mean, var = batch_stats(x)
            count = x.size // x.shape[-1]
            move(aux[0], mean, self.p["momentum"])
            move(aux[1], unbiased(var, count), self.p["momentum"])
            return mean, var
        return aux[0], aux[1]  # fwdInference: the running statistics (nhwc_batch_norm-inl.h:197-201)

    def gamma(self, gamma):
        return nd.ones_like(gamma) if self.p["fix_gamma"] else gamma  # nhwc_batch_norm-inl.h:164

    def pre_activation(self, in_data, mean, var):
        x = f32(in_data[0])
        y = normalize(x, mean, 1 / nd.sqrt(var + self.p["eps"]), self.gamma(in_data[1]), in_data[2])
        return y + f32(in_data[3]) if len(in_data) > 3 else y

    def forward(self, is_train, req, in_data, out_data, aux):
        self.check(in_data[0])
        mean, var = self.stats(f32(in_data[0]), aux, is_train)
        self.write(out_data[0], req[0], nd.relu(self.pre_activation(in_data, mean, var)))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.check(in_data[0])
        # NhwcBatchNormOp::Backward (nhwc_batch_norm-inl.h:205-290) and NhwcBatchNormAddReluOp::Backward
        # (nhwc_batch_norm_add_relu-inl.h:193-280) never read req.
        self.no_add(req, "cudnn/nhwc_batch_norm-inl.h:205-290, nhwc_batch_norm_add_relu-inl.h:193-280")
        x = f32(in_data[0])
        mean, var = batch_stats(x)
        dy = f32(out_grad[0]) * (self.pre_activation(in_data, mean, var) > 0)
        dx, d_gamma, d_beta = bn_backward(dy, x, mean, 1 / nd.sqrt(var + self.p["eps"]), self.gamma(in_data[1]))
        if self.p["fix_gamma"]:
            d_gamma = None  # zeros, nhwc_batch_norm-inl.h:288
        for i, grad in enumerate((dx, d_gamma, d_beta, dy)[:len(in_grad)]):
            self.write(in_grad[i], req[i], grad)


class FusedBatchNormAddRelu(FusedBatchNorm):
    prop_name = "BatchNormAddRelu"

    def check(self, x):
        """Outside NhwcBatchNormAddReluOp::Supports the fork runs its generic kernels (batch_norm_add_relu.cu:
        676-682), which never read the addend nor apply the ReLU (the inference kernel, :208-245, and the training
        one, :247-313, are BatchNorm's): a plain BatchNorm, silently."""
        if not nhwc_bn_supports(self.p, x):
            refuse("BatchNormAddRelu outside float16 NHWC: NVIDIA's fallback kernels (batch_norm_add_relu.cu:"
                   "676-682, kernels :208-313) compute BatchNorm without the addend and the ReLU; the stand-in "
                   "refuses what would be silently wrong")


class BatchNormProp(Prop):
    name, spec, outputs, op = "BatchNorm", BN_PARAMS, ("output",), FusedBatchNorm

    @classmethod
    def validate(cls, params):
        p = super().validate(params)
        if p["output_mean_var"]:
            refuse(f"{cls.name}: the stand-in does not give output_mean_var's outputs (our network never asks)")
        return p

    def infer_shape(self, in_shape):
        data = in_shape[0]
        if self.name == "BatchNormAddRelu" and tuple(in_shape[3]) != tuple(data):
            # SHAPE_ASSIGN_CHECK of addend against data, batch_norm_add_relu.cc:323-324
            refuse(f"Shape inconsistent, Provided = {list(in_shape[3])}, inferred shape={list(data)}")
        c = (data[self.p["axis"]],)
        return [data, c, c] + [data] * (len(in_shape) - 3), [data], [c, c]

    def infer_type(self, in_type):
        """gamma, beta and the statistics float32 for float16 data (batch_norm_add_relu.cc:364-398, BatchNorm's
        the same)."""
        data, param = in_type[0], accreal(in_type[0])
        types = uniform_types(in_type, [data, param, param] + [data] * (len(in_type) - 3), self.list_arguments())
        return types, [data], [param, param]


class BatchNormAddReluProp(BatchNormProp):
    name, spec, op = "BatchNormAddRelu", ADD_RELU_PARAMS, FusedBatchNormAddRelu


# NormConvolution (no_norm) and NormalizedConvolution (no_equiv_scale_bias) -----------------------------------------

def nchw(a):
    return a.transpose((0, 3, 1, 2))


def nhwc(a):
    return a.transpose((0, 2, 3, 1))


class NormConv(StandIn):
    """Convolution (NHWC, no bias) and its output's per-channel sum and sum of squares, which get no gradient (the
    backward node takes the output's gradient only, norm_convolution.cu:119-131).

    NormConvolution without no_norm (NVIDIA's resnet-v1b-mainloop-fl wiring) first applies to its input the
    BatchNorm whose statistics it is given: the previous convolution's sums, finalized into the batch's mean and
    inverse std over data.size / channels values, the running statistics moved in training and used in inference
    (FinalizeForward, cudnn/cudnn_norm_convolution-inl.h:595-663), then scale, bias and act_type, then the
    convolution (Forward, :171-267). Its backward is the convolution's, then NhwcBatchNorm's with the ReLU on the
    data, gamma and beta (:342-446), none on the sums (the fork writes none)."""
    prop_name = "NormConvolution"

    @property
    def normalizes(self):
        return self.prop_name == "NormConvolution" and not self.p["no_norm"]

    def check(self, x):
        """CuDNNNormConvolutionOp::Supports (cudnn/cudnn_norm_convolution-inl.h:455-503, the GPU's compute capability
        as NORMCONV_SM assumes) and its twin (cudnn_normalized_convolution-inl.h:423-471), else the fork's refusal
        (norm_convolution.cu:94-105, 136-152; normalized_convolution.cu:93-99 falls back to a class whose Init
        refuses, normalized_convolution-inl.h:171). 3x3 or 1x1 kernels, any stride; on Volta (SM 70) a 1x1 only
        with stride 1 (cudnn_norm_convolution-inl.h:481-484, cudnn_normalized_convolution-inl.h:449-452): the
        projection shortcut of stages 2-4 (1x1, stride 2) is refused there."""
        p = self.p
        kernels = ((3, 3),) if GPU["sm"] == 70 and p["stride"] != (1, 1) else ((3, 3), (1, 1))
        supported = (p["layout"] == "NHWC" and len(p["kernel"]) == 2 and p["kernel"] in kernels
                     and p["dilate"] == (1, 1) and p["num_group"] == 1 and x.shape[-1] % 32 == 0
                     and p["num_filter"] % 32 == 0 and x.dtype == np.float16 and GPU["sm"] in NORMCONV_SM)
        if not supported:
            refuse((NO_FALLBACK if self.prop_name == "NormConvolution" else CUDNN_ONLY).format(self.prop_name))

    def conv(self, x, w):
        p = self.p
        stock = getattr(nd.Convolution, "stock", nd.Convolution)  # float32 NCHW here: the twin's casts would copy
        return nhwc(stock(nchw(x), nchw(w), kernel=p["kernel"], stride=p["stride"], pad=p["pad"],
                          num_filter=p["num_filter"], no_bias=True))

    def statistics(self, a):
        """The batch's mean and variance from the previous convolution's sums, and the count of values they sum
        (FinalizeForward's training op: elem_count, the data's size over its channels, cudnn_norm_convolution-inl.h:
        654)."""
        count = a["data"].size // a["data"].shape[-1]
        mean = a["in_sum"] / count
        return mean, a["in_sum_squares"] / count - mean * mean, count

    def activation(self, y):
        return nd.relu(y) if self.p["act_type"] == "relu" else y

    def forward(self, is_train, req, in_data, out_data, aux):
        a = dict(zip(self.names, in_data))
        self.check(a["data"])
        x = f32(a["data"])
        if self.normalizes:
            if is_train:
                mean, var, count = self.statistics(a)
                move(aux[0], mean, self.p["momentum"])
                move(aux[1], unbiased(var, count), self.p["momentum"])
            else:  # the inference op: the running statistics (cudnn_norm_convolution-inl.h:628-640)
                mean, var = aux[0], aux[1]
            x = self.activation(normalize(x, mean, 1 / nd.sqrt(var + self.p["eps"]), a["gamma"], a["beta"]))
        y = self.conv(x, f32(a["weight"]))
        axes = (0, 1, 2)
        self.write(out_data[0], req[0], y)
        self.write(out_data[1], req[1], y.sum(axis=axes))
        self.write(out_data[2], req[2], (y * y).sum(axis=axes))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        a = dict(zip(self.names, in_data))
        self.check(a["data"])
        if not self.normalizes and self.p["act_type"] is not None:  # cudnn_norm_convolution-inl.h:414-415,
            refuse(f"Relu activation with {self.mode} not yet supported.")  # normalized :382-383
        # wgrad: "This operator does not support output blending" (cudnn_norm_convolution-inl.h:326-340,
        # normalized :290-306): the weight gradient is overwritten. dgrad adds on kAddTo when only the convolution
        # is present (:349-351, normalized :315-317); applying statistics, the fork refuses it (:352-354), and
        # NhwcBatchNorm's backward overwrites gamma's and beta's (nhwc_batch_norm-inl.h:205-290).
        self.no_add(req, "cudnn/cudnn_norm_convolution-inl.h:326-340, cudnn_normalized_convolution-inl.h:290-306, "
                    "nhwc_batch_norm-inl.h:205-290", names=("weight", "gamma", "beta"))
        if self.normalizes and req[0] == "add":
            refuse("NormConvolution dgrad output summation not supported when applying stats (needs extra conv "
                   "dgrad buffer not yet allocated).")
        x = f32(a["data"])
        grads = {}  # zeros for any input not set below
        applied = x
        if self.normalizes:
            mean, var, _ = self.statistics(a)
            inv_std = 1 / nd.sqrt(var + self.p["eps"])
            pre = normalize(x, mean, inv_std, a["gamma"], a["beta"])
            applied = self.activation(pre)
        w = f32(a["weight"])
        applied.attach_grad()
        w.attach_grad()
        with autograd.record():
            y = self.conv(applied, w)
        y.backward(f32(out_grad[0]))
        grads["data"], grads["weight"] = applied.grad, w.grad
        if self.normalizes:
            d_pre = applied.grad * (pre > 0) if self.p["act_type"] == "relu" else applied.grad
            grads["data"], grads["gamma"], grads["beta"] = bn_backward(d_pre, x, mean, inv_std, a["gamma"])
        for i, name in enumerate(self.names):
            self.write(in_grad[i], req[i], grads.get(name))


# NormConvolution's parameters from 'Finalize', which it reads without no_norm (norm_convolution-inl.h:151-166).
FINALIZE_PARAMS = {"eps": (float, 1e-3), "momentum": (float, 0.9), "fix_gamma": (to_bool, True),
                   "use_global_stats": (to_bool, False), "output_mean_var": (to_bool, False),
                   "output_equiv_scale_bias": (to_bool, False)}


class NormConvProp(Prop):
    name, outputs, op = "NormConvolution", ("output", "sum", "sum_squares"), NormConv
    spec = dict(CONV_PARAMS, no_norm=(to_bool, False), **FINALIZE_PARAMS)

    @classmethod
    def validate(cls, params):
        """Without no_norm, the finalize as NVIDIA's mainloop-fl calls it (fix_gamma=False: resnet-v1b-mainloop-fl.py:
        223, 234), the only one the stand-in models: fix_gamma writes 1 into gamma (cudnn_norm_convolution-inl.h:626);
        use_global_stats, output_mean_var and output_equiv_scale_bias change the op's outputs (:455-467)."""
        p = super().validate(params)
        if not p.get("no_norm", True):
            for name, modelled in (("fix_gamma", False), ("use_global_stats", False), ("output_mean_var", False),
                                   ("output_equiv_scale_bias", False)):
                if p[name] != modelled:
                    refuse(f"NormConvolution without no_norm, {name}={p[name]}: the stand-in models {name}={modelled} "
                           "only (NVIDIA's resnet-v1b-mainloop-fl)")
        return p

    def infer_shape(self, in_shape):
        data, p = in_shape[0], self.p
        if len(data) != 4:  # norm_convolution.cc:130-131
            refuse("Input data should be 4D in batch-num_filter-y-x")
        n, h, w, c = data
        (kh, kw), (sh, sw), (ph, pw) = p["kernel"], p["stride"], p["pad"]
        out = (n, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1, p["num_filter"])
        k = (p["num_filter"],)
        shapes = [data if name == "data" else (p["num_filter"], kh, kw, c) if name == "weight" else (c,)
                  for name in self.list_arguments()]  # norm_convolution.cc:133-150
        return shapes, [out, k, k], [(c,)] * len(self.list_auxiliary_states())

    def infer_type(self, in_type):
        """weight and output of the data's type, the sums float32; without no_norm the sums, gamma, beta and running
        statistics it takes float32 (norm_convolution.cc:203-244)."""
        data = in_type[0]
        names = self.list_arguments()
        expected = [data if name in ("data", "weight") else accreal(data) for name in names]
        aux = [accreal(data)] * len(self.list_auxiliary_states())
        return uniform_types(in_type, expected, names), [data, accreal(data), accreal(data)], aux


class NormalizedConv(NormConv):
    prop_name = "NormalizedConvolution"


class NormalizedConvProp(NormConvProp):
    name, op = "NormalizedConvolution", NormalizedConv
    spec = dict(CONV_PARAMS, no_equiv_scale_bias=(to_bool, False))


# BNStatsFinalize -------------------------------------------------------------------------------------------------
# Two custom operators: MXNet 1.9.1's custom-op backward reads its auxiliary states' storage types at
# stypes[i + num_outs + bwd_deps_size] where it wrote them at [i + num_args + bwd_deps_size]
# (src/operator/custom/custom.cc, BackwardInferStorageType), out of range for an op with more outputs than
# arguments and auxiliary states (BNStatsFinalize: 6, 4, 2): "Storage type inconsistent". So the statistics (sums
# and running statistics -> mean and variance) are one node and the finalize (-> the six outputs) another.

class BatchStats(StandIn):
    """(mean, variance): in training from the sums over elem_count values, the running statistics moved by
    momentum; in inference the running statistics (cudnn_bn_stats_finalize-inl.h:174-204). The sums get no
    gradient (the fork writes none, :245-285)."""
    prop_name = "BNStatsFinalize"

    def check(self):
        if self.p["use_global_stats"]:  # Supports, cudnn_bn_stats_finalize-inl.h:291-293; bn_stats_finalize.cu:96-100
            refuse(NO_FALLBACK.format(self.prop_name))

    def forward(self, is_train, req, in_data, out_data, aux):
        self.check()
        p, (total, squares) = self.p, in_data
        if is_train:
            mean = total / p["elem_count"]
            var = squares / p["elem_count"] - mean * mean
            move(aux[0], mean, p["momentum"])
            move(aux[1], unbiased(var, p["elem_count"]), p["momentum"])
        else:
            mean, var = aux[0], aux[1]
        self.write(out_data[0], req[0], mean)
        self.write(out_data[1], req[1], var)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        for i in (0, 1):
            self.write(in_grad[i], req[i])


class Finalize(StandIn):
    """(equiv_scale, equiv_bias, mean, inv std, gamma, beta) from the batch's mean and variance; gamma and beta pass
    through and take back their gradients (bn_stats_finalize.cc:124-159, cudnn_bn_stats_finalize-inl.h:245-285)."""
    prop_name = "BNStatsFinalize"

    def forward(self, is_train, req, in_data, out_data, aux):
        mean, var, gamma, beta = in_data
        if self.p["fix_gamma"]:
            gamma = nd.ones_like(gamma)  # cudnn_bn_stats_finalize-inl.h:172
        inv_std = 1 / nd.sqrt(var + self.p["eps"])
        scale = gamma * inv_std
        for i, value in enumerate((scale, beta - mean * scale, mean, inv_std, gamma, beta)[:len(out_data)]):
            self.write(out_data[i], req[i], value)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        if not self.p["output_mean_var"]:
            refuse("Expecting output_mean_var true on training graph")  # bn_stats_finalize.cc:127
        for i, name in ((2, "gamma"), (3, "beta")):
            if req[i] == "add":  # cudnn_bn_stats_finalize-inl.h:257-284
                refuse(f"BNStatsFinalize::Backward(): Unexpected req[] for {name} gradient: 3")
            self.write(in_grad[i], req[i], out_grad[i + 2])
        for i in (0, 1):
            self.write(in_grad[i], req[i])


class BatchStatsProp(Prop):
    name, spec, op, outputs = "BNStatsFinalize_stats", STATS_PARAMS, BatchStats, ("mean", "var")

    def list_arguments(self):
        return ["sum", "sum_squares"]

    def list_auxiliary_states(self):
        return ["moving_mean", "moving_var"]

    def infer_shape(self, in_shape):
        c = in_shape[0]
        if len(c) != 1:  # cudnn_bn_stats_finalize-inl.h:325
            refuse("Expecting 1D 'sum' input.")
        return [c, c], [c, c], [c, c]

    def infer_type(self, in_type):
        """Every input float32 (bn_stats_finalize.cc:68-98)."""
        return uniform_types(in_type, [np.float32] * 2, self.list_arguments()), [np.float32] * 2, [np.float32] * 2


class FinalizeProp(Prop):
    name, spec, op = "BNStatsFinalize", STATS_PARAMS, Finalize

    def list_arguments(self):
        return ["mean", "var", "gamma", "beta"]

    def list_auxiliary_states(self):
        return []

    def list_outputs(self):  # FNumVisibleOutputs, bn_stats_finalize.cc:240-244
        names = ["equiv_scale", "equiv_bias", "mean", "var", "gamma_out", "beta_out"]
        return names if self.p["output_mean_var"] else names[:2]

    def infer_shape(self, in_shape):
        c = in_shape[0]
        return [c] * 4, [c] * len(self.list_outputs()), []

    def infer_type(self, in_type):
        """equiv_scale and equiv_bias float16 whatever the inputs, all else float32 (bn_stats_finalize.cc:68-98)."""
        types = uniform_types(in_type, [np.float32] * 4, self.list_arguments())
        return types, [np.float16] * 2 + [np.float32] * (len(self.list_outputs()) - 2), []


def stats_finalize(custom, inputs, name, params):
    """BNStatsFinalize as its two nodes (see above), from its inputs by name."""
    FinalizeProp.validate(params)
    mean_var = custom(inputs["sum"], inputs["sum_squares"], inputs["moving_mean"], inputs["moving_var"],
                      op_type=op_type("BNStatsFinalize_stats"), name=name and f"{name}_stats", **params)
    return custom(mean_var[0], mean_var[1], inputs["gamma"], inputs["beta"], op_type=op_type("BNStatsFinalize"),
                  name=name, **params)


# ScaleBiasAddRelu ------------------------------------------------------------------------------------------------

class ScaleBiasAddRelu(StandIn):
    """relu(x * scale + bias [+ z | + z * z_scale + z_bias]) forward; backward, BatchNorm's from the saved mean and
    inv std with the gamma/beta gradients on x_gamma/x_beta (and z's), none on the scales, biases and statistics
    (cudnn_scale_bias_add_relu-inl.h:268-394). The bitmask output is zeros: the backward reads the ReLU's sign
    from the inputs."""
    prop_name = "ScaleBiasAddRelu"

    def check(self, x):
        """Supports (cudnn_scale_bias_add_relu-inl.h:401-423): NHWC, channels a multiple of 32, float16, the compute
        capability (NORMCONV_SM); else the fork falls back to ScaleBiasAddReluOp, whose Init refuses
        (scale_bias_add_relu.cu:103-109, scale_bias_add_relu-inl.h:185)."""
        if (self.p["layout"] != "NHWC" or x.shape[-1] % 32 != 0 or x.dtype != np.float16
                or GPU["sm"] not in NORMCONV_SM):
            refuse(CUDNN_ONLY.format(self.prop_name))

    def inputs(self, in_data):
        return dict(zip(self.names, in_data))

    def pre_activation(self, a):
        ndim = a["dataX"].ndim
        y = f32(a["dataX"]) * channels(f32(a["x_equiv_scale"]), ndim) + channels(f32(a["x_equiv_bias"]), ndim)
        if "z_equiv_scale" in a:
            return y + f32(a["dataZ"]) * channels(f32(a["z_equiv_scale"]), ndim) + channels(f32(a["z_equiv_bias"]),
                                                                                           ndim)
        return y + f32(a["dataZ"]) if "dataZ" in a else y

    def forward(self, is_train, req, in_data, out_data, aux):
        self.check(in_data[0])
        self.write(out_data[0], req[0], nd.relu(self.pre_activation(self.inputs(in_data))))
        self.write(out_data[1], req[1])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.check(in_data[0])
        # The backward is NhwcBatchNorm(AddRelu)Op::Backward (cudnn_scale_bias_add_relu-inl.h:325-390), which never
        # reads req (nhwc_batch_norm-inl.h:205-290, nhwc_batch_norm_add_relu-inl.h:193-280).
        self.no_add(req, "cudnn/cudnn_scale_bias_add_relu-inl.h:297-390")
        a = self.inputs(in_data)
        dy = f32(out_grad[0]) * (self.pre_activation(a) > 0)
        grads = {}  # zeros for any input not set below
        grads["dataX"], grads["x_gamma"], grads["x_beta"] = bn_backward(dy, f32(a["dataX"]), a["x_mean"],
                                                                        a["x_invvar"], a["x_gamma"])
        if "z_gamma" in a:
            grads["dataZ"], grads["z_gamma"], grads["z_beta"] = bn_backward(dy, f32(a["dataZ"]), a["z_mean"],
                                                                            a["z_invvar"], a["z_gamma"])
        elif "dataZ" in a:
            grads["dataZ"] = dy
        for i, name in enumerate(self.names):
            self.write(in_grad[i], req[i], grads.get(name))


class ScaleBiasAddReluProp(Prop):
    name, spec, outputs, op = "ScaleBiasAddRelu", SBAR_PARAMS, ("output", "bitmask"), ScaleBiasAddRelu

    @classmethod
    def validate(cls, params):
        p = super().validate(params)
        if p["layout"] is None:  # param_.layout.value() of an empty optional, scale_bias_add_relu.cc:97
            refuse("ScaleBiasAddRelu needs layout: its shape inference reads layout.value() "
                   "(scale_bias_add_relu.cc:97)")
        if p["act_type"] != "relu":
            refuse("ScaleBiasAddRelu without act_type='relu': the stand-in models the fused ReLU only")
        return p

    def infer_shape(self, in_shape):
        """The bitmask's size as the fork computes it (scale_bias_add_relu.cc:101-112). Every input's shape is
        checked: the data of one shape, the scales, biases and statistics one per channel. That rule is the
        stand-in's own, stricter than the fork, which compares only x_equiv_scale with x_equiv_bias, in the
        single-scale fused-add mode (cudnn_scale_bias_add_relu-inl.h:579-584)."""
        data = tuple(in_shape[0])
        if len(data) != 4:
            refuse(f"Unexpected Tensor size {len(data)}, supporting only 3, 4 or 5.")
        c, nhw = data[-1], data[0] * data[1] * data[2]
        shapes = [data if name.startswith("data") else (c,) for name in self.list_arguments()]
        for name, got, want in zip(self.list_arguments(), in_shape, shapes):
            if tuple(got) != want:
                refuse(f"Shape inconsistent, Provided = {list(got)}, inferred shape={list(want)} at {name}")
        bitmask = (((c + 63) & ~63) // 32) * ((nhw + 31) & ~31)
        return shapes, [data, (bitmask,)], []

    def infer_type(self, in_type):
        """Data, dataZ and the equiv scales/biases of the data's type, the statistics float32
        (scale_bias_add_relu.cc:116-174)."""
        data = in_type[0]
        expected = [accreal(data) if name[2:] in ("gamma", "beta", "mean", "invvar") else data
                    for name in self.list_arguments()]
        return uniform_types(in_type, expected, self.list_arguments()), [data, np.int32], []


PROPS = {prop.name: prop for prop in (BatchNormProp, BatchNormAddReluProp, NormConvProp, NormalizedConvProp,
                                     BatchStatsProp, FinalizeProp, ScaleBiasAddReluProp)}


def op_type(name):
    return f"standin_{name}"


# ---- the fork's names on mx.sym and mx.nd ------------------------------------------------------------------------

def mode_of(op, kwargs):
    """The mode flags op is called with: each as given, else the fork's default (ScaleBiasAddRelu's dual_scale_bias
    and fused_add are true unless set false, scale_bias_add_relu-inl.h:128-131), as the fork's parser, and so its
    FListInputNames, see them."""
    spec = PROPS[op].spec
    given = {f: kwargs.get(f, spec[f][1] if f in spec else None) for f in MODE_FLAGS}
    return " ".join(f for f, value in given.items() if value not in (None, False, "False", "false", 0, "0"))


def params_of(kwargs):
    """The operator's parameters, a None among them kept: MXNet's generated functions hand every keyword outside
    their signature to the operator's parser, None as "None" (apache/mxnet@1.9.1 python/mxnet/symbol/register.py:
    211-217, ndarray/register.py:204-205, _ctypes/symbol.py:131), which refuses a key the operator lacks and reads
    "None" as the default of one it has (parse_params)."""
    return dict(kwargs)


def symbol_function(op):
    """mx.sym.<op>: inputs composed as MXNet composes a symbol (positionally, then by keyword against the mode's
    FListInputNames; an unknown keyword refused in nnvm's words, a missing input a new free variable named
    <node>_<input>, nnvm/src/core/symbolic.cc Compose)."""
    def compose(*args, name=None, attr=None, **kwargs):
        arrays = {k: kwargs.pop(k) for k in list(kwargs) if isinstance(kwargs[k], mx.sym.Symbol)}
        names = fork_inputs(op, mode_of(op, kwargs))
        for key in arrays:
            if key not in names:
                listed = "".join(f"\t[{i}]{n}\n" for i, n in enumerate(names))
                refuse(f"Keyword argument name {key} not found.\nCandidate arguments:\n{listed}")
        arrays.update(zip(names, args))
        inputs = {n: arrays.get(n, mx.sym.var(f"{name or op.lower()}_{n}")) for n in names}
        with mx.AttrScope(**(attr or {})):
            return builder(op)(mx.sym.Custom, inputs, name, params_of(kwargs))
    compose.__name__ = op
    return compose


def ndarray_function(op):
    """mx.nd.<name>: arrays bound to the NDArray function's declared arguments, positionally or by keyword, and
    handed to the operator in that order (mxnet/ndarray/register.py); an NDArray under an undeclared keyword is
    refused in dmlc's words."""
    declared = ND_ARGUMENTS[op]

    def call(*args, name=None, **kwargs):
        bound = dict(zip(declared, args))
        bound.update({k: kwargs.pop(k) for k in list(kwargs) if k in declared})
        for key, value in kwargs.items():
            if isinstance(value, nd.NDArray):
                refuse(f"Cannot find argument '{key}', Possible Arguments: {', '.join(declared)}, in operator {op}")
        given = [k for k in declared if bound.get(k) is not None]
        mode = mode_of(op, kwargs)
        names = fork_inputs(op, mode)
        if len(given) != len(names):
            refuse(f"{op} takes {len(names)} inputs here, {list(names)}; given {len(given)}")
        # The operator takes the arrays in the declared order, as its inputs of the mode; the ops with
        # statistics declare their inputs under their own names (BatchNormAddRelu's addend after them).
        order = given if aux_names(op, mode) else names
        inputs = {n: bound[k] for n, k in zip(order, given)}
        return builder(op)(nd.Custom, inputs, name, params_of(kwargs))
    call.__name__ = op
    return call


def builder(op):
    """How a stand-in's nodes are made: BNStatsFinalize as two (above); every other as one custom node, its inputs
    in the op's order (arguments, then statistics)."""
    if op == "BNStatsFinalize":
        return stats_finalize

    def build(custom, inputs, name, params):
        PROPS[op].validate(params)
        names = fork_inputs(op, mode_of(op, params))
        return custom(*[inputs[n] for n in names], op_type=op_type(op), name=name, **params)
    return build


def fused_batchnorm(stock, module_function):
    """BatchNorm: with act_type, the stand-in; without, MXNet's own, given NVIDIA's BatchNorm arguments as the fork's
    parser takes them (batch_norm-inl.h:117-127): act_type None (as NVIDIA's Gluon passes it), bn_group 1 and
    xbuf_ptr 0, which the stand-in models (one GPU's statistics; no exchange buffer)."""
    def batchnorm(*args, **kwargs):
        if kwargs.get("act_type") in (None, "None"):
            kwargs.pop("act_type", None)
            for key, plain in (("bn_group", 1), ("xbuf_ptr", 0)):
                value = kwargs.pop(key, plain)
                if str(value) not in (str(plain), "None"):
                    refuse(f"BatchNorm {key}={value}: the stand-in models {key}={plain} only")
            return stock(*args, **kwargs)
        return module_function(*args, **kwargs)
    batchnorm.stock = stock
    batchnorm.__name__ = "BatchNorm"
    return batchnorm


def batchnorm_arguments():
    """BatchNorm's argument names in a stand-in build: stock MXNet's plus act_type, bn_group and xbuf_ptr
    (batch_norm-inl.h:117-127)."""
    return list(mx.operator.get_operator_arguments("BatchNorm").names) + ["act_type", "bn_group", "xbuf_ptr"]


def operator_arguments(op):
    """The argument names the stand-in build gives operator `op` of OPERATORS: the arrays its NDArray function
    declares, then the parameters the stand-in models (a subset of the fork's: those our network passes)."""
    return list(ND_ARGUMENTS[op]) + list(PROPS[op].spec)


def install(sm=80):
    """Register the stand-ins and put them on mx.sym and mx.nd under the fork's names (Gluon's hybrid_forward calls
    F.<name> with F one of those modules); BatchNorm with act_type goes to the stand-in. `sm`: the stood-in GPU's
    compute capability. Idempotent."""
    GPU["sm"] = sm
    if not REGISTERED:
        for name, prop in PROPS.items():
            mx.operator.register(op_type(name))(prop)
        REGISTERED.append(True)
    for module, make in ((mx.sym, symbol_function), (mx.nd, ndarray_function)):
        for name in OPERATORS:
            setattr(module, name, make(name))
        if getattr(module.BatchNorm, "stock", None) is None:
            module.BatchNorm = fused_batchnorm(module.BatchNorm, make("BatchNorm"))
    if not getattr(mx.base.get_last_ffi_error, "standin", False):
        mx.base.get_last_ffi_error = with_refusal(mx.base.get_last_ffi_error)
        mx.operator.print = quiet_refusals(print)
