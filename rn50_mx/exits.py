"""The exit codes of a run's outcomes, read from exit_codes.sh beside this module: the one place they are stated,
which run_and_time.sh and trials.sh source as well."""
import os
import re

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_codes.sh")


def read_codes(path=SOURCE):
    """{NAME: code} of the NAME=number lines of `path`."""
    with open(path) as f:
        return {m.group(1): int(m.group(2)) for line in f for m in [re.match(r"^([A-Z_]+)=(\d+)\b", line)] if m}


_CODES = read_codes()
RESUMABLE_EXIT, DIVERGED_EXIT = _CODES["RESUMABLE_EXIT"], _CODES["DIVERGED_EXIT"]  # MISSED_EXIT: run_and_time.sh's
