"""The exit codes of a run's outcomes, read from exit_codes.sh beside this module: the one place they are stated,
which run_and_time.sh and trials.sh source as well."""
import os
import re
import sys

from .errors import InputError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_codes.sh")
NAMES = ("MISSED_EXIT", "RESUMABLE_EXIT", "DIVERGED_EXIT", "STALLED_EXIT")


def read_codes(path=SOURCE):
    """{NAME: code} of the NAME=number lines of `path`; an InputError naming the file unless each of NAMES is there
    once, a number, and the codes distinct: a code read wrong would make a stop look like another outcome."""
    try:
        with open(path) as f:
            found = [m.groups() for line in f for m in [re.match(r"^([A-Z_]+)=(\S*)", line)] if m]
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read the exit codes ({err}); reinstall rn50_mx") from None
    codes = dict(found)
    for name in NAMES:
        given = [value for key, value in found if key == name]
        if len(given) != 1 or not re.fullmatch(r"[1-9]\d?|1[01]\d|12[0-5]", given[0]):
            raise InputError(f"{path}: {name} is {' and '.join(given) or 'missing'}: it must be set once, to 1..125; "
                             "reinstall rn50_mx")
    if len({codes[name] for name in NAMES}) != len(NAMES):
        raise InputError(f"{path}: {', '.join(f'{name}={codes[name]}' for name in NAMES)}: the codes must differ; "
                         "reinstall rn50_mx")
    return {name: int(codes[name]) for name in NAMES}


try:
    _CODES = read_codes()
except InputError as _err:  # at import, before any command's own handler: its one line, not a traceback
    print(f"rn50_mx: error: {_err}", file=sys.stderr)
    raise SystemExit(2) from None
RESUMABLE_EXIT, DIVERGED_EXIT, STALLED_EXIT = (_CODES[name] for name in NAMES[1:])  # MISSED_EXIT: run_and_time.sh's
