"""NVIDIA's Python layer stood in for: what NVIDIA's MXNet changes in the parts of `mxnet`'s Python package that
rn50_mx reaches, put onto stock MXNet 1.9.1's so that a rehearsal makes the project's calls through it.

A FAKE, named as one. Source: NVIDIA's fork as mirrored in sneaxiy/NVIDIA-MxNet @ ce30b18 (MXNet 1.8.0 plus NVIDIA's
changes; its only public version), read against the mxnet 1.8.0 wheel (to tell NVIDIA's changes from 1.8 -> 1.9.1's)
and against 1.9.1; docs/rehearsal.md lists every file compared. What it reproduces, each where the project's path
meets it (the line numbers are the fork's, under python/mxnet/):
- Gluon's layers hand NVIDIA's extra operator arguments on (the operators' side: kernels.py and ngc.py take them):
  BatchNorm's `_kwargs` hold act_type (None unless given), bn_group and xbuf_ptr (gluon/nn/basic_layers.py:344-348);
  Conv2D's hold eight cuDNN algorithm choices (gluon/nn/conv_layers.py:127-131, 147-156); Dense passes
  cublas_algo_fwd_prec, None unless given (gluon/nn/basic_layers.py:202, 221, 226).
- The optimizers: Updater.__call__ hands every tensor of one dtype to update_multi_precision in ONE call, where stock
  MXNet cuts the call into MXNET_OPTIMIZER_AGGREGATION_SIZE pieces (optimizer/optimizer.py:2208-2220); SGD cuts its
  multi-tensor kernel calls itself (:629-672); the multi-tensor LARS kernels are lars_multi_* and stock's
  preloaded_multi_* are not there (:34-38; src/operator/lars_multi_sgd.cc:38, 75, 136, 184), and their kernel
  parameters hold 60 tensors with no check of num_weights (src/operator/lars_multi_sgd-inl.h:155-160, 222-224).
Parameter, Trainer, autograd, the generated operator functions' keyword handling (ndarray/register.py,
symbol/register.py, _ctypes/), kvstore and HybridBlock (block.py is 1.8.0's, unchanged by NVIDIA) differ from
1.9.1's in nothing the project reaches; Horovod's MXNet binding is not part of mxnet (the fork bundles Horovod
0.21.3, whose calls rn50_mx makes alike)."""
import mxnet as mx
import numpy as np
from mxnet import optimizer
from mxnet.gluon.nn import basic_layers, conv_layers

BATCHNORM_KEYS = {"act_type": None, "bn_group": 1, "xbuf_ptr": 0}  # gluon/nn/basic_layers.py:344-348
CONV_KEYS = {"cudnn_algo_fwd": -1, "cudnn_algo_bwd_data": -1, "cudnn_algo_bwd_filter": -1,
             "cudnn_tensor_core_only": False, "cudnn_algo_verbose": False, "cudnn_algo_fwd_prec": "None",
             "cudnn_algo_bwd_prec": "None", "workspace": 1024}  # gluon/nn/conv_layers.py:127-131, 147-156
DENSE_KEYS = {"cublas_algo_fwd_prec": None}  # gluon/nn/basic_layers.py:202, 221, 226
# The multi-tensor LARS kernels under their fork names, from stock MXNet's under theirs (the same inputs: weight,
# grad[, mom][, weight32] per tensor, then lrs and wds; src/operator/lars_multi_sgd.cc FListInputNames).
LARS_KERNELS = {f"lars_multi_{kind}_update": f"preloaded_multi_{kind}_update"
                for kind in ("sgd", "sgd_mom", "mp_sgd", "mp_sgd_mom")}
KERNEL_TENSORS = 60  # LARSMultiSGDKernelParam::N (src/operator/lars_multi_sgd-inl.h:156)


