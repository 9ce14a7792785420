"""A stand-in GPU build on the CPU: what `python -m rn50_mx.rehearse` runs a GPU config's code path on.

Three fakes, each named as one, none of which can say anything about a GPU's speed, memory or numerics:
- devices.py: each rank's GPU is a CPU context of its own, cpu(1 + local rank), mixed contexts refused;
- kernels.py: float32 NCHW twins of the stock operators MXNet's CPU build has no float16 or NHWC kernel for;
- ngc.py: NVIDIA's fused operators (the NGC build's BatchNorm with act_type, BatchNormAddRelu and the NormConv
  family), computing the same function in float32 and refusing what the fork's kernels refuse.

The setting --standin (RN50_STANDIN) chooses it, so that every process of a run, its horovodrun ranks and the
self-test's workers alike, installs it: `devices` the stand-in devices alone (the tests' CPU runs on cpu(1 + local
rank)), `gpu` the whole build (the rehearsal). dist.context installs it and returns the rank's stand-in device;
model's registry query is the only other code that asks for it.
"""
import mxnet as mx

from . import devices, kernels

_ops = {"installed": False}


def use(kind, local_rank):
    """Install the stand-in `kind` ("devices" or "gpu") in this process; returns the rank's stand-in device."""
    devices.install()
    if kind == "gpu" and not _ops["installed"]:
        from . import ngc

        kernels.install()
        ngc.install()
        _ops["installed"] = True
    return devices.device(local_rank)


def operators():
    """The operator names of this build: MXNet's registry, plus NVIDIA's fused operators when stood in for."""
    names = list(mx.operator.get_all_registered_operators())
    if _ops["installed"]:
        from . import ngc
        names += list(ngc.OPERATORS)
    return names


def operator_arguments(name):
    """mx.operator.get_operator_arguments(name), with the stand-in BatchNorm's act_type when stood in for."""
    arguments = mx.operator.get_operator_arguments(name)
    if _ops["installed"] and name == "BatchNorm":
        from . import ngc
        return arguments._replace(names=list(ngc.batchnorm_arguments()))
    return arguments
