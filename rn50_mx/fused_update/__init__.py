"""The optimizer's update of a group of CPU tensors in one compiled pass over each (fused_update.cc), pushed to MXNet's
engine as an operation of its own.

MXNet 1.9.1's multi-precision kernels take no bfloat16, so without it each bfloat16 tensor gets its gradient widened,
a float32 update on its master and its weight rounded again, one operator after another (optim.Masters), and even
in float32 its multi-tensor kernel walks up to 60 tensors element by element, index by index. Here one pass reads the
gradient, master and momentum of a tensor and writes the momentum, master and weight, with LARS's sums of squares
read just before (the tensor still in cache), on the threads MXNet's operators use (OpenMP).

How it runs: `Kernel.update` reads the arrays' addresses (MXNDArrayGetData, which first turns an array left in
oneDNN's layout back to the default one), lets the library copy them with the scalars into a plan, and hands the
plan to MXEnginePushSyncND (include/mxnet/c_api.h, MXNet 1.9.1) with the gradients as the arrays it reads and the
weights, masters and momenta as those it writes: the engine runs it once their writers are done (the backward pass,
Horovod's allreduce) and holds their readers (the next forward) until it is, as for any MXNet operator, then frees
the plan. An address is read before the engine has run the array's writers, so the array must be allocated by
then: MXNet allocates an operator's output when the operator runs, so `prepared` waits for a group's arrays the
first time it sees them (the first update, new states), and the learning rates and weight decays are host floats,
not arrays an operator makes each step. MXNet's extension libraries (mx.library.load with the wheel's lib_api.h)
would register a true operator, but lib_api.cc refuses every bfloat16 array ("Invalid dtype flag: 12 when
constructing MXTensor", MXTensor::setDLTensor in 1.9.1): no way in for the arrays this exists for.

The numbers are today's: fused_update.cc lists the kernels it follows bit for bit (tests/test_fused_update.py
compares weights, masters and momenta after several steps). The library is built by `make` (the Makefile's
FUSED_LIB: g++ with the MXNet wheel's headers); where it is missing, stale or unloadable, `load` says so in one line
and the optimizer keeps MXNet's kernels.
"""
import ctypes
import functools
import hashlib
import os
import sys

import numpy as np
from mxnet.base import _LIB, check_call

from ..model import BFLOAT16

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fused_update.cc")
# ".so.1": a shared library's versioned name, which Python's module finders do not take for an extension module (the
# self-test imports every module of the package); 1 is the version of fused_update_plan's arguments.
LIBRARY = os.path.join(HERE, "libfused_update.so.1")
# fused_update_plan's instruction sets; 0 takes the best this CPU has.
AUTO, PORTABLE, AVX512, AVX512_BF16 = 0, 1, 2, 3
ISA_NAMES = {PORTABLE: "portable C", AVX512: "AVX-512", AVX512_BF16: "AVX-512 with avx512_bf16"}
CPU_DEVICE = 1  # mxnet::Context::kCPU (include/mxnet/base.h)
OPERATION = b"fused_update"  # its name in MXNet's profiler


class Context(ctypes.Structure):
    """mxnet::Context as MXEnginePushSyncND takes it: device type and id."""
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


def _pointers(ctype, values):
    return (ctype * len(values))(*values)


