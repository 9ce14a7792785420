"""NVIDIA's NGC MXNet operators that stock MXNet 1.9.1 lacks, stood in for on CPU: another build's operator
registry, the NormConv operators (NormConvolution, NormalizedConvolution, BNStatsFinalize, ScaleBiasAddRelu) as we
read their definitions in NVIDIA's fork, called as NDArray functions or traced as a symbol. A fake with its own
semantics, named as one: it checks the network's wiring against our reading of the fork, not NVIDIA's kernels."""
import mxnet as mx
from mxnet import autograd, nd

from rn50_mx.standin.ngc import ND_ARGUMENTS, bn_backward, channels, fork_inputs, mode_of


class Registry:
    """What another MXNet build's operator registry answers (an NGC build has the fused BatchNorm kernels)."""

    def __init__(self, bn_arguments, operators):
        self.bn_arguments, self.operators = bn_arguments, operators

    def arguments_of(self, name):
        assert name == "BatchNorm"
        return mx.operator.get_operator_arguments(name)._replace(names=self.bn_arguments)


class ScaleBiasAddReluFn(autograd.Function):
    """relu(x * scale + bias [+ z | + z * z_scale + z_bias]) forward; BatchNorm's full backward from the saved
    statistics, with the gamma/beta gradients on the gamma/beta inputs and none on the scale, bias, mean and inv std
    (scale_bias_add_relu.cc; cudnn_scale_bias_add_relu-inl.h, Backward).

    The inputs are the differentiable ones (x, gamma, beta [, z [, z_gamma, z_beta]]); the constants come to the
    constructor as {side: (scale, bias, mean, inv_std)}: MXNet 1.9's Function stops writing input gradients at the
    first input that needs none (mxnet/autograd.py, backward_entry)."""

    def __init__(self, constants):
        super().__init__()
        self.constants = constants

    def forward(self, *inputs):
        pre = nd.zeros_like(inputs[0])
        for side, data in (("x", inputs[0]), ("z", inputs[3] if len(inputs) > 3 else None)):
            if side in self.constants:
                scale, bias = self.constants[side][:2]
                pre = pre + data * channels(scale, 4) + channels(bias, 4)
            elif data is not None:
                pre = pre + data  # fused_add without dual_scale_bias: the shortcut as it is
        self.save_for_backward(inputs, pre > 0)
        return nd.relu(pre)

    def backward(self, dy):
        inputs, mask = self.saved_tensors
        dy = dy * mask
        grads = list(bn_backward(dy, inputs[0], *self.constants["x"][2:], inputs[1]))
        if "z" in self.constants:
            grads += bn_backward(dy, inputs[3], *self.constants["z"][2:], inputs[4])
        elif len(inputs) > 3:
            grads.append(dy)
        return tuple(grads)


class NdarrayConvention:
    """The fused operators called as NDArray functions, as MXNet's generated ndarray functions take keywords
    (mxnet/ndarray/register.py): an NDArray keyword the op does not declare is refused."""

    def __getattr__(self, op):
        def call(**kwargs):
            declared = ND_ARGUMENTS[op]
            for name, value in kwargs.items():
                if isinstance(value, nd.NDArray) and name not in declared:
                    raise mx.MXNetError(f"Cannot find argument '{name}' of {op}")
            return getattr(NormConvOps, op)(**kwargs)
        return call


