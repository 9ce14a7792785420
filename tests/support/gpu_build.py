"""The whole stand-in GPU build (rn50_mx.standin.use("gpu")) installed in the test's own process, and undone when the
test ends, so that the tests after it see stock MXNet: NVIDIA's fused operators, the CPU twins, NVIDIA's Python
layer (Gluon's arguments, the Updater, the LARS kernels' names) and the stand-in devices."""
import mxnet as mx
from mxnet import optimizer
from mxnet.gluon.nn import basic_layers, conv_layers
from mxnet.ndarray import register

from rn50_mx import standin
from rn50_mx.standin import kernels, ngc, python_layer


def install(monkeypatch, sm=80):
    """standin.use("gpu", 0, sm) with everything it replaces recorded in `monkeypatch`; returns the device, cpu(1)."""
    replaced = [(register, "_verify_all_legacy_ndarrays"), (mx.nd, "save"), (mx.base, "get_last_ffi_error"),
                (mx.operator, "print"), (basic_layers._BatchNorm, "__init__"), (conv_layers._Conv, "__init__"),
                (basic_layers.Dense, "__init__"), (basic_layers.Dense, "hybrid_forward"),
                (optimizer.Updater, "__call__"), (optimizer.SGD, "_update_impl")]
    replaced += [(module, name) for module in (mx.sym, mx.nd) for name in kernels.TWINS + ngc.OPERATORS + ("BatchNorm",)]
    replaced += [(mx.nd, name) for pair in python_layer.LARS_KERNELS.items() for name in pair]
    absent = [(owner, name) for owner, name in replaced if name not in vars(owner)]
    for owner, name in replaced:  # an absent one (mx.operator.print, the fork's LARS kernels) is deleted at the end
        monkeypatch.setattr(owner, name, vars(owner).get(name), raising=False)
    for owner, name in absent:
        delattr(owner, name)
    monkeypatch.setitem(standin._ops, "installed", False)
    monkeypatch.setitem(ngc.GPU, "sm", ngc.GPU["sm"])
    return standin.use("gpu", 0, sm)
