"""The network as the unit tests build it: train.parts from a fixed seed, and a host copy of its parameters."""
import mxnet as mx

from rn50_mx import data, dist, train
from tests.support.bfloat16 import to_np


def trained_parts(s, ctx):
    """A hybridized ResNet-50, its loss and LARS trainer on `ctx`, initialised from a fixed seed."""
    mx.random.seed(5)
    return train.parts(s, ctx, data.steps_per_epoch(s, 1), dist.Single().trainer)


def snapshot(net):
    """{name: NumPy copy} of every parameter, BatchNorm statistics included (bfloat16 ones in float32)."""
    return {name: to_np(p.data()) for name, p in net.collect_params().items()}
