"""A stand-in GPU build on the CPU: what `python -m rn50_mx.rehearse` runs a GPU config's code path on.

Four fakes, each named as one, none of which can say anything about a GPU's speed, memory or numerics:
- devices.py: each rank's GPU is a CPU context of its own, cpu(1 + local rank), mixed contexts refused;
- kernels.py: float32 NCHW twins of the stock operators MXNet's CPU build has no float16 or NHWC kernel for;
- ngc.py: NVIDIA's fused operators (the NGC build's BatchNorm with act_type, BatchNormAddRelu and the NormConv
  family), computing the same function in float32 and refusing what the fork's kernels refuse, on a GPU of the
  compute capability RN50_STANDIN_SM says;
- python_layer.py: NVIDIA's changes to mxnet's Python package where rn50_mx meets them (Gluon's layers' arguments,
  the optimizers' Updater, the multi-tensor LARS kernels' names).

The setting --standin (RN50_STANDIN) chooses it, so that every process of a run, its horovodrun ranks and the
self-test's workers alike, installs it: `devices` the stand-in devices alone (the tests' CPU runs on cpu(1 + local
rank)), `gpu` the whole build (the rehearsal). dist.context installs it and returns the rank's stand-in device;
the registry queries (model's and optim's kernels, the self-test's build rows) and the stood-in GPU's compute
capability are the only other things asked of it.
"""
import mxnet as mx

from . import devices, kernels

_ops = {"installed": False}


def use(kind, local_rank, sm=80):
    """Install the stand-in `kind` ("devices" or "gpu", the latter on a GPU of compute capability `sm`, major * 10 +
    minor) in this process; returns the rank's stand-in device."""
    devices.install()
    if kind == "gpu":
        from . import ngc, python_layer

        kernels.install()
        ngc.install(sm)
        python_layer.install()
        _ops["installed"] = True
    return devices.device(local_rank)


def operators():
    """The operator names of this build: MXNet's registry, or the stand-in build's when stood in for (NVIDIA's fused
    operators and LARS kernels in, the stock LARS kernels out)."""
    names = list(mx.operator.get_all_registered_operators())
    if _ops["installed"]:
        from . import ngc, python_layer
        removed = set(python_layer.removed_operators())
        names = [n for n in names if n not in removed] + list(ngc.OPERATORS) + list(python_layer.LARS_KERNELS)
    return names


def operator_arguments(name):
    """The argument names of operator `name` (mx.operator.get_operator_arguments' tuple), the stand-in build's when
    stood in for: BatchNorm with NVIDIA's act_type, bn_group and xbuf_ptr, and NVIDIA's fused operators."""
    if _ops["installed"]:
        from . import ngc
        if name == "BatchNorm":
            return mx.operator.get_operator_arguments(name)._replace(names=list(ngc.batchnorm_arguments()))
        if name in ngc.OPERATORS:
            names = ngc.operator_arguments(name)
            return mx.operator.get_operator_arguments("BatchNorm")._replace(
                names=names, types=[""] * len(names), narg=len(names))
    return mx.operator.get_operator_arguments(name)


def compute_capability():
    """The stood-in GPU's compute capability, (major, minor), or None outside a stand-in build."""
    if not _ops["installed"]:
        return None
    from . import ngc
    return divmod(ngc.GPU["sm"], 10)
