"""The trained model (--save-model): owned from the start of the run, written when it ends, loaded by evaluate."""
import contextlib
import json
import os
import warnings

import mxnet as mx

from .. import config, files
from ..errors import InputError
from .disk import first_line, fsync_path, read_json

MODEL_FILES = ("-0000.params", "-symbol.json", "-settings.json")
# What a network was built for: evaluated with others, it fails in MXNet or, for the image side, gives another top-1
# in silence. PATH-settings.json records them for a saved model, meta.json for a checkpoint.
MODEL_FIELDS = ("image_shape", "num_classes", "input_layout", "num_layers")
# A checkpoint's arrays go into a network evaluate builds from its settings: one of another dtype would round them
# (a float32 run's weights evaluated in bfloat16) and score another model than the run's. A saved model keeps its own
# types in its files.
CHECKPOINT_FIELDS = (*MODEL_FIELDS, "dtype")


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


def settings_problem(recorded, s, fields=MODEL_FIELDS):
    """'--flag=VALUE: the model was trained with OTHER' for the first of `fields` in which `s` differs from the
    settings `recorded` with the model (or which they lack), or None."""
    for name in fields:
        if name not in recorded:  # skipping it, the model met its first batch in MXNet's forward
            return f"{config.flag_name(name)}: the model's settings do not record it"
        if recorded[name] != getattr(s, name):
            return f"{config.flag_name(name)}={getattr(s, name)}: the model was trained with {recorded[name]}"
    return None


def save_model(net, path, s):
    """PATH-symbol.json and PATH-0000.params (HybridBlock.export) and PATH-settings.json (MODEL_FIELDS of `s`, which
    evaluate compares with its own), each written under a temporary name first. A
    symbol exported on NVIDIA's MXNet loads only there, NormConv or not: every BatchNorm node carries NVIDIA's
    act_type, bn_group and xbuf_ptr (its Gluon's _kwargs), a fused run also its fused operators (a NormConv one
    with the training batch in elem_count), all refused by stock MXNet's parser; the parameters, the same as the
    plain network's, load anywhere (evaluate --checkpoint-dir). A bfloat16 network keeps
    its first operator, the cast of the float32 images, which Gluon's export drops unless told (MXNet 1.9.1
    gluon/block.py:1416, remove_amp_cast=True)."""
    tmp = files.temp_name(path)
    try:
        net.export(tmp, remove_amp_cast=False)
        with open(tmp + "-settings.json", "w") as f:
            json.dump({name: getattr(s, name) for name in MODEL_FIELDS}, f)
        for suffix in MODEL_FILES:
            fsync_path(tmp + suffix)
            os.replace(tmp + suffix, path + suffix)
    except (OSError, mx.base.MXNetError) as err:
        raise InputError(f"--save-model {path}: cannot write ({first_line(err)})") from None
    finally:
        files.remove_quietly(*(tmp + suffix for suffix in MODEL_FILES))
    return tuple(path + suffix for suffix in MODEL_FILES)


def load_model(path, s, ctx):
    """The network --save-model PATH wrote, as a SymbolBlock on ctx, after checking that `s` is what it was built
    for (PATH-settings.json)."""
    for name in (path + suffix for suffix in MODEL_FILES):
        if not os.path.isfile(files.regular_input(name)):
            raise InputError(f"--model {path}: no {name} (python -m rn50_mx.train --save-model {path} writes it)")
    recorded = read_json(path + "-settings.json")
    problem = settings_problem(recorded, s) if isinstance(recorded, dict) else "not a settings object"
    if problem:
        raise InputError(f"--model {path}: {problem} (its -settings.json)")
    symbol = path + "-symbol.json"
    try:  # parsed alone first, so that a refusal names the file at fault
        mx.sym.load(symbol)
    except (mx.base.MXNetError, ValueError) as err:  # ValueError: bytes that are not UTF-8 (mx.sym.load decodes)
        raise InputError(f"--model {path}: {symbol} is not a network MXNet can load ({first_line(err)})") from None
    try:
        with warnings.catch_warnings():  # imports() cannot infer the input's type before the first batch; it is fine
            warnings.simplefilter("ignore", UserWarning)
            return mx.gluon.SymbolBlock.imports(symbol, ["data"], path + "-0000.params", ctx=ctx)
    except (mx.base.MXNetError, ValueError, AssertionError) as err:
        raise InputError(f"--model {path}: cannot load its parameters ({path}-0000.params) with its network "
                         f"({first_line(err)})") from None

