"""`python -m rn50_mx.check`: the settings training would resolve, their data files and the RCP verdict, checked
before any rank starts (the launchers run it); `--env-names`: the variables to hand on to a container.

    python -m rn50_mx.check [rn50_mx.train flags]   # every resolved value with its origin, then the verdicts
    python -m rn50_mx.check --env-names             # one name per line
"""
import sys

from . import config, data
from .errors import run_cli
from .recipe.check import verdict

def check(flags):
    """Validate the environment (and `flags`) as training would, check the data files the settings name (or say
    that none were), print each resolved setting with its origin, then the RCP verdict; a bad value ends it with
    one line naming the variable or file (exit 2)."""
    settings, origins = config.resolve(flags, prog="rn50_mx.check")
    files = data.check_files(settings)
    print(config.describe(settings, origins))
    print(f"data: {files}")
    print(verdict(settings))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--env-names"]:
        print("\n".join(config.env_names()))
        return 0
    return check(argv)


if __name__ == "__main__":
    run_cli(main, "rn50_mx.check")
