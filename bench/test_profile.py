"""What `make test` costs, by file and by test: the profile the suite's plugin (tests/support/costs.py) wrote at the
end of the last pytest run, or any saved copy of one.

    .venv/bin/python bench/test_profile.py [PROFILE.json] [--sort cpu|wall] [--top 20] [--against OLD.json]
    .venv/bin/python bench/test_profile.py [PROFILE.json] --save-costs

By file: its tests, the processes they started that lived a quarter second or more (each python that imports
MXNet costs about 2.5 s of CPU to start), their wall and CPU seconds (setup and teardown included: a module
fixture's training is paid by the file's first test that asks for it), and how many tests paid each kind of cost
(trains, horovod, daemon, image, container, slurm: read from what the test ran). Then the `--top` tests. With
--against, each file's CPU beside the older profile's, and the tests that are in one profile only (removed, merged
or new).
CPU is user + system of the test's process and the children it waited for: a Slurm job's or a container's processes
are not its children, so those tests' figure is low (their wall time is the guide); the machine's busy CPU over the
session, where the profile has it, shows how much the tests' figures miss. Each worker's teardown of the session's
fixtures (its last test's teardown) is a row of its own, "session fixtures", left out of the unit costs.
--save-costs writes each work unit's wall seconds (a file, or an xdist_group of a split file) to tests/unit_costs.json,
the order in which `make test` hands the units to its workers (tests/support/schedule.py): run it after a change
that moves a unit's cost much, from a profile of `make test` on a quiet machine.
"""
import argparse
import collections
import json
import numbers
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rn50_mx import files  # noqa: E402
from rn50_mx.errors import InputError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAST = os.path.join(ROOT, ".pytest_cache", "d", "rn50-profile", "profile.json")
UNIT_COSTS = os.path.join(ROOT, "tests", "unit_costs.json")
SESSION_FIXTURES = "session fixtures"  # the row of a worker's session teardown (tests/support/costs.py)


def load(path):
    """The profile at `path`, each test's fields checked: it may be a copy someone else made or edited. Opened as a
    regular file only (a FIFO would wait for a writer for ever); anything else is one line naming `path`."""
    try:
        fd = files.open_regular(path)
        with os.fdopen(fd) as f:
            profile = json.load(f)
        tests = profile["tests"]
        if not isinstance(tests, list) or not all(well_formed(t) for t in tests):
            raise ValueError("a test's id, file, unit, wall and CPU seconds or kinds not as the suite writes them")
        if not (profile.get("machine_cpu") is None or seconds(profile["machine_cpu"])):
            raise ValueError(f"machine_cpu {profile['machine_cpu']!r} is not a number of seconds")
    except InputError as err:
        sys.exit(f"test_profile: {err}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.exit(f"test_profile: {path}: not a profile the test suite wrote ({type(err).__name__}: {err})")
    return profile


def seconds(value):
    """Whether `value` is a JSON number of seconds (0 or more, finite)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value < float("inf")


def well_formed(test):
    """One test's record as tests/support/costs.py writes it."""
    return (isinstance(test, dict) and all(isinstance(test.get(k), str) for k in ("test", "file"))
            and isinstance(test.get("unit", ""), str) and seconds(test.get("wall")) and seconds(test.get("cpu"))
            and seconds(test.get("processes", 0)) and isinstance(test.get("kinds"), list)
            and all(isinstance(kind, str) for kind in test["kinds"]))


def count_tests(tests):
    """The tests of a profile's records: the session fixtures' rows are none."""
    return sum(t["file"] != SESSION_FIXTURES for t in tests)


def by_file(tests):
    """{file: {"tests": n, "wall": s, "cpu": s, "kinds": Counter}}."""
    files = collections.defaultdict(lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0, "processes": 0,
                                             "kinds": collections.Counter()})
    for t in tests:
        entry = files[t["file"]]
        entry["tests"] += 1
        entry["processes"] += t.get("processes", 0)
        entry["wall"] += t["wall"]
        entry["cpu"] += t["cpu"]
        entry["kinds"].update(t["kinds"])
    return files


