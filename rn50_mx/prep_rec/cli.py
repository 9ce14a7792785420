"""The command line of `python -m rn50_mx.prep_rec` (see the package docstring)."""
import argparse
import sys

from .. import children, config
from ..errors import run_cli
from ..mlperf_rules import IMAGENET_CLASSES
from .fashion_mnist import make_fashion_mnist
from .folders import pack
from .imagenet import pack_imagenet
from .records import classes_from_lst
from .verify import verify

PROG = "prep_rec"


def parser():
    """The packer's commands and options; an error is one line (config.Parser)."""
    parser = config.Parser(prog="python -m rn50_mx.prep_rec", description="Pack images into MXNet .rec/.idx files.")
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workers", type=positive, default=2, help="threads reading the files (default 2; imagenet: 8)")
    common.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress bar (there is none anyway when stderr is not a terminal)")
    packing = argparse.ArgumentParser(add_help=False, parents=[common])
    packing.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                         help="keep the sorted order (default: shuffled like im2rec, seed 100)")
    packing.add_argument("--skip-bad", action="store_true",
                         help="leave out unreadable or non-image files and count them instead of stopping")
    packing.add_argument("--force", action="store_true", help="replace an existing packed set (default: keep it)")

    cmd = commands.add_parser("pack", parents=[packing], help="SRC_DIR's class folders -> OUT_PREFIX.{lst,rec,idx}")
    cmd.add_argument("src_dir")
    cmd.add_argument("out_prefix")
    source = cmd.add_mutually_exclusive_group()
    source.add_argument("--list", dest="list_file", metavar="FILE.lst",
                        help="pack the images of this im2rec .lst, in its order, instead of listing SRC_DIR")
    source.add_argument("--classes-from", metavar="OTHER.lst",
                        help="take the folder -> label map from another split's .lst")

    cmd = commands.add_parser("imagenet", parents=[packing],
                              help="ImageNet as downloaded (the official archives, Kaggle's layout, an extracted "
                                   "tree or class folders) -> OUT_DIR/{train,val}.{lst,rec,idx}")
    cmd.add_argument("src", help="folder holding the archives or the tree")
    cmd.add_argument("out_dir")
    cmd.add_argument("--classes", type=positive, default=IMAGENET_CLASSES,
                     help="classes to expect where no devkit says (default 1000)")
    cmd.add_argument("--check-md5", action="store_true",
                     help="first check the official archives against their MD5 (one more read of 155 GB)")
    cmd.add_argument("--keep-odd-bytes", action="store_true",
                     help="keep the PNG and CMYK files' bytes (default: RGB JPEG, quality 100, as MLPerf)")
    cmd.set_defaults(workers=8)

    cmd = commands.add_parser("fashion-mnist", parents=[common],
                              help="the embedded default dataset -> OUT_DIR/{train,val}.{lst,rec,idx}")
    cmd.add_argument("out_dir")
    cmd.add_argument("--size", type=positive, default=64, help="image side in pixels (default 64)")
    cmd.add_argument("--train-per-class", type=natural, default=1000, help="train images per class; 0 = all 6000")
    cmd.add_argument("--val-per-class", type=natural, default=200, help="val images per class; 0 = all 1000")

    cmd = commands.add_parser("verify", parents=[common], help="check PREFIX.idx/.rec and decode every image")
    cmd.add_argument("prefix", help="PREFIX of PREFIX.rec and PREFIX.idx")
    cmd.add_argument("--num-classes", type=positive, help="labels must be below this")
    return parser


def parse_args(argv):
    return parser().parse_args(argv)


def positive(text):
    return whole(text, 1)


def natural(text):
    return whole(text, 0)


def whole(text, low):
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
    return value


def run(args):
    """Run one parsed command; the exit code is 1 when verify finds a bad record."""
    children.stop_on_sigterm()  # `kill` cleans up like Ctrl-C
    options = dict(workers=args.workers, progress=args.progress)
    if args.command == "verify":
        summary = verify(args.prefix, num_classes=args.num_classes, **options)
        for index, offset, problem in summary.problems:
            print(f"{args.prefix}.rec: record {index} at offset {'?' if offset is None else offset}: {problem}")
        print(summary.line(f", {len(summary.problems)} BAD" if summary.problems else ", all good"))
        return 1 if summary.problems else 0
    if args.command == "fashion-mnist":
        summaries = make_fashion_mnist(args.out_dir, size=args.size, train_per_class=args.train_per_class,
                                       val_per_class=args.val_per_class, **options)
        if summaries is None:
            print(f"{args.out_dir}: already complete for these arguments; nothing to do")
            return 0
        for summary in summaries:
            report(summary)
        return 0
    options.update(shuffle=args.shuffle, skip_bad=args.skip_bad, force=args.force)
    if args.command == "imagenet":
        pack_imagenet(args.src, args.out_dir, classes=args.classes, md5=args.check_md5,
                      keep_odd_bytes=args.keep_odd_bytes, on_split=report, **options)
    else:
        classes = classes_from_lst(args.classes_from) if args.classes_from else None
        report(pack(args.src_dir, args.out_prefix, list_file=args.list_file, classes=classes, **options))
    return 0


def report(summary):
    """One packed file's summary line on stdout, after a line on stderr for each bad file it left out."""
    for problem in summary.problems:
        print(f"{PROG}: skipped {problem}", file=sys.stderr)
    notes = [f", {len(summary.problems)} bad files skipped"] * bool(summary.problems)
    notes += [f", {len(summary.notes)} odd files re-encoded as RGB JPEG: {'; '.join(summary.notes)}"] * bool(
        summary.notes)
    print(summary.line("".join(notes)), flush=True)


def main(argv=None):
    """Command-line entry point (python -m rn50_mx.prep_rec, or rn50-prep-rec)."""
    run_cli(lambda: run(parse_args(argv)), PROG)
