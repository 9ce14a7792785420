"""Each rank's GPU stood in for by a CPU context of its own, with MXNet made to refuse what a CUDA build refuses.

A rank's stand-in device is cpu(1 + local rank), never the default context cpu(0), and MXNet's NDArray operators
refuse inputs and outputs on different contexts, device id included, as a CUDA build refuses a mix of CPU and GPU
arrays. On the CPU an array on the wrong device otherwise costs nothing and goes unseen (MXNet's CPU kernels ignore
the device id: src/imperative/imperative_utils.h, GetContext, compares dev_mask only); here it fails where it meets
the others, as gpu(0) against gpu(r) fails on an 8-GPU node (an illegal memory access there). A hybridized network
needs no help: its CachedOp already refuses inputs on different contexts, device id included (MXNet 1.9.1
src/imperative/cached_op.cc, Forward: "CachedOp requires all inputs to live on the same context"). An array
saved from a stand-in device is refused (host_save).

A fake device: it shows where arrays are made, copied and mixed, never a GPU's memory, speed or numerics."""
import mxnet as mx
from mxnet.ndarray import register



def device(local_rank):
    """The stand-in for GPU `local_rank` of this node."""
    return mx.cpu(1 + local_rank)


def same_context_check(verify):
    """MXNet's argument check of its NDArray operators, `verify` (mxnet/ndarray/register.py), plus: inputs and
    outputs on one context; _copyto, the operator that moves data between devices (copyto, as_in_context), is the
    exception, as in a CUDA build, where it refuses a change of type on the way."""
    def check(op_name, func_name, args, out):
        verify(op_name, func_name, args, out)
        arrays = [a for a in list(args) + (list(out) if isinstance(out, (list, tuple)) else [out])
                  if isinstance(a, mx.nd.NDArray)]
        contexts = {a.context for a in arrays}
        if op_name == "_copyto":  # across devices, only within one type (ndarray_function.cu, Copy<cpu, gpu>)
            if len(contexts) > 1 and len({a.dtype for a in arrays}) > 1:
                raise mx.MXNetError("Source and target must have the same data type when copying across devices.")
            return
        if len(contexts) > 1:
            raise mx.MXNetError(f"Operator {op_name} require all inputs live on the same context: {contexts}")
    check.strict = True
    return check


def host_save(save):
    """mx.nd.save, `save`, refusing an array on a stand-in device. A GPU build's mx.nd.load puts each array back on
    the device it was saved from, in every process that loads the file (MXNet 1.9.1 src/ndarray/ndarray.cc,
    NDArray::Load: `temp.Copy(ctx)`), so a checkpoint saved from rank 0's GPU allocates on GPU 0 in every rank (GPU
    review 3, F2); the CPU build loads a CPU context's array onto cpu(0) whatever its device id (the same function),
    so the load cannot show it here: the save, where the device is still known, does."""
    def checked(fname, data):
        arrays = data.values() if isinstance(data, dict) else data if isinstance(data, (list, tuple)) else [data]
        devices = sorted({str(a.context) for a in arrays if a.context != mx.cpu()})
        if devices:
            raise mx.MXNetError(f"{fname}: arrays saved from the stand-in device {', '.join(devices)}: a GPU build's "
                                "mx.nd.load puts them back on that GPU, not on the loading rank's (save host copies)")
        return save(fname, data)
    checked.strict = True
    return checked


def install():
    """From now on in this process, mixed contexts are refused, and saving a device's arrays; idempotent."""
    if not getattr(register._verify_all_legacy_ndarrays, "strict", False):
        register._verify_all_legacy_ndarrays = same_context_check(register._verify_all_legacy_ndarrays)
    if not getattr(mx.nd.save, "strict", False):
        mx.nd.save = host_save(mx.nd.save)