def with_keys(init, keys, where=None):
    """A layer's __init__ that takes NVIDIA's extra keywords `keys` (their defaults) and keeps them in `_kwargs`
    (for `where(layer)` only, when given)."""
    def __init__(self, *args, **kwargs):
        extra = {k: kwargs.pop(k, default) for k, default in keys.items()}
        init(self, *args, **kwargs)
        if where is None or where(self):
            self._kwargs.update(extra)
    __init__.stock = init
    return __init__


def dense_init(init):
    """Dense.__init__ keeping cublas_algo_fwd_prec (basic_layers.py:202, 221)."""
    def __init__(self, *args, cublas_algo_fwd_prec=None, **kwargs):
        init(self, *args, **kwargs)
        self.cublas_algo_fwd_prec = cublas_algo_fwd_prec
    __init__.stock = init
    return __init__


def dense_forward(self, F, x, weight, bias=None):
    """Dense's forward as the fork's: FullyConnected given cublas_algo_fwd_prec (basic_layers.py:226)."""
    out = F.FullyConnected(x, weight, bias, no_bias=bias is None, num_hidden=self._units, flatten=self._flatten,
                           cublas_algo_fwd_prec=self.cublas_algo_fwd_prec, name="fwd")
    return self.act(out) if self.act is not None else out


def whole_dtype_groups(stock):
    """Updater.__call__ as the fork's (optimizer.py:2183-2220): the states made as stock MXNet makes them, then one
    update_multi_precision call per dtype with all of its tensors (stock cuts it into aggregate_num pieces)."""
    def __call__(self, index, grad, weight):
        if not isinstance(index, (list, tuple)) or not self.aggregate_updates:
            return stock(self, index, grad, weight)
        if weight:
            self.optimizer._set_current_context(weight[0].context.device_id)
        for i, w in zip(index, weight):
            if i not in self.states:
                self.states[i] = self.optimizer.create_state_multi_precision(i, w)
            elif not self.states_synced[i]:
                self.states[i] = self.sync_state_context(self.states[i], w.context)
            self.states_synced[i] = True
        groups = {}
        for i, w, g in zip(index, weight, grad):
            groups.setdefault(w.dtype, []).append((i, w, g))
        for members in groups.values():
            indices, weights, grads = (list(column) for column in zip(*members))
            self.optimizer.update_multi_precision(indices, weights, grads, [self.states[i] for i in indices])
    __call__.stock = stock
    return __call__


def sgd_in_pieces(stock):
    """SGD._update_impl cutting its multi-tensor calls into aggregate_num pieces itself (optimizer.py:629-672), as
    the fork's Updater no longer does."""
    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        if not isinstance(indices, (list, tuple)) or self.aggregate_num <= 0:
            return stock(self, indices, weights, grads, states, multi_precision=multi_precision)
        step = self.aggregate_num
        for start in range(0, len(indices), step):
            piece = slice(start, start + step)
            stock(self, indices[piece], weights[piece], grads[piece], states[piece], multi_precision=multi_precision)
    _update_impl.stock = stock
    return _update_impl