def report(profile, sort, top, older=None):
    tests = profile["tests"]
    files = by_file(tests)
    old = by_file(older["tests"]) if older else {}
    lines = [f"{count_tests(tests)} tests, {sum(t['wall'] for t in tests):.0f} s of test time, "
             f"{sum(t['cpu'] for t in tests):.0f} s CPU; the session {profile.get('session_wall', 0):.0f} s"
             + (f" (before: {count_tests(older['tests'])} tests, {sum(t['cpu'] for t in older['tests']):.0f} s CPU, the "
                f"session {older.get('session_wall', 0):.0f} s)" if older else "")]
    if profile.get("machine_cpu") is not None:
        lines.append(f"the machine: {profile['machine_cpu']:.0f} CPU-s busy over the session; "
                     f"{profile['machine_cpu'] - sum(t['cpu'] for t in tests):.0f} outside the tests' figures")
    lines += ["", f"{'file':34} {'tests':>5} {'procs':>5} {'wall s':>8} {'CPU s':>8}"
             + (f" {'CPU before':>10}" if older else "")
             + "  kinds of cost (tests)"]
    for name, entry in sorted(files.items(), key=lambda item: -item[1][sort]):
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(entry["kinds"].items()))
        before = f" {old[name]['cpu']:10.0f}" if name in old else (f" {'-':>10}" if older else "")
        lines.append(f"{name:34} {entry['tests']:5} {entry['processes']:5} {entry['wall']:8.0f} {entry['cpu']:8.0f}"
                     f"{before}  {kinds}")
    for name in sorted(set(old) - set(files)):
        lines.append(f"{name:34} {'-':>5} {'-':>5} {'-':>8} {'-':>8} {old[name]['cpu']:10.0f}")
    lines += ["", f"the {top} costliest tests by {sort} (wall s, CPU s, kinds):"]
    for t in sorted(tests, key=lambda t: -t[sort])[:top]:
        lines.append(f"{t['wall']:8.1f} {t['cpu']:8.1f}  {','.join(t['kinds']) or '-':24} {t['test']}")
    if older:
        now, then = {t["test"] for t in tests}, {t["test"] for t in older["tests"]}
        lines += ["", f"only in the older profile ({len(then - now)}):", *sorted(then - now),
                  "", f"only in this one ({len(now - then)}):", *sorted(now - then)]
    return "\n".join(lines)


def save_costs(profile, path=UNIT_COSTS):
    """{unit: wall seconds} of the profile, costliest first, written under a temporary name of its own and renamed
    while holding the file's lock (files.write_atomically); a link or a folder planted at the path is refused."""
    costs = collections.Counter()
    for t in profile["tests"]:
        if t["file"] != SESSION_FIXTURES:  # no unit the scheduler hands out
            costs[t.get("unit", t["file"])] += t["wall"]
    text = json.dumps({name: round(seconds, 1) for name, seconds in costs.most_common()}, indent=1) + "\n"
    try:
        files.refuse_special(path, "unit costs")
        files.write_atomically(path, text, "unit costs")
    except InputError as err:
        sys.exit(f"test_profile: {err}")
    return f"wrote {path}: {len(costs)} units"


def positive(text):
    """--top: a whole number of tests, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of tests, 1 or more, not {text!r}")
    return int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", nargs="?", default=LAST, help=f"a profile (default: the last run's, {LAST})")
    parser.add_argument("--sort", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--top", type=positive, default=20)
    parser.add_argument("--against", help="an older profile to compare with")
    parser.add_argument("--save-costs", action="store_true", help=f"write each unit's seconds to {UNIT_COSTS}")
    args = parser.parse_args()
    if args.save_costs:
        return print(save_costs(load(args.profile)))
    print(report(load(args.profile), args.sort, args.top, load(args.against) if args.against else None))


if __name__ == "__main__":
    main()
