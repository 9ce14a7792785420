"""Can the running MXNet run a kernel on each visible GPU? The pip wheels mxnet-cu1xx==1.9.1 carry machine code
for sm_50 to sm_86 and no PTX, so on a Hopper GPU (sm_90) every operation fails with "no kernel image is available".

The device's answers (each GPU's name and compute capability from the CUDA driver, the result of a small real
operation on it, the architectures in libmxnet.so from cuobjdump) are gathered by `device_answers`; `verdict`
decides from them alone, so that the decision is tested on a CPU with answers given to it.
"""
import ctypes
import re
import shutil
import subprocess
from collections import namedtuple

from ..errors import one_line

HOPPER_IMAGE = "nvcr.io/nvidia/mxnet:24.04-py3"  # the Dockerfile's base: kernels for A100 and H100/H200
FIX = f"build the image (docker build -t rn50-mx ., from {HOPPER_IMAGE}) and run in it"
# Compute capability major (and minor) -> architecture name (CUDA's GPU list).
FAMILIES = {5: "Maxwell", 6: "Pascal", 7: "Volta", (7, 5): "Turing", 8: "Ampere", (8, 9): "Ada", 9: "Hopper",
            10: "Blackwell", 12: "Blackwell"}
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76  # cuda.h

CUDA_BIN = "/usr/local/cuda/bin"  # the CUDA toolkit's tools in NGC images, should PATH not hold them
Gpu = namedtuple("Gpu", "index name capability launch_error")  # capability (9, 0); launch_error None when it ran


def family(capability):
    return FAMILIES.get(capability, FAMILIES.get(capability[0], "unknown"))


def sm(capability):
    return f"sm_{capability[0]}{capability[1]}"


def verdict(gpus, archs):
    """(ok, detail) from the device's answers: `gpus` a list of Gpu, `archs` (SASS architectures, PTX
    architectures) of libmxnet.so, or None without cuobjdump. Fails when a GPU did not run the operation."""
    listed = "" if archs is None else "; libmxnet.so: " + listing(archs)
    for gpu in gpus:
        if gpu.launch_error is not None:
            missing = "" if archs is None or sm(gpu.capability) in archs[0] else f", which has no {sm(gpu.capability)}"
            return False, (f"GPU {gpu.index} {gpu.name} ({sm(gpu.capability)}, {family(gpu.capability)}): this MXNet "
                           f"cannot run a kernel on it ({gpu.launch_error}){listed}{missing}: {FIX}")
    if not gpus:
        return True, "no GPU visible" + listed
    ran = ", ".join(f"GPU {g.index} {g.name} ({sm(g.capability)}, {family(g.capability)})" for g in gpus)
    return True, f"a kernel ran on {ran}{listed}"


def listing(archs):
    sass, ptx = (", ".join(sorted(found, key=lambda a: int(re.sub(r"\D", "", a)))) for found in archs)
    if not sass and not ptx:
        return "no GPU code"
    return (sass or "no machine code") + (f", PTX {ptx}" if ptx else ", no PTX")


def device_answers(mx):
    """[Gpu] for each GPU this process sees (CUDA's order and CUDA_VISIBLE_DEVICES, as mx.gpu(i)), and the
    architectures of libmxnet.so (None without cuobjdump)."""
    gpus = [Gpu(i, name, capability, launch_error(mx, i)) for i, (name, capability) in enumerate(driver_gpus())]
    return gpus, library_archs(mx.libinfo.find_lib_path()[0])


def driver_gpus():
    """[(name, (major, minor))] of the visible GPUs from the CUDA driver (libcuda.so.1); [] without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    gpus = []
    for ordinal in range(count.value):
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGet(ctypes.byref(device), ordinal)
        cuda.cuDeviceGetName(name, len(name), device)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        gpus.append((name.value.decode(errors="replace"), (major.value, minor.value)))
    return gpus


def launch_error(mx, index):
    """None when a small operation ran on GPU `index` and gave the right answer, else its error in one line."""
    try:
        x = mx.nd.ones((4, 4), ctx=mx.gpu(index))
        total = float((x * 2 + 1).sum().asscalar())
    except Exception as err:  # noqa: BLE001 - MXNetError carries CUDA's message: it is the answer
        return one_line(str(err))
    return None if total == 48.0 else f"(x * 2 + 1).sum() gave {total}, not 48"


def library_archs(path):
    """({"sm_80", ...} with machine code, {"sm_80", ...} as PTX) in the shared library at `path`, from cuobjdump
    (the CUDA toolkit's; NGC images have it), or None where there is no cuobjdump."""
    tool = shutil.which("cuobjdump") or shutil.which("cuobjdump", path=CUDA_BIN)
    if tool is None:
        return None
    found = []
    for listing in ("--list-elf", "--list-ptx"):
        out = subprocess.run([tool, listing, path], capture_output=True, text=True, timeout=300).stdout
        found.append(set(re.findall(r"\b(sm_\d+[a-z]?)\b", out)))
    return found[0], found[1]