def lars_kernel(name, stock, wide=None):
    """mx.nd.<name>, the fork's multi-tensor LARS kernel, computed by stock MXNet's preloaded_multi_* twin one tensor a
    call; more than KERNEL_TENSORS tensors refused: the fork's kernel parameters hold 60 and it writes past them
    unchecked.

    One call a tensor, because the stock kernel's CPU launch is max_size x count: each of its max_size threads visits
    every tensor of the call (apache/mxnet 1.9.1 src/operator/contrib/preloaded_multi_sgd-inl.h, PreloadedMultiSGDKernel
    ::Map's loop over param.count, launched over param.max_size by PreloadedMultiSGDMomUpdate). 60 tensors whose
    largest is a 3x3x512x512 weight cost 141M visits for 25M values: ResNet-50's float16 update took 320 CPU-ms on one
    core, 268 so (about 4% of a 1.3 CPU-s stand-in step). Each value's update reads only its own tensor's entries and
    its lr and wd, so the split computes the same floats.

    `wide`, for a multi-precision kernel: stock's float32 kernel of the same update. A float16 tensor's update then
    runs on its float32 master between two casts (the gradient widened, the master rounded into the weight), where
    stock's multi-precision CPU kernel converts every float16 value on its own: 227 CPU-ms a step for ResNet-50's
    25.6M values against 105 (one core). The kernel widens the gradient and rounds the master as the casts do, so
    the floats are the same bit for bit (tests/test_standin.py compares both with the stock kernel's)."""
    def call(*data, num_weights, out=None, **kwargs):
        count = int(num_weights)
        if count > KERNEL_TENSORS:
            raise mx.MXNetError(f"{name}: num_weights={num_weights}, more than the {KERNEL_TENSORS} tensors NVIDIA's "
                                "kernel holds (src/operator/lars_multi_sgd-inl.h:156, unchecked: it would write past "
                                "them); the stand-in refuses what would be silently wrong")
        outs = out if isinstance(out, (list, tuple)) else [out]
        if out is None or count < 1 or len(outs) != count or (len(data) - 2) % count:  # new arrays, or stock's refusal
            return stock(*data, num_weights=num_weights, out=out, **kwargs)
        stride, (lrs, wds) = (len(data) - 2) // count, data[-2:]
        for k in range(count):
            tensor, lr, wd = data[k * stride:(k + 1) * stride], lrs[k:k + 1], wds[k:k + 1]
            if wide is not None and on_master(tensor, outs[k]):
                master = tensor[-1]
                wide(master, mx.nd.amp_cast(tensor[1], dtype="float32"), *tensor[2:-1], lr, wd, out=master,
                     num_weights=1, **kwargs)
                mx.nd.amp_cast(master, dtype="float16", out=outs[k])
            else:
                stock(*tensor, lr, wd, out=outs[k], num_weights=1, **kwargs)
        return out
    call.__name__ = name
    return call


def on_master(tensor, out):
    """Whether a multi-precision kernel's tensor (weight, gradient[, momentum], master) and its output are the float16
    and float32 arrays the update on the master takes; any other call goes to the stock kernel and its checks."""
    dtypes = [np.dtype(a.dtype) for a in (*tensor, out)]
    half, single = np.dtype(np.float16), np.dtype(np.float32)
    return dtypes[:2] == [half, half] and all(d == single for d in dtypes[2:-1]) and dtypes[-1] == half


def install():
    """NVIDIA's Python layer on this process's stock MXNet (see the module's docstring); idempotent."""
    if hasattr(basic_layers._BatchNorm.__init__, "stock"):
        return
    basic_layers._BatchNorm.__init__ = with_keys(basic_layers._BatchNorm.__init__, BATCHNORM_KEYS)
    conv_layers._Conv.__init__ = with_keys(conv_layers._Conv.__init__, CONV_KEYS,
                                           where=lambda layer: layer._op_name == "Convolution")
    basic_layers.Dense.__init__ = dense_init(basic_layers.Dense.__init__)
    basic_layers.Dense.hybrid_forward = dense_forward
    optimizer.Updater.__call__ = whole_dtype_groups(optimizer.Updater.__call__)
    optimizer.SGD._update_impl = sgd_in_pieces(optimizer.SGD._update_impl)
    stock = {name: getattr(mx.nd, name) for name in LARS_KERNELS.values()}
    for fork_name, stock_name in LARS_KERNELS.items():
        setattr(mx.nd, fork_name, lars_kernel(fork_name, stock[stock_name], stock.get(stock_name.replace("_mp_", "_"))
                                              if "_mp_" in stock_name else None))
        delattr(mx.nd, stock_name)


def removed_operators():
    """The stock operators a stand-in build lacks, as NVIDIA's does (LARS_KERNELS)."""
    return tuple(LARS_KERNELS.values())