class NormConvOps:
    """NVIDIA's NormConv operators as we read their definitions (NVIDIA's MXNet fork, src/operator/nn/:
    norm_convolution.cc, normalized_convolution.cc, bn_stats_finalize.cc, scale_bias_add_relu.cc and their cuDNN
    classes), from stock operators, on CPU, imperative: what another build's registry would compute for a traced
    graph, its inputs passed by their symbol names. It checks the network's wiring against that reading (through
    Bottleneck.normconv_forward), not NVIDIA's kernels."""

    @staticmethod
    def _conv_stats(data, weight, act_type, kernel, stride, pad, num_filter, layout):
        """Convolution, and its output's per-channel sum and sum of squares, which get no gradient (the backward
        node takes the output's gradient only: NormalizedConvolutionGrad, NormConvolutionGrad)."""
        assert act_type is None and layout == "NHWC"
        nchw = nd.Convolution(data.transpose((0, 3, 1, 2)), weight.transpose((0, 3, 1, 2)), kernel=kernel,
                              stride=stride, pad=pad, num_filter=num_filter, no_bias=True)
        out = nchw.transpose((0, 2, 3, 1))
        stats = out.detach()
        return out, stats.sum(axis=(0, 1, 2)), (stats * stats).sum(axis=(0, 1, 2))

    @classmethod
    def NormConvolution(cls, no_norm, data, **kwargs):
        """no_norm: a convolution and its sums (both wirings' conv1); else (mainloop-fl's conv2 and conv3) the
        BatchNorm of the sums and statistics it is given, finalized over the data's pixels and applied with the
        ReLU to the data first (cudnn_norm_convolution-inl.h, FinalizeForward, Forward, Backward)."""
        if no_norm:
            return cls._conv_stats(data=data, **kwargs)
        assert kwargs.pop("act_type") == "relu"
        names = ("gamma", "beta", "moving_mean", "moving_var", "eps", "momentum", "fix_gamma")
        stats = cls.BNStatsFinalize(sum=kwargs.pop("in_sum"), sum_squares=kwargs.pop("in_sum_squares"),
                                    **{k: kwargs.pop(k) for k in names}, output_mean_var=True,
                                    elem_count=data.size // data.shape[-1])
        applied = ScaleBiasAddReluFn({"x": stats[:4]})(data, stats[4], stats[5])
        return cls._conv_stats(data=applied, act_type=None, **kwargs)

    @classmethod
    def NormalizedConvolution(cls, no_equiv_scale_bias, **kwargs):
        assert no_equiv_scale_bias
        return cls._conv_stats(**kwargs)

    @staticmethod
    def BNStatsFinalize(sum, sum_squares, gamma, beta, moving_mean, moving_var, eps, momentum, fix_gamma,
                        output_mean_var, elem_count):
        """(equiv_scale, equiv_bias, saved mean, saved inv std, gamma, beta); in training, the batch statistics
        from the sums over elem_count values, and the running statistics moved by momentum."""
        assert not fix_gamma and output_mean_var
        if autograd.is_training():
            mean = sum / elem_count
            var = sum_squares / elem_count - mean * mean
            with autograd.pause():
                moving_mean[:] = moving_mean * momentum + mean * (1 - momentum)
                moving_var[:] = moving_var * momentum + var * (1 - momentum)
        else:
            mean, var = moving_mean.copy(), moving_var.copy()
        inv_std = 1 / nd.sqrt(var + eps)
        scale = gamma.detach() * inv_std
        return scale, beta.detach() - mean * scale, mean, inv_std, gamma, beta

    @staticmethod
    def ScaleBiasAddRelu(dataX, x_equiv_scale, x_equiv_bias, x_gamma, x_beta, x_mean, x_invvar, act_type, layout,
                         dual_scale_bias=True, fused_add=True, dataZ=None, **z):  # scale_bias_add_relu-inl.h:128-131
        assert act_type == "relu" and layout == "NHWC" and (dataZ is not None) == fused_add
        inputs = [dataX, x_gamma, x_beta]
        constants = {"x": (x_equiv_scale, x_equiv_bias, x_mean, x_invvar)}
        if fused_add:
            inputs.append(dataZ)
        if dual_scale_bias:
            inputs += [z["z_gamma"], z["z_beta"]]
            constants["z"] = tuple(z[f"z_{k}"] for k in ("equiv_scale", "equiv_bias", "mean", "invvar"))
        out = ScaleBiasAddReluFn(constants)(*inputs)
        return out, out > 0


class TraceOps:
    """Stands in for the fused operators while the network is traced as a symbol: each call must hand the op exactly
    its inputs by the names the fork lists for that mode (rn50_mx.standin.ngc.INPUTS: a misspelt one would become a new,
    uninitialised variable on the GPU), and each output depends on every input it was given, so the traced graph's
    inputs show which variables the fused path hands them."""
    OUTPUTS = {"NormConvolution": 3, "NormalizedConvolution": 3, "BNStatsFinalize": 6, "ScaleBiasAddRelu": 2}

    def __getattr__(self, op):
        def call(**kwargs):
            names = {k for k, v in kwargs.items() if isinstance(v, mx.sym.Symbol)}
            assert names == set(fork_inputs(op, mode_of(op, kwargs))), (op, sorted(names))
            used = [mx.sym.sum(v) for v in kwargs.values() if isinstance(v, mx.sym.Symbol)]
            return [mx.sym.add_n(*used)] * self.OUTPUTS[op]
        return call
