"""A rank's own device on a machine without GPUs: a model on cpu(1), not the default context cpu(0), with MXNet made
to refuse operators whose arrays live on different contexts, device id included, as a CUDA build refuses a mix of
CPU and GPU arrays. On the CPU an array on the wrong device costs nothing and goes unseen (MXNet's CPU kernels
ignore the device id: src/imperative/imperative_utils.h, GetContext, compares dev_mask only); here it fails where
it meets the others, as gpu(0) against gpu(r) would fail on an 8-GPU node (an illegal memory access there).

Run a command so: `python -m tests.support.devices rn50_mx.train ARGS` (under horovodrun too): each rank's device
is cpu(1 + local rank), none of them the default, and mixed contexts are refused for the whole run."""
import runpy
import sys

import mxnet as mx
from mxnet.ndarray import register

RUN_CONTEXT = mx.cpu(1)  # the stand-in for one rank's GPU: not the default context, which is cpu(0)


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
    return check


def main():
    """Run the module named by the first argument as `python -m` would, on the rank's stand-in device."""
    from rn50_mx import dist

    register._verify_all_legacy_ndarrays = same_context_check(register._verify_all_legacy_ndarrays)
    dist.context = lambda settings, local_rank: mx.cpu(1 + local_rank)  # where dist.context would give gpu(r)
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
