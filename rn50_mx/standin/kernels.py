"""CPU twins of the stock operators that MXNet 1.9.1's CPU build cannot run on the GPU path's arrays.

Measured on the CPU build: Convolution has no float16 kernel ("FP16 gemm on cpu not implemented") and no NHWC one
(MKLDNN: "could not create a descriptor"; without it: "Only support NCW, NCHW and NCDHW layout"); FullyConnected has
no float16 kernel. BatchNorm (axis 3, float16 data with float32 parameters), Pooling (NHWC, float16), Activation,
softmax and topk run as they are. Each twin computes its operator in float32 and NCHW, then casts the result to the
weight's type (float16 in, float16 out; the weight's, as a traced graph knows it from the variable's __dtype__ before
any data: amp_multicast, which would take the data's, has no float16 CPU kernel under MKLDNN, "unknown type for
MKLDNN :2"). The casts are Cast, not amp_cast, which HybridBlock.export leaves out of the saved symbol
(Symbol.save's remove_amp_cast). So the gradients reaching the weights have the weights' type, as on the GPU. A cast
where the CPU has no kernel, said so: cuDNN's and cuBLAS's float16 arithmetic is not reproduced, only the types and
shapes that flow around it."""
import mxnet as mx
import numpy as np
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP

TWINS = ("Convolution", "FullyConnected")
# The arguments NVIDIA's Convolution and FullyConnected declare beyond stock MXNet's, all choices of cuDNN's or
# cuBLAS's algorithm and precision (sneaxiy/NVIDIA-MxNet@ce30b18 src/operator/nn/convolution-inl.h:106-147,
# fully_connected-inl.h:87-120): its Gluon passes some of them (standin/python_layer.py); a twin takes them, as the
# fork's parser does, and leaves them out of the CPU kernel they do not apply to.
FORK_ARGUMENTS = {
    "Convolution": ("cudnn_tensor_core", "cudnn_tensor_core_only", "cudnn_algo_verbose", "cudnn_algo_fwd",
                    "cudnn_algo_bwd_data", "cudnn_algo_bwd_filter", "cudnn_algo_fwd_prec", "cudnn_algo_bwd_prec"),
    "FullyConnected": ("cublas_algo_verbose", "cublas_off", "cublas_tensor_core", "cublas_algo_fwd",
                       "cublas_algo_bwd_data", "cublas_algo_bwd_weights", "cublas_algo_fwd_prec",
                       "cublas_algo_bwd_prec"),
}
NHWC_TO_NCHW, NCHW_TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def twin(module, name):
    """`module.name` (mx.sym or mx.nd) computed in float32, NCHW, its output in the data's type and layout."""
    stock = getattr(module, name)

    def call(data, weight=None, bias=None, **kwargs):
        for key in FORK_ARGUMENTS[name]:
            kwargs.pop(key, None)
        if weight is None:  # Gluon's layers infer their weight shapes from a call with the data alone
            return stock(data, **kwargs)
        nhwc = kwargs.get("layout") == "NHWC"
        x, w = (module.Cast(a, dtype="float32") for a in (data, weight))
        if nhwc:
            x, w = x.transpose(NHWC_TO_NCHW), w.transpose(NHWC_TO_NCHW)
            kwargs["layout"] = "NCHW"
        extra = [] if bias is None else [module.Cast(bias, dtype="float32")]
        out = stock(x, w, *extra, **kwargs)
        if nhwc:
            out = out.transpose(NCHW_TO_NHWC)
        return module.Cast(out, dtype=dtype_of(weight))
    call.stock = stock
    return call


def dtype_of(array):
    """The type name of an NDArray, or of a symbol variable declared with one (Gluon's Parameter.var); float32
    when a symbol does not say."""
    if isinstance(array, mx.nd.NDArray):
        return np.dtype(array.dtype).name
    code = array.attr("__dtype__")
    return np.dtype(_DTYPE_MX_TO_NP[int(code)]).name if code is not None else "float32"


def install():
    """mx.sym's and mx.nd's Convolution and FullyConnected replaced by their twins, which take NVIDIA's arguments
    too (Gluon's layers call getattr(F, name) with F one of the two modules); idempotent."""
    for module in (mx.sym, mx.nd):
        for name in TWINS:
            if not hasattr(getattr(module, name), "stock"):
                setattr(module, name, twin(module, name))
