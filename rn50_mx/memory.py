"""Device memory one training process needs, from the config's real shapes: what the recipe and the self-test state
against a GPU's memory.

    input        data.input_memory: DALI's prefetch queue and the MXNet buffers, of train and val
    weights      every parameter, the gradient of each trainable one, and the optimizer's states (momentum; in
                 float16 also the float32 master copy), from the network's real parameter shapes and dtypes; with
                 --ema-decay also the weight EMA's float32 averages and its copy of the live weights (ema_bytes)
    activations  the output of every operator of the network's symbol at the config's batch and dtype: what
                 backward may keep. An estimate: MXNet's memory planner shares some of them in place (an upper
                 figure there), and MXNet's fused BatchNorm kernels, where the build has them, make fewer outputs.

Not counted: cuDNN's workspaces, DALI's decoder and resize scratch, the CUDA context and NCCL's buffers.
"""
import collections

import numpy as np

GIB = 1 << 30
CLOSE = 0.85  # share of the GPU's memory above which what is not counted (above: GiBs on a large GPU) may not fit

Need = collections.namedtuple("Need", "input weights activations")


def need(s):
    """The Need (bytes) of one process of settings `s`: the network built on the CPU, its symbol's shapes inferred
    at s.batch_size (nothing of the batch's size is allocated)."""
    import mxnet as mx

    from . import data, model

    net = model.build_model(s, mx.cpu(), drawn=False)  # shapes and dtypes only
    return Need(data.input_memory(s), weight_bytes(net) + ema_bytes(net, s), activation_bytes(net, s))


def weight_bytes(net):
    """Parameters, the gradients of the trainable ones and their optimizer states (optim.LARS: momentum in the
    weight's dtype; a float16 or bfloat16 weight under multi-precision keeps float32 momentum and a float32 master
    copy)."""
    from .model import is_low_precision

    total = 0
    for p in net.collect_params().values():
        size, itemsize = int(np.prod(p.shape)), np.dtype(p.dtype).itemsize
        total += size * itemsize
        if p.grad_req != "null":
            mixed = is_low_precision(p.dtype)  # low-precision runs are multi-precision (optim.make_optimizer)
            total += size * itemsize + (2 * size * 4 if mixed else size * itemsize)
    return total


def ema_bytes(net, s):
    """What the weight EMA (ema.EMA) holds when --ema-decay is on: a float32 average of every parameter and a copy of
    each in its own dtype, where the live weights wait during an eval."""
    if not s.ema_decay:
        return 0
    return sum(int(np.prod(p.shape)) * (4 + np.dtype(p.dtype).itemsize) for p in net.collect_params().values())


def activation_bytes(net, s):
    """The outputs of every operator of the network's symbol (not its inputs and parameters) at the config's batch
    shape and dtype."""
    import mxnet as mx

    from . import data

    symbol = net(mx.sym.var("data"))
    internals = symbol.get_internals()
    _, shapes, _ = internals.infer_shape(data=data.batch_shape(s))
    _, dtypes, _ = internals.infer_type(data=np.dtype(s.input_dtype))
    inputs = set(symbol.list_arguments()) | set(symbol.list_auxiliary_states())
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize
               for name, shape, dtype in zip(internals.list_outputs(), shapes, dtypes) if name not in inputs)


def words(n, memory=None, gpu=""):
    """The Need in one line, against `memory` bytes of the GPU named `gpu` when given (with a verdict)."""
    total = sum(n)
    line = (f"{total / GIB:.1f} GiB per process: input {n.input / GIB:.2f}, weights, gradients and optimizer states "
            f"{n.weights / GIB:.2f}, activations {n.activations / GIB:.1f} (estimate)")
    if memory is None:
        return line
    line += f" of the {gpu or 'GPU'}'s {memory / GIB:.1f} GiB"
    if total > memory:
        return line + ": does not fit, lower the batch"
    if total > CLOSE * memory:
        return line + (f": {total / memory:.0%} of it, close to the limit: the CUDA context, cuDNN's workspace, NCCL's "
                       "and DALI's buffers are not counted (lower the batch if it runs out of memory)")
    return line + f": {total / memory:.0%} of it"
