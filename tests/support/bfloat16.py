"""bfloat16 in the tests: the skip where the CPU cannot compute in it, what config/CPU.sh trains in here, and NumPy float32 arrays to and from MXNet's
bfloat16 NDArrays, with a rounding of our own to check MXNet's against."""
import mxnet as mx
import numpy as np
import pytest

from rn50_mx import config
from rn50_mx.model import BFLOAT16

HAS_BFLOAT16 = bool(set(config.BFLOAT16_FLAGS) & config.cpu_flags())
DEMO_DTYPE = "bfloat16" if HAS_BFLOAT16 else "float32"  # what config/CPU.sh trains in on this CPU, one process
# What each process of config/CPU.sh under Horovod says (RN50_BFLOAT16_FALLBACK=1): the reason this CPU gives first.
HOROVOD_FALLBACK = (f"DTYPE=bfloat16: {config.bfloat16_obstacle(config.Settings(kv_store='horovod'))}: training in "
                    "float32 (RN50_BFLOAT16_FALLBACK=1)")
# What one process of config/CPU.sh that goes ahead (the check, a training) says on stderr: nothing where the CPU
# computes bfloat16, else why it trains in float32.
CPU_SH_SAYS = "" if HAS_BFLOAT16 else (f"DTYPE=bfloat16: {config.bfloat16_obstacle(config.Settings())}: training in "
                                       "float32 (RN50_BFLOAT16_FALLBACK=1)\n")
needs_bfloat16 = pytest.mark.skipif(
    not HAS_BFLOAT16,
    reason=f"this CPU has neither {' nor '.join(config.BFLOAT16_FLAGS)} ({config.CPUINFO}): MXNet's oneDNN computes "
           "no bfloat16 here, and DTYPE=bfloat16 is refused")


def round_bf16(a):
    """float32 `a` rounded to the nearest bfloat16 (ties to even), as float32: the top 16 bits of each value."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def to_nd(a, dtype="bfloat16"):
    """A NumPy array as an NDArray of `dtype` (a DTYPE value): bfloat16 by MXNet's cast from float32."""
    if dtype != "bfloat16":
        return mx.nd.array(a, dtype=dtype)
    return mx.nd.array(np.asarray(a, dtype=np.float32)).astype(BFLOAT16)


def to_np(x):
    """An NDArray as NumPy, a bfloat16 one widened to float32 (exactly)."""
    return (x.astype("float32") if x.dtype == BFLOAT16 else x).asnumpy()
