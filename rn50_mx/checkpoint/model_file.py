"""The trained model (--save-model): owned from the start of the run, written when it ends."""
import contextlib
import os

import mxnet as mx

from .. import files
from ..errors import InputError
from .disk import first_line, fsync_path

MODEL_FILES = ("-0000.params", "-symbol.json")


def model_output(s, d):
    """What --save-model will write, checked and owned from the start of the run (rank 0 writes it): an existing model
    is kept, an unwritable folder or a second run saving there is one line now, not after the training."""
    if not s.save_model or d.rank != 0:
        return contextlib.nullcontext()
    for suffix in MODEL_FILES:
        if os.path.exists(s.save_model + suffix):
            raise InputError(f"--save-model {s.save_model}: {s.save_model + suffix} exists; the model there is kept "
                             "(give another path)")
    return files.owned(s.save_model)


def save_model(net, path):
    """PATH-symbol.json and PATH-0000.params (HybridBlock.export), each written under a temporary name first. A
    network run with NormConv exports NVIDIA's fused operators (NormConvolution, BNStatsFinalize,
    ScaleBiasAddRelu, with the training batch in elem_count): only NVIDIA's MXNet loads that symbol; the
    parameters, the same as the plain network's, load anywhere (evaluate --checkpoint-dir)."""
    tmp = files.temp_name(path)
    try:
        net.export(tmp)
        for suffix in MODEL_FILES:
            fsync_path(tmp + suffix)
            os.replace(tmp + suffix, path + suffix)
    except (OSError, mx.base.MXNetError) as err:
        raise InputError(f"--save-model {path}: cannot write ({first_line(err)})") from None
    finally:
        files.remove_quietly(*(tmp + suffix for suffix in MODEL_FILES))
    return tuple(path + suffix for suffix in MODEL_FILES)
