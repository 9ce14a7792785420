"""`python -m rn50_mx.check`: the settings training would resolve, their data files and the RCP verdict, checked
before any rank starts (the launchers run it); `--env-names`: the variables to hand on to a container.

    python -m rn50_mx.check [rn50_mx.train flags]   # every resolved value with its origin, then the verdicts
    python -m rn50_mx.check --resume STATE [flags]  # the same, and a checkpoint the stopped trial can resume from
    python -m rn50_mx.check --env-names             # one name per line
"""
import os
import sys

from . import config
from .errors import InputError, run_cli, settings_first


def parser():
    """The check's own options (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.check", __doc__)
    parser.add_argument("--resume", metavar="STATE", help="the launcher's state file of a stopped trial: refuse unless "
                        "RN50_CHECKPOINT_DIR holds a checkpoint to resume it from (the file is named, not read)")
    parser.add_argument("--env-names", action="store_true", help="print the variables to hand on to a container, "
                        "one a line, and nothing else")
    return parser


def arguments(argv):
    """(options, (settings, origins)) of the command line; with --env-names, which takes nothing else, no settings."""
    args, rest = parser().parse_known_args(argv)
    if args.env_names:
        if rest or args.resume is not None:
            raise InputError("--env-names: takes no other argument")
        return args, None
    return args, config.resolve(rest, prog="rn50_mx.check")


def env_names():
    print("\n".join(config.env_names()))
    return 0


# `python -m rn50_mx.check` (the launchers run it before every trial and container): the arguments and settings
# before the data check below loads MXNet and DALI, so that --env-names and a bad setting take a tenth of a second
EARLY = settings_first(lambda: arguments(sys.argv[1:]), "rn50_mx.check") if __name__ == "__main__" else None
if EARLY and EARLY[0].env_names:
    run_cli(env_names, "rn50_mx.check")

from . import data
from .recipe.check import verdict


def check(settings, origins):
    """Check the data files the settings name (or say that none were), print each resolved setting with its origin,
    then the RCP verdict; a bad file ends it with one line naming it (exit 2)."""
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
    from . import checkpoint  # here: reading a checkpoint loads MXNet, which the check without --resume does not

    remedy = f"restore it, or remove {state} to start the trials anew"
    folder = s.checkpoint_dir
    if not folder:
        raise InputError(f"{state}: its trial resumes from RN50_CHECKPOINT_DIR, which is not set ({remedy})")
    if not os.path.isdir(folder) or checkpoint.newest_usable(folder, set_aside=False) is None:
        raise InputError(f"RN50_CHECKPOINT_DIR={folder}: no checkpoint to resume the trial {state} names ({remedy})")
    checkpoint.refuse_ended(folder)


def main(argv=None):
    if argv is None and EARLY:
        args, resolved = EARLY
    else:
        argv = sys.argv[1:] if argv is None else argv
        if "-h" in argv or "--help" in argv:
            print(__doc__.strip() + "\n\n" + config.help_text("rn50_mx.check"))
            return 0
        args, resolved = arguments(argv)
    if args.env_names:
        return env_names()
    if args.resume is not None:
        resumable(resolved[0], args.resume)
    status = check(*resolved)
    config.say_fallback(resolved[1])
    return status


if __name__ == "__main__":
    run_cli(main, "rn50_mx.check")
