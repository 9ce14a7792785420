"""`python -m rn50_mx.tune`: the Inspur article's input tuning, automated. On the sourced config and its data (the
settings object training resolves: DATADIR or --data-train), it times the training step on synthetic batches (the
ceiling) and on real ones, then searches the knobs that change throughput but not training (space.py) until real
data reach the target share of the ceiling or the budget is spent, and writes the choice as config/<SYSTEM>_tuned.sh.

    source config/CPU.sh
    DATADIR=data/fashion-mnist python -m rn50_mx.tune [--budget MIN] [--dry-run] [rn50_mx.train flags]

Modules: space (the knobs and their values), workers (where a candidate is timed: this process, or a worker with
another OMP_NUM_THREADS), search (coordinate descent in paired rounds), output (the plan, the table, the fragment).
The timing itself is rn50_mx/measure.py's, shared with bench/train_step.py and the self-test.
"""
import argparse
import os
import sys

from .. import children, config, files
from ..errors import InputError, run_cli
from . import output, space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parser():
    """The tuner's own options (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.tune", __doc__)
    parser.add_argument("--budget", type=float, default=10.0, help="minutes the search may take (default 10)")
    parser.add_argument("--target", type=float, default=0.98, help="stop at this real/synthetic (default 0.98)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per candidate (default 3)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per window (default 5)")
    parser.add_argument("--dry-run", action="store_true", help="list the plan, time nothing (no data needed)")
    parser.add_argument("--allow-augmentation-changes", action="store_true",
                        help="also search DALI_RESIZE_ANTIALIAS, which changes the images training sees")
    parser.add_argument("--out", default=os.path.join(ROOT, "config"), help="folder of the fragment (config/)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse_args(argv):
    """(the tuner's own options, the rn50_mx.train flags left for config)."""
    args, rest = parser().parse_known_args(argv)
    if args.budget < 0 or args.rounds < 1 or args.steps < 1:
        raise InputError("--budget must be >= 0, --rounds and --steps >= 1")
    return args, rest


def settings(rest, need_data=True):
    """The training settings, real data: a missing or unreadable train file fails here, before any timing. A plan
    (need_data False) is printed without data."""
    s = config.load(rest, prog="rn50_mx.tune").replace(synthetic=False)
    if need_data and not s.data_train:
        raise InputError("no train data: set DATADIR (the folder of train.rec) or give --data-train")
    if s.data_train:
        from .. import data  # loads MXNet and DALI: not for a plan without data

        data.check_files(s.replace(data_val=""))
    return s.replace(data_val="")


def tune(s, args):
    """Time, search, print the table, write the fragment; returns the fragment's path."""
    from .. import dist, measure
    from . import search, workers

    if measure.left_out(s):
        print(f"rn50_mx.tune: {measure.left_out(s)}", flush=True)
    start = space.start(s, args.allow_augmentation_changes)
    path = os.path.join(args.out, f"{s.dgxsystem}_tuned.sh")
    with files.owned_in_folder(path):  # the output is writable and ours before the measurement begins
        pool = workers.Workers(s, dist.context(s, 0))
        try:
            run = search.Search(pool, start, space.searched(s, args.allow_augmentation_changes), args.budget * 60,
                                args.target, args.steps, args.rounds,
                                progress=lambda row: print(output.row_line(row), flush=True))
            choice = run.run()
        finally:
            pool.close()
        print(output.table(run.rows, run.ceiling))
        print(f"stopped: {run.stop}; chose {space.describe(choice)} (real/synthetic {run.rows[0].ratio:.3f} -> "
              f"{run.ratio:.3f}) after {run.elapsed() / 60:.1f} min")
        output.write_fragment(path, output.fragment(s, start, choice, (run.rows[0].ratio, run.ratio), run.stop))
    return path


def main(argv=None):
    children.stop_on_sigterm()  # a stopped tuner ends its worker (run_cli)
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        from .. import dist
        from . import workers

        s = config.load(rest, prog="rn50_mx.tune")
        return workers.serve(s, dist.context(s, 0))
    s = settings(rest, need_data=not args.dry_run)
    print(output.plan(s, space.start(s, args.allow_augmentation_changes),
                      space.searched(s, args.allow_augmentation_changes), args), flush=True)
    if args.dry_run:
        return 0
    print(f"wrote {tune(s, args)}")
    return 0


def main_cli():
    run_cli(main, "rn50_mx.tune")