class Kernel:
    """The loaded library: `update` pushes one fused update on the instruction set `isa` (AUTO: the best this CPU
    has; the tests ask for each), the parsers turn a value into the float32 MXNet's own kernels would read from its
    operator argument."""

    def __init__(self, lib, isa=AUTO):
        self.lib, self.isa = lib, isa
        lib.fused_update_source_sha.restype = ctypes.c_char_p
        lib.fused_update_best_isa.restype = ctypes.c_int
        for name in ("fused_update_param_float", "fused_update_tuple_float", "fused_update_param_double"):
            getattr(lib, name).restype = ctypes.c_double if name.endswith("double") else ctypes.c_float
            getattr(lib, name).argtypes = [ctypes.c_char_p]
        p, f = ctypes.c_void_p, ctypes.c_float
        lib.fused_update_plan.restype = p
        lib.fused_update_plan.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, p, p, p, p, p, p, p, p, p, f, f,
                                          f]
        self.best_isa = lib.fused_update_best_isa()
        self.run = ctypes.cast(lib.fused_update_run, p)
        self.free = ctypes.cast(lib.fused_update_free, p)
        self.context = Context(CPU_DEVICE, 0)

    def param_float(self, value):
        """`value` as MXNet reads a float operator argument given it (str(value), then dmlc::stof)."""
        return self.lib.fused_update_param_float(str(value).encode())

    def tuple_float(self, value):
        """`value` as MXNet reads it inside a Tuple<float> operator argument (the lrs and wds of multi_sgd_*)."""
        return self.lib.fused_update_tuple_float(str(value).encode())

    def times_scalar(self, floats, value):
        """float32 `floats` times `value` as `array * value` computes it on an NDArray (_mul_scalar: float(dmlc::stod
        of str(value)))."""
        return np.asarray(floats, dtype=np.float32) * np.float32(self.lib.fused_update_param_double(
            str(float(value)).encode()))

    def update(self, weights, grads, moms, masters, sizes, lars, lrs, wds, momenta, eta=0.0, eps=0.0, rescale=1.0):
        """Push the update of these tensors (lists, one entry per tensor, `sizes` their element counts; masters are the
        weights in float32):
        mom = momentum*mom - lr*wd*w - lr*rescale*grad; w += mom, where a tensor with `lars` set takes
        LARS's lr (multi_lars with eta, eps). `lrs`, `wds`, `momenta`, eta, eps, rescale: the float32 values MXNet's
        kernels would take (param_float, tuple_float, times_scalar). Every array allocated (`prepared`). Does not
        wait.
        """
        bf16 = weights[0].dtype == BFLOAT16
        addresses = [[address(a) for a in arrays] for arrays in (weights, grads, moms, masters)]
        plan = self.lib.fused_update_plan(
            len(weights), bf16, self.isa, _pointers(ctypes.c_int64, sizes),
            *[_pointers(ctypes.c_void_p, a) for a in addresses], _pointers(ctypes.c_ubyte, [bool(x) for x in lars]),
            *[_pointers(ctypes.c_float, values) for values in (lrs, wds, momenta)], eta, eps, rescale)
        if not plan:
            raise ValueError(f"fused_update: no plan for isa {self.isa} (this CPU's best: {self.best_isa})")
        reads = list(grads)
        writes = list(weights) + list(moms) + (list(masters) if bf16 else [])
        check_call(_LIB.MXEnginePushSyncND(
            self.run, ctypes.c_void_p(plan), self.free, ctypes.byref(self.context),
            _pointers(ctypes.c_void_p, [a.handle for a in reads]), len(reads),
            _pointers(ctypes.c_void_p, [a.handle for a in writes]), len(writes), None, 0, OPERATION))


def address(array):
    """The address of an NDArray's data (in the default layout: MXNDArrayGetData reorders one in oneDNN's first)."""
    out = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(out)))
    return out.value


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def open_library(path, source):
    """(Kernel, None), or (None, why not) in a few words."""
    if not os.path.exists(path):
        return None, f"{path} is not built"
    try:
        kernel = Kernel(ctypes.CDLL(path))
    except (OSError, AttributeError) as e:  # not a library, another architecture, a missing symbol
        return None, f"{path} does not load ({' '.join(str(e).split())[:200]})"
    built_from = kernel.lib.fused_update_source_sha().decode(errors="replace")
    try:
        if built_from != sha256(source):
            return None, f"{path} was built from another {os.path.basename(source)}"
    except FileNotFoundError:  # installed without its source: nothing to compare
        pass
    except OSError as e:
        return None, f"{path}: its source {source} does not read ({e.strerror})"
    return kernel, None


def load(path=None, source=None):
    """The Kernel of the library at `path` (default LIBRARY, built from `source`, default SOURCE), loaded once per
    process; None where it cannot be, saying so on stderr in one line (the optimizer then runs MXNet's kernels)."""
    return _load(path or LIBRARY, source or SOURCE)


@functools.lru_cache(maxsize=None)
def _load(path, source):
    kernel, why = open_library(path, source)
    if kernel is None:
        print(f"rn50_mx: fused optimizer update off: {why}: the optimizer runs MXNet's unfused kernels (slower; "
              f"`make` builds it)", file=sys.stderr, flush=True)
    return kernel


def takes(weights, grads, moms, masters):
    """Whether `update` takes these tensors: dense, on the CPU, float32 throughout or bfloat16 weights and gradients
    with float32 momenta and masters, each of one size."""
    if not weights:
        return False
    wide = np.dtype(weights[0].dtype)
    if wide not in (np.dtype(np.float32), BFLOAT16):
        return False
    for w, g, m, master in zip(weights, grads, moms, masters):
        if m is None or master is None:
            return False
        arrays = (w, g, m, master)
        if any(a.stype != "default" or a.context.device_type != "cpu" for a in arrays):
            return False
        if np.dtype(w.dtype) != wide or np.dtype(g.dtype) != wide or m.dtype != np.float32 \
                or master.dtype != np.float32:
            return False
        if not w.size == g.size == m.size == master.size:
            return False
    return True


def prepared(seen, key, weights, grads, moms, masters):
    """The sizes of these tensors (the update of group `key`) if `update` takes them, else None. `seen`, a dict the
    caller keeps, holds the arrays each group last came with: new ones are checked (`takes`) and their writers waited
    for once, as a new array may not be allocated yet (see the module docstring); a step with the same arrays, whose
    types and shapes cannot have changed, passes at once (the checks are a few thousand calls into MXNet a step)."""
    arrays = (*weights, *grads, *moms, *masters)
    known = seen.get(key)
    if known is not None and len(known[0]) == len(arrays) and all(a is b for a, b in zip(known[0], arrays)):
        return known[1]
    if not takes(weights, grads, moms, masters):
        return None
    for a in arrays:
        a.wait_to_read()
    seen[key] = arrays, [w.size for w in weights]
    return seen[key][1]
