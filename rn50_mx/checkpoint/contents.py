"""What a checkpoint's files must hold before a run resumes from it or `evaluate` reads it: meta.json's structure,
then every file loads and fits the model of the settings meta.json records. Sizes and CRC-32s that match catch a torn
or damaged file, not one written by another version or edited together with meta.json; such a checkpoint is
refused like a corrupt one (the previous one is used), on rank 0 while the run has written nothing yet: no
KeyError, TypeError or MXNetError after run_start, and no failed attempt in the log the run continues."""
import functools
import json
import math
import os
import random
import re

import mxnet as mx
import numpy as np

from .. import config, model, optim
from ..data import iters, pipeline, records
from ..errors import InputError
from . import trainer_file

SEED_HIGH = 2**31 - 1
RANK_FILE = re.compile(r"^rank(\d+)\.")  # rank<R>.json, .aux, .ema, .<split>.dali
MT_WORDS = 624  # MT19937's state: 624 32-bit words and a position in 0..624 (Python adds it as a 625th word)
META_FIELDS = {"settings": dict, "world": int, "seed": int, "epoch": int, "step": int, "files": dict}
POSITION_FIELDS = {"epoch": int, "step": int, "first": int, "loss": (int, float), "images": int}


class Bad(Exception):
    """What is wrong with a checkpoint: refused, one line."""


class Diverged(Bad):
    """A checkpoint whose run had diverged (its loss not finite: written before runs stopped on a diverged loss): the
    run is not resumed from it, nor from an older one, which would diverge again."""


def kind_name(kind):
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def field(data, key, kind, where, low=None):
    """data[key], which must be of `kind` (a bool is not a number here) and at least `low`."""
    if not isinstance(data, dict) or key not in data:
        raise Bad(f"{where} has no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise Bad(f"{where}: {key} is {type(value).__name__}, not {kind_name(kind)}")
    if low is not None and value < low:
        raise Bad(f"{where}: {key} is {value}, below {low}")
    return value


def meta_problem(meta):
    """Why meta.json's structure is wrong, or None (what folder.py and train.py read from it, typed)."""
    try:
        if not isinstance(meta, dict):
            raise Bad(f"meta.json holds a {type(meta).__name__}, not an object")
        for key, kind in META_FIELDS.items():
            field(meta, key, kind, "meta.json", low=1 if key == "world" else 0 if kind is int else None)
        if meta["seed"] > SEED_HIGH:
            raise Bad(f"meta.json: seed is {meta['seed']}, above {SEED_HIGH}")
        for name, entry in meta["files"].items():
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise Bad(f"meta.json: files lists {name!r}, not a name in the folder")
            if not (isinstance(entry, list) and len(entry) == 2 and
                    all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in entry)):
                raise Bad(f"meta.json: files[{name!r}] is not [size, CRC-32]")
        ranks = {int(m.group(1)) for name in meta["files"] for m in [RANK_FILE.match(name)] if m}
        if len(ranks) != meta["world"] or ranks != set(range(len(ranks))) or not all(f"rank{r}.json" in meta["files"] for r in ranks):
            raise Bad(f"meta.json: world is {meta['world']}, but its files are those of ranks "
                      f"{sorted(ranks)[:8]} (rank<R>.json for each of 0..world-1)")
        if "mllog" in meta:
            field(meta, "mllog", dict, "meta.json")
            field(meta["mllog"], "path", str, "meta.json's mllog")
            field(meta["mllog"], "size", int, "meta.json's mllog", low=0)
            field(meta["mllog"], "crc", int, "meta.json's mllog", low=0)
    except Bad as bad:
        return str(bad)
    return None


def load_problem(folder, meta):
    """Why the files of the checkpoint in `folder` (whose meta.json passed meta_problem and whose files passed their
    CRC check) do not load or do not fit the model of its settings, or None."""
    try:
        expected = expected_model(json.dumps(meta["settings"], sort_keys=True))
        s = config.Settings(**meta["settings"])
        if meta["epoch"] >= s.epoch_limit:
            raise Bad(f"meta.json: epoch {meta['epoch']} is past the run's last epoch, {s.epoch_limit - 1} (0-based)")
        check_arrays(folder, "params", expected, every=True)
        check_trainer(folder, list(expected.values()))
        averaged = [f"rank{rank}.ema" in meta["files"] for rank in range(meta["world"])]
        if any(averaged) and not all(averaged):
            raise Bad("meta.json lists the weight EMA (rank<R>.ema) of some ranks only")
        if s.ema_decay and not all(averaged):  # the resumed run would meet the missing file after run_start
            raise Bad(f"meta.json lists no rank{averaged.index(False)}.ema, the weight EMA of a run with "
                      f"--ema-decay {s.ema_decay:g}")
        for rank in range(meta["world"]):
            check_arrays(folder, f"rank{rank}.aux", expected, every=False)
            if averaged[rank]:
                check_arrays(folder, f"rank{rank}.ema", expected, every=False, as_type=np.dtype("float32"))
            check_rank_state(folder, f"rank{rank}.json", meta, s)
    except Diverged:
        raise
    except Bad as bad:
        return str(bad)
    return None


