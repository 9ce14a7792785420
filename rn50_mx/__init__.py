"""rn50_mx: the MLPerf Training v1.0 ResNet-50 submission of Inspur's NF5688M6, in MXNet/Gluon.

What every process of it needs before MXNet loads is set here, once.

1. Loading the package hides two optional modules from MXNet's own import, and from nothing else. When scipy is
installed (mlperf-logging's RCP checker and prep_rec's ImageNet devkit reader need it), MXNet 1.9's import loads
scipy.stats for the entropy calibration of int8 models (mxnet/contrib/quantization.py) and scipy.sparse to convert
scipy's sparse matrices (mxnet/ndarray/sparse.py). rn50_mx calls neither. Both imports sit in try/except blocks that
fall back to None, as on a machine without scipy; so do they in NVIDIA's fork, the GPU image's MXNet
(sneaxiy/NVIDIA-MxNet: python/mxnet/contrib/quantization.py:20-23, ndarray/sparse.py:59-62, ndarray/utils.py:32-35).
Together they were 0.5 of the 1.6 CPU-seconds that MXNet's import takes, in every process that loads it: each
training and Horovod rank, check --resume, evaluate.

2. Freed memory is kept for the next array (keep_freed_memory).

3. MXNet's operator functions come from code compiled at `make` (rn50_mx/op_cache).
"""
import ctypes
import sys

from .op_cache import CompiledOps

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
    sys.meta_path[:0] = [_HiddenFromMXNet(), CompiledOps()]


# glibc's malloc.h: mallopt's parameters. MMAP_THRESHOLD is glibc's own ceiling for its moving threshold
# (DEFAULT_MMAP_THRESHOLD_MAX on 64 bits), the trim threshold twice it, as glibc sets it when it moves the first.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20


def keep_freed_memory():
    """MXNet keeps no pool of host memory: every array on the CPU is a malloc and a free of its own (1.9.1's
    libmxnet.so has only NaiveStorageManager<CPUDeviceStorage> for Context::kCPU, src/storage/storage.cc). glibc
    serves a buffer above its mmap threshold (128 KiB until a freed one moves it) with a fresh mmap, whose pages
    the kernel faults in zeroed at their first touch, and unmaps it at its free; it also hands the top of the heap
    back above its trim threshold. The rehearsal's stand-in kernels and MXNet's imperative operators make and drop
    such buffers at every call. With the thresholds fixed at glibc's ceiling, a buffer of up to 32 MiB comes from the
    heap and a freed one is reused, with the same results. Side by side: the demo's training (2560 images, one
    thread) 15.9-16.9 CPU-seconds against 18.9-20.0, four pairs; a quick rehearsal of NF5688M6 41.1 and 41.1
    against 42.1 and 40.5 (within the noise); bench/against.py at 2 threads x1.00.
    No effect where malloc has no mallopt (musl's returns 0); GPU memory has MXNet's own pool."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)


keep_freed_memory()
