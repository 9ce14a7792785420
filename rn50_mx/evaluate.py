"""Evaluate trained weights on the val .rec exactly as a training run's eval does (train.accuracy: every val image once
across the ranks, top-1 and top-5): the figure the run logged for the same weights.

    python -m rn50_mx.evaluate --model PATH [rn50_mx.train flags]           (PATH-symbol.json, -0000.params and
                                                                            -settings.json: --save-model PATH's)
    python -m rn50_mx.evaluate --checkpoint-dir DIR [rn50_mx.train flags]   (the newest usable checkpoint in DIR)

It takes the training settings (flags and variables: --data-val, --image-shape, --num-classes, --batch-size,
--device, --dtype, ...); under horovodrun with --kv-store horovod each rank reads its val shard, as in training.
The files are read by the checkpoint package, beside their writers.
"""
import os
import sys

import mxnet as mx

from . import checkpoint, config, data, dist
from .checkpoint.disk import first_line
from .errors import InputError, run_cli
from .train import accuracy, flip_axis, network

USAGE = "usage: python -m rn50_mx.evaluate (--model PATH | --checkpoint-dir DIR) --data-val VAL.rec [rn50_mx.train flags]"


def parser():
    """evaluate's own option (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.evaluate", __doc__)
    parser.add_argument("--model", metavar="PATH", default="",
                        help="the model --save-model PATH wrote (PATH-symbol.json, -0000.params, -settings.json)")
    return parser


def from_checkpoint(s, folder, ctx):
    """The model of `s` with the arrays of the newest usable checkpoint in `folder` (checkpoint.model_arrays)."""
    chosen = checkpoint.newest_usable(folder, set_aside=False) if os.path.isdir(folder) else None
    if chosen is None:
        raise InputError(f"--checkpoint-dir {folder}: no checkpoint there")
    problem = checkpoint.settings_problem(checkpoint.read_meta(chosen)["settings"], s, checkpoint.CHECKPOINT_FIELDS)
    if problem:
        raise InputError(f"--checkpoint-dir {folder}: {problem} ({chosen})")
    net = network(s, ctx, drawn=False)  # every value comes from the checkpoint
    checkpoint.set_params(net, checkpoint.model_arrays(chosen), chosen)
    print(f"rn50_mx.evaluate: {chosen}", file=sys.stderr)
    return net


def main():
    argv = sys.argv[1:]
    if "-h" in argv or "--help" in argv:
        print(USAGE + "\n\n" + config.help_text("rn50_mx.evaluate"))
        return 0
    args, rest = parser().parse_known_args(argv)
    path = args.model
    s = config.load(rest, prog="rn50_mx.evaluate")
    if bool(path) == bool(s.checkpoint_dir):
        raise InputError("give one of --model PATH and --checkpoint-dir DIR")
    if not s.data_val:
        raise InputError("--data-val: not set (the val .rec to evaluate on)")
    d = dist.init(s)
    ctx = dist.context(s, d.local_rank)
    with ctx:
        net = checkpoint.load_model(path, s, ctx) if path else from_checkpoint(s, s.checkpoint_dir, ctx)
        val_it = data.dali_iter(s, False, d.rank, d.size, 0, ctx).open()  # val reads in order: the seed draws nothing
        try:
            top1, top5, n = accuracy(net, val_it, d, flip_axis(s))
        except mx.base.MXNetError as err:  # a saved symbol's graph runs first here (imports() only parses it)
            raise InputError(f"{'--model ' + path if path else '--checkpoint-dir ' + s.checkpoint_dir}: the model "
                             f"fails on this data ({first_line(err)})") from None
    if d.rank == 0:
        print(f"top-1 {top1!r}, top-5 {top5!r} ({n} images)", flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main, "rn50_mx.evaluate")
