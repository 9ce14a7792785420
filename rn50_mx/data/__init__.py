"""Input pipelines (common/dali.py): DALI reads the .rec, decodes and augments; our DataIter hands the batches to MXNet.

    train: readers.mxnet (sharded, shuffled) -> decoders.image_random_crop -> resize to H,W (antialiased, or
           plain bilinear by a scaling warp) -> crop_mirror_normalize (coin-flip mirror, ImageNet mean/std,
           zero 4th channel when C=4)
           (--dali-roi-decode 0 or a decoder cache: decoders.image -> random_resized_crop instead)
    val:   readers.mxnet (sharded, padded) -> decoders.image -> resize shorter side -> centre crop + normalize

One graph serves both devices: `device=cpu` runs every operator on the CPU with no GPU (device_id=None), as CI
and the demo do; `device=gpu` moves decoding to nvJPEG ("mixed") and the rest onto the process's GPU. The
nvJPEG and buffer knobs of config_NF5688M6.sh and config_NF5688M6_common.sh are always passed; DALI applies them on
the GPU only.

DALI 2.x has no MXNet plugin, so the iterator is ours. DALI's prefetch queue prepares the next batches while
the model computes; see Handover for how a batch reaches MXNet on each device.
"""
import importlib

from .records import check_files, check_idx, named_files, present, rec_and_idx, steps_per_epoch

# The pipelines' names, each imported from its module when first asked for: they load MXNet and DALI (2 s of a CPU),
# which the data check the launchers run before every trial (records above) does without.
LAZY = {**dict.fromkeys(("RING", "BatchIter", "DaliIter", "Handover", "SyntheticIter", "batch_shape", "build_iters",
                         "dali_iter", "input_memory", "make_iters", "open_iters", "wait_for_readers"), "iters"),
        **dict.fromkeys(("MEAN", "STD", "graph", "stretch"), "pipeline")}

__all__ = [*LAZY, "check_files", "check_idx", "named_files", "present", "rec_and_idx", "steps_per_epoch"]


def __getattr__(name):
    """A LAZY name, from its module (PEP 562: called for a name the package does not hold yet)."""
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
