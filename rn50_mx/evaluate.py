"""Evaluate trained weights on the val .rec exactly as a training run's eval does (train.accuracy: every val image once
across the ranks, top-1 and top-5): the figure the run logged for the same weights.

    python -m rn50_mx.evaluate --model PATH [rn50_mx.train flags]           (PATH-symbol.json + PATH-0000.params,
                                                                            as --save-model PATH writes them)
    python -m rn50_mx.evaluate --checkpoint-dir DIR [rn50_mx.train flags]   (the newest usable checkpoint in DIR)

It takes the training settings (flags and variables: --data-val, --image-shape, --num-classes, --batch-size,
--device, --dtype, ...); under horovodrun with --kv-store horovod each rank reads its val shard, as in training.
"""
import json
import os
import sys
import warnings

import mxnet as mx

from . import checkpoint, config, data, dist
from .errors import InputError, run_cli
from .train import accuracy, network

USAGE = "usage: python -m rn50_mx.evaluate (--model PATH | --checkpoint-dir DIR) --data-val VAL.rec [rn50_mx.train flags]"


def split_model_flag(argv):
    """(the --model PATH value or "", the other arguments)."""
    rest, path = [], ""
    args = iter(argv)
    for arg in args:
        if arg == "--model":
            path = next(args, "")
            if not path or path.startswith("--"):
                raise InputError("--model: give a PATH (PATH-symbol.json and PATH-0000.params)")
        elif arg.startswith("--model="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def exported(path, s, ctx):
    """The network --save-model PATH wrote, as a SymbolBlock on ctx, after checking that `s` is what it was built
    for (PATH-settings.json)."""
    for name in (path + suffix for suffix in checkpoint.MODEL_FILES):
        if not os.path.isfile(name):
            raise InputError(f"--model {path}: no {name} (python -m rn50_mx.train --save-model {path} writes it)")
    recorded = read_json(path + "-settings.json")
    problem = checkpoint.settings_problem(recorded, s) if isinstance(recorded, dict) else "not a settings object"
    if problem:
        raise InputError(f"--model {path}: {problem} (its -settings.json)")
    try:
        with warnings.catch_warnings():  # imports() cannot infer the input's type before the first batch; it is fine
            warnings.simplefilter("ignore", UserWarning)
            return mx.gluon.SymbolBlock.imports(path + "-symbol.json", ["data"], path + "-0000.params", ctx=ctx)
    except (mx.base.MXNetError, ValueError, AssertionError) as err:
        raise InputError(f"--model {path}: cannot load ({checkpoint.first_line(err)})") from None


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read ({err})") from None


def from_checkpoint(s, folder, ctx):
    """The model of `s` with the parameters of the newest usable checkpoint in `folder` and its ranks' BatchNorm
    statistics averaged: the one model a multi-rank run's eval judges (train.one_model)."""
    chosen = checkpoint.newest_usable(folder, set_aside=False) if os.path.isdir(folder) else None
    if chosen is None:
        raise InputError(f"--checkpoint-dir {folder}: no checkpoint there")
    meta = checkpoint.read_meta(chosen)  # its structure checked by newest_usable
    problem = checkpoint.settings_problem(meta["settings"], s)
    if problem:
        raise InputError(f"--checkpoint-dir {folder}: {problem} ({chosen})")
    net = network(s, ctx)
    params = mx.nd.load(os.path.join(chosen, "params"))  # host arrays (Checkpoints.write_rank_files)
    stats = [mx.nd.load(os.path.join(chosen, f"rank{r}.aux")) for r in range(meta["world"])]
    for name, p in net.collect_params().items():
        if name not in params or params[name].shape != p.shape:
            raise InputError(f"{chosen}: written for another model ({name}); give its settings")
        p.set_data(mean([ranks[name] for ranks in stats]) if name in stats[0] else params[name])
    print(f"rn50_mx.evaluate: {chosen}", file=sys.stderr)
    return net


def mean(arrays):
    """The ranks' mean of one statistic; the array itself when they agree (after an eval: exact, whatever the
    number of ranks)."""
    if all((a == arrays[0]).min().asscalar() for a in arrays[1:]):
        return arrays[0]
    return mx.nd.add_n(*arrays) / len(arrays)


def main():
    argv = sys.argv[1:]
    if "-h" in argv or "--help" in argv:
        print(USAGE + "\n\n" + config.help_text("rn50_mx.evaluate"))
        return 0
    path, rest = split_model_flag(argv)
    s = config.load(rest, prog="rn50_mx.evaluate")
    if bool(path) == bool(s.checkpoint_dir):
        raise InputError("give one of --model PATH and --checkpoint-dir DIR")
    if not s.data_val:
        raise InputError("--data-val: not set (the val .rec to evaluate on)")
    d = dist.init(s)
    ctx = dist.context(s, d.local_rank)
    with ctx:
        net = exported(path, s, ctx) if path else from_checkpoint(s, s.checkpoint_dir, ctx)
        val_it = data.dali_iter(s, False, d.rank, d.size, 0, ctx).open()  # val reads in order: the seed draws nothing
        top1, top5, n = accuracy(net, val_it, d)
    if d.rank == 0:
        print(f"top-1 {top1!r}, top-5 {top5!r} ({n} images)", flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main, "rn50_mx.evaluate")
