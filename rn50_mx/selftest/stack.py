"""The stack the run stands on: MXNet, DALI and Horovod versions and build features, and the GPUs. With
expect_gpu, what the GPU path needs becomes a check (the Dockerfile's build-time check)."""
import importlib
import inspect
import pkgutil
import shutil
import subprocess
import sys

from .. import bind
from . import kernels
from .report import Row

MIN_DALI = (1, 44)  # the dynamic executor, which the zero-copy hand-over needs (data.Handover on the CPU)


def stack_rows(expect_gpu):
    """Versions and build features of MXNet, DALI and Horovod, and the GPUs; with expect_gpu, what the GPU path
    needs is a check that fails when missing."""
    import mxnet as mx
    from nvidia.dali import __version__ as dali_version
    from nvidia.dali.pipeline import Pipeline

    from .. import model

    features = mx.runtime.Features()
    gpu_features = {name: features.is_enabled(name) for name in ("CUDA", "CUDNN", "NCCL")}
    dali = tuple(int(v) for v in dali_version.split(".")[:2])
    dynamic = "exec_dynamic" in inspect.signature(Pipeline.__init__).parameters
    hvd = horovod_builds()
    gpus = bind.query_gpus("name,memory.total")
    need = (lambda ok: ok) if expect_gpu else (lambda ok: None)
    return [
        Row("python", None, sys.version.split()[0]),
        Row("rn50_mx", *package_imports()),
        Row("mxnet", need(all(gpu_features.values())), f"{mx.__version__}; " + onoff(
            {**gpu_features, "MKLDNN": features.is_enabled("MKLDNN"),
             "fused BatchNorm": model.fused_batchnorm_available(), "NormConv": model.normconv_available()})),
        Row("dali", need(dali >= MIN_DALI and dynamic), f"{dali_version}; dynamic executor "
            f"{'yes' if dynamic else 'no (need DALI >= 1.44)'}"),
        Row("horovod", need(hvd.get("NCCL", False)), hvd.pop("version", "not installed") + "; " + onoff(hvd)),
        Row("gpus", None, f"{len(gpus)}: " + ", ".join(" ".join(g) for g in gpus) if gpus else "none visible"),
        kernel_row(mx, gpu_features["CUDA"]),
    ]


def kernel_row(mx, cuda):
    """Whether this MXNet runs a kernel on each visible GPU (a failure whatever --expect-gpu says: a run there
    would fail at its first operation); information only without a GPU or without CUDA."""
    if not cuda:
        return Row("kernels", None, "MXNet built without CUDA")
    gpus, archs = kernels.device_answers(mx)
    ok, detail = kernels.verdict(gpus, archs)
    return Row("kernels", ok if gpus else None, detail)


def package_imports():
    """(ok, detail): every module of rn50_mx imports here. The image must have every package that training, the
    data preparation and the tools import, not only the ones the other rows need."""
    import rn50_mx

    names = [m.name for m in pkgutil.walk_packages(rn50_mx.__path__, "rn50_mx.") if not m.name.endswith("__main__")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # an ImportError, or whatever a module fails with on this stack
            return False, f"{name}: {type(err).__name__}: {err}"
    return True, f"its {len(names)} modules import"


def horovod_builds():
    """{"version": ..., "NCCL"/"Gloo"/"MPI": built} of the installed horovod.mxnet, or {} without it."""
    try:
        import horovod
        import horovod.mxnet as hvd
    except ImportError:
        return {}
    return {"version": horovod.__version__, "NCCL": bool(hvd.nccl_built()), "Gloo": bool(hvd.gloo_built()),
            "MPI": bool(hvd.mpi_built())}


def onoff(flags):
    return ", ".join(f"{name} {'yes' if on else 'no'}" for name, on in flags.items())


def topology():
    """`nvidia-smi topo -m` (GPUs, NICs, their links and CPU/NUMA affinity), or "" without it."""
    if not shutil.which("nvidia-smi"):
        return ""
    return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout


# --- the checks ------------------------------------------------------------------------------------------------