@functools.lru_cache(maxsize=2)
def expected_model(settings):
    """{parameter name: (shape, dtype)} of the model of the recorded settings (as JSON), in the trainer's order:
    built on the CPU once per settings."""
    try:
        s = config.Settings(**json.loads(settings))
        config.check_fields(s)  # each value in range; the run's own checks across them are not the model's
        config.check_image_shape(s)
    except (TypeError, ValueError, InputError) as err:
        raise Bad(f"meta.json: its settings are not this version's ({str(err).splitlines()[0]})") from None
    net = model.build_model(s, mx.cpu(), drawn=False)  # shapes and dtypes only
    trainer = optim.make_trainer(net, s, 1)  # its parameter order is the one trainer_file's indices follow
    return {p.name: (p.shape, np.dtype(p.dtype)) for p in trainer._params}


def dali_problem(folder, meta, s, rank, device_id):
    """Why rank `rank`'s DALI states in the checkpoint in `folder` (rank<R>.<split>.dali) would fail the resumed run of
    settings `s` (the checkpoint's own, with this run's free ones) after run_start, or None: each listed, and each
    restored by DALI itself into the pipeline that split builds for that rank (data.pipeline, on `device_id`, that
    rank's own device), which reads the data's .idx for it (a resume is never scored). DALI refuses bytes it cannot
    parse or that name operators the pipeline has not. Each rank checks its own (folder.agree), so the check costs
    one rank's builds whatever the world size. Data the settings name that cannot be read are their own line
    (InputError), not the checkpoint's."""
    for split in (split for split in ("train", "val") if dali_split(s, split)):
        rec, idx = records.rec_and_idx(s, split == "train")
        name = f"rank{rank}.{split}.dali"
        if name not in meta["files"]:
            return f"meta.json lists no {name}, rank {rank}'s {split} reader state"
        with open(os.path.join(folder, name), "rb") as f:
            state = f.read()
        sizes = iters.SizeSchedule(s) if split == "train" and s.prog_start_side else None
        try:
            pipeline.build_pipeline(s, rec, idx, split == "train", rank, meta["world"], 0, device_id, state,
                                    sizes).build()
        except RuntimeError as err:
            return f"{name}: DALI cannot restore it ({str(err).strip().splitlines()[0][:200]})"
    return None


def dali_split(s, split):
    """Whether the run of `s` reads `split` through DALI (a synthetic run reads no file)."""
    return not s.synthetic and bool(s.data_train if split == "train" else s.data_val)


def load_arrays(folder, name):
    try:
        arrays = mx.nd.load(os.path.join(folder, name))
    except mx.base.MXNetError as err:
        raise Bad(f"{name} does not load ({str(err).strip().splitlines()[-1]})") from None
    if arrays == []:  # mx.nd.save of no arrays ({}: a stateless optimizer's, SGD without momentum) loads as []
        return {}
    if not isinstance(arrays, dict):
        raise Bad(f"{name} holds unnamed arrays")
    return arrays


def check_arrays(folder, name, expected, every, as_type=None):
    """The arrays in `name` are parameters of the model with its shapes and types (or all of type `as_type`: the
    weight EMA's averages are float32 whatever the weights' type, ema.py); all of them when `every`."""
    arrays = load_arrays(folder, name)
    for key, array in arrays.items():
        if key not in expected:
            raise Bad(f"{name} holds {key!r}, which the model has not")
        shape, dtype = expected[key][0], as_type or expected[key][1]
        if array.shape != shape or np.dtype(array.dtype) != dtype:
            raise Bad(f"{name}: {key} is {array.shape} {np.dtype(array.dtype).name}, the model's {shape} {dtype.name}")
    missing = sorted(set(expected) - set(arrays)) if every else []
    if missing:
        raise Bad(f"{name} has no {missing[0]}")


def load_json(folder, name):
    try:
        with open(os.path.join(folder, name)) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise Bad(f"{name} does not load ({err})") from None


