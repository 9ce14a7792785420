"""rn50_mx: the MLPerf Training v1.0 ResNet-50 submission of Inspur's NF5688M6, in MXNet/Gluon.

Loading the package hides two optional modules from MXNet's own import, and from nothing else. When scipy is
installed (mlperf-logging's RCP checker and prep_rec's ImageNet devkit reader need it), MXNet 1.9's import loads
scipy.stats for the entropy calibration of int8 models (mxnet/contrib/quantization.py) and scipy.sparse to convert
scipy's sparse matrices (mxnet/ndarray/sparse.py). rn50_mx calls neither. Both imports sit in try/except blocks that
fall back to None, as on a machine without scipy; so do they in NVIDIA's fork, the GPU image's MXNet
(sneaxiy/NVIDIA-MxNet: python/mxnet/contrib/quantization.py:20-23, ndarray/sparse.py:59-62, ndarray/utils.py:32-35).
Together they were 0.5 of the 1.6 CPU-seconds that MXNet's import takes, in every process that loads it: each
training and Horovod rank, check --resume, evaluate.
"""
import sys

HIDDEN_FROM_MXNET = ("scipy.stats", "scipy.sparse")


def _in_mxnet_s_import(frame):
    """Whether a module body of MXNet's is on the stack from `frame` up, that is, MXNet is being imported."""
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if frame.f_code.co_name == "<module>" and (name == "mxnet" or name.startswith("mxnet.")):
            return True
        frame = frame.f_back
    return False


class _HiddenFromMXNet:
    """A meta path finder: refuses HIDDEN_FROM_MXNET while MXNet imports; any other import of them, and any later
    one, goes on to the usual finders."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in HIDDEN_FROM_MXNET and _in_mxnet_s_import(sys._getframe(1)):
            raise ModuleNotFoundError(f"{name} is not loaded for MXNet's import (rn50_mx/__init__.py)", name=name)
        return None


if not any(type(finder).__name__ == "_HiddenFromMXNet" for finder in sys.meta_path):  # once, if reloaded too
    sys.meta_path.insert(0, _HiddenFromMXNet())
