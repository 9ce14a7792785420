"""`python -m rn50_mx.check`: the settings training would resolve, their data files and the RCP verdict, checked
before any rank starts (the launchers run it); `--env-names`: the variables to hand on to a container.

    python -m rn50_mx.check [rn50_mx.train flags]   # every resolved value with its origin, then the verdicts
    python -m rn50_mx.check --resume STATE [flags]  # the same, and a checkpoint the stopped trial can resume from
    python -m rn50_mx.check --env-names             # one name per line
"""
import os
import sys

from . import checkpoint, config, data
from .errors import InputError, run_cli
from .recipe.check import verdict

def check(flags):
    """Validate the environment (and `flags`) as training would, check the data files the settings name (or say
    that none were), print each resolved setting with its origin, then the RCP verdict; a bad value ends it with
    one line naming the variable or file (exit 2)."""
    settings, origins = config.resolve(flags, prog="rn50_mx.check")
    files = data.check_files(settings)
    print(config.describe(settings, origins))
    print(f"data: {files}")
    levers = config.open_levers(settings)
    print("open-division levers: " + (", ".join(f"{config.flag_name(k)} {v}" for k, v in levers.items()) if levers
                                      else "none (the closed division's rules)"))
    print(verdict(settings))
    return 0


def resumable(s, state):
    """Refuses, in one line, a launch that would resume the trial its state file `state` names (trials.sh) without
    a checkpoint to resume: the trial would start afresh, appended to the stopped run's log, and the state be
    dropped. The checkpoints are looked at, not touched (the run that resumes sets refused ones aside)."""
    remedy = f"restore it, or remove {state} to start the trials anew"
    folder = s.checkpoint_dir
    if not folder:
        raise InputError(f"{state}: its trial resumes from RN50_CHECKPOINT_DIR, which is not set ({remedy})")
    if not os.path.isdir(folder) or checkpoint.newest_usable(folder, set_aside=False) is None:
        raise InputError(f"RN50_CHECKPOINT_DIR={folder}: no checkpoint to resume the trial {state} names ({remedy})")
    checkpoint.refuse_ended(folder)


def parser():
    """The check's own options (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.check", __doc__)
    parser.add_argument("--resume", metavar="STATE", help="the launcher's state file of a stopped trial: refuse unless "
                        "RN50_CHECKPOINT_DIR holds a checkpoint to resume it from (the file is named, not read)")
    parser.add_argument("--env-names", action="store_true", help="print the variables to hand on to a container, "
                        "one a line, and nothing else")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip() + "\n\n" + config.help_text("rn50_mx.check"))
        return 0
    args, rest = parser().parse_known_args(argv)
    if args.env_names:
        if rest or args.resume is not None:
            raise InputError("--env-names: takes no other argument")
        print("\n".join(config.env_names()))
        return 0
    if args.resume is not None:
        resumable(config.load(rest, prog="rn50_mx.check"), args.resume)
    return check(rest)


if __name__ == "__main__":
    run_cli(main, "rn50_mx.check")