def check_trainer(folder, params):
    """trainer.json's counts and the trainer's arrays: one part per state it lists, but those it lists as None, each
    of its parameter's shape."""
    plain = load_json(folder, trainer_file.COUNTS)
    where = trainer_file.COUNTS
    field(plain, "num_update", int, where, low=0)
    for key in ("parts", "counts"):
        for index, value in field(plain, key, dict, where).items():
            if not index.isdigit() or int(index) >= len(params):
                raise Bad(f"{where}: {key} names parameter {index!r}, which the model has not")
            field({index: value}, index, int, f"{where}'s {key}", low=0)
    none = field(plain, "none", dict, where) if "none" in plain else {}
    for index, positions in none.items():
        if not (isinstance(positions, list) and all(type(k) is int and 0 <= k < plain["parts"].get(index, 0)
                                                    for k in positions)):
            raise Bad(f"{where}: none[{index!r}] is not a list of parts of a state it lists")
    arrays = load_arrays(folder, trainer_file.STATES)
    wanted = {f"{index}.{k}" for index, count in plain["parts"].items() for k in range(count)
              if k not in none.get(index, [])}
    if set(arrays) != wanted:
        odd = sorted(set(arrays) ^ wanted)[0]
        raise Bad(f"{trainer_file.STATES}: {'has no' if odd in wanted else 'holds an unlisted'} state {odd!r}")
    for key, array in arrays.items():
        shape = params[int(key.split(".")[0])][0]
        if array.shape != shape:
            raise Bad(f"{trainer_file.STATES}: state {key} is {array.shape}, its parameter's {shape}")


def check_rank_state(folder, name, meta, s):
    """A rank's position, iterator states and generator states, as Checkpoints.restore reads them: each field typed
    and bounded by meta.json and the run's settings `s` (a position past the run ended it at once; a NaN loss was
    carried on), each generator state one its library takes."""
    state = load_json(folder, name)
    position = field(state, "position", dict, name)
    for key, kind in POSITION_FIELDS.items():
        field(position, key, kind, f"{name}'s position", low=0)
    if set(position) != set(POSITION_FIELDS):
        raise Bad(f"{name}'s position holds {sorted(set(position) - set(POSITION_FIELDS))[0]!r}, an unknown field")
    if (position["epoch"], position["step"]) != (meta["epoch"], meta["step"]):
        raise Bad(f"{name}: position epoch {position['epoch']} step {position['step']} is not meta.json's epoch "
                  f"{meta['epoch']} step {meta['step']}")
    if not math.isfinite(position["loss"]):
        step = os.path.basename(folder).removeprefix("step-")
        raise Diverged(f"{name}: the run had diverged (loss {position['loss']} at step {step})")
    if position["loss"] > np.finfo(np.float32).max:  # the resumed run's float32 sum would be inf: a divergence
        raise Bad(f"{name}: position loss {position['loss']} is past float32's range, in which training sums it")
    if position["first"] > position["epoch"]:
        raise Bad(f"{name}: position first {position['first']} is past its epoch, {position['epoch']}")
    if position["images"] > position["step"] * s.batch_size:
        raise Bad(f"{name}: position images {position['images']} above step {position['step']} x batch "
                  f"{s.batch_size}")
    iters = field(state, "iters", dict, name)
    splits = ["train"] + (["val"] if s.data_val and not s.synthetic else [])
    for split in splits:
        check_iterator(field(iters, split, dict, f"{name}'s iters"), f"{name}'s {split} iterator", position, split)
    check_generators(state, name)


def check_iterator(it, where, position, split):
    """An iterator's state: the train iterator at the position's step; epochs and records within the run's."""
    for key in ("position", "epochs", "built_epochs", "built_step"):
        if key in it or key == "position":
            field(it, key, int, where, low=0)
    if split == "train" and position["step"] and it["position"] != position["step"]:  # at step 0: the last epoch's end
        raise Bad(f"{where}: position {it['position']} is not the step, {position['step']}")
    for key in ("epochs", "built_epochs"):
        if it.get(key, 0) > position["epoch"] + 1:
            raise Bad(f"{where}: {key} {it[key]} is past the epoch, {position['epoch']}")
    skipped = it.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**63
                                                for k in skipped):
        raise Bad(f"{where}: skipped is not a list of record keys")


def check_generators(state, name):
    """Python's and NumPy's generator states, put into scratch generators: the libraries' own checks, before the
    run's (NumPy's takes any position; MT19937's is 0..624)."""
    python = field(state, "python_random", list, name)
    try:
        version, internal, gauss = python
        random.Random().setstate((version, tuple(internal), gauss))
    except (TypeError, ValueError, OverflowError):
        raise Bad(f"{name}: python_random is not Python's generator state") from None
    numpy = field(state, "numpy_random", list, name)
    try:
        kind, keys, pos, has_gauss, cached = numpy
        if kind != "MT19937" or len(keys) != MT_WORDS or not 0 <= pos <= MT_WORDS or has_gauss not in (0, 1) or \
                not all(isinstance(k, int) and 0 <= k < 2**32 for k in keys):  # NumPy 1.x casts others silently
            raise ValueError
        np.random.RandomState().set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, float(cached)))
    except (TypeError, ValueError, OverflowError):
        raise Bad(f"{name}: numpy_random is not NumPy's generator state") from None
