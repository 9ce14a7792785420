"""How `make test` shares the suite between its workers (pytest-xdist, `--dist loadgroup`).

A unit of work is a test file (its tests share module fixtures and run in order on one worker, as with --dist
loadfile) or, in a file split in parts, each xdist_group its tests name (a group keeps the tests that share a
fixture together). The units go out costliest first, each to the next worker that runs short, by the seconds each
took in the profile saved in UNIT_COSTS (`bench/test_profile.py --save-costs` writes it from a run's profile); a
unit not in it (a new file or group) goes out before all others, its cost unknown. Longest first is what keeps both
workers busy to the end: with xdist's default order (most tests first) the one-test files, the slowest of all,
came last, and one worker ran them alone for minutes.

xdist's own loadgroup does not group here: it marks a test's group by rewriting the test's id, which pytest 9.2's
structured ids ignore (pytest-dev/pytest-xdist#1386, open; xdist 3.8.0 is the newest release), so grouped tests were
sent one by one. So each worker writes the unit of every test it collected to a file of the run's (UNITS_KEY in its
workerinput), and the controller's scheduler (Units, from the pytest_xdist_make_scheduler hook) reads them.
"""
import json
import os
import shutil
import tempfile

import pytest
from xdist.scheduler import LoadScopeScheduling

UNIT_COSTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit_costs.json")
UNITS_KEY = "rn50_units"  # workerinput: the folder where each worker writes {test id: unit}


def unit(item):
    """The work unit of a test: its xdist_group, else its file."""
    group = item.get_closest_marker("xdist_group")
    if group:
        return str(group.args[0] if group.args else group.kwargs.get("name", "default"))
    return item.nodeid.split("::")[0]


def known_costs(path=UNIT_COSTS):
    """{unit: seconds} from `path`; {} when it is missing or unreadable (the order then is the collection's)."""
    try:
        with open(path) as f:
            costs = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in costs.items() if isinstance(v, (int, float))} if isinstance(costs, dict) else {}


def order(items, costs):
    """`items` grouped by unit, the units costliest first (unknown ones first of all), each unit's tests in their
    collection order."""
    first = {}
    for i, item in enumerate(items):
        first.setdefault(unit(item), i)
    items.sort(key=lambda item: (-costs.get(unit(item), float("inf")), first[unit(item)]))


def write_units(items, folder, worker):
    """{test id: unit} of this worker's collection, for the controller's scheduler (written whole, then renamed)."""
    path = os.path.join(folder, f"{worker}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({item.nodeid: unit(item) for item in items}, f)
    os.replace(path + ".tmp", path)


class Units(LoadScopeScheduling):
    """xdist's scope scheduling (a scope's tests to one worker, the next scope to the worker that runs short) with the
    workers' units as the scopes, in the order the workers collected them (order(): costliest first)."""

    def __init__(self, config, log, folder):
        config.option.loadscopereorder = False  # xdist would put the units with most tests first
        super().__init__(config, log)
        self.folder = folder
        self.units = None

    def _split_scope(self, nodeid):
        if self.units is None:  # the workers have all collected (and written) by the time xdist asks
            self.units = {}
            for name in sorted(os.listdir(self.folder)):
                if name.endswith(".json"):
                    with open(os.path.join(self.folder, name)) as f:
                        self.units.update(json.load(f))
        return self.units.get(nodeid) or nodeid.split("::")[0]

    def _assign_work_unit(self, node):
        """xdist's (the unit at the head of the queue, the costliest left, to `node`), but the cheapest unit to a
        worker whose only test so far is one still running: xdist's worker starts a test only once it holds the next
        one (its fixtures' teardown needs it), so xdist hands a worker given a one-test unit a second unit at once,
        and the demo's worker took the next costliest as that next test. Those two were the session's longest path:
        test_demo 609 s then test_rehearse 425 s on one worker at d48caa2, the other two done 33 and 41 s before it
        (668 + 417 s at 5eae4d9, the others 39 and 49 s before)."""
        held = self.assigned_work.get(node, {})
        if self.workqueue and sum(map(len, held.values())) == 1 and self._pending_of(held) == 1:
            self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
        super()._assign_work_unit(node)


class Distribution:
    """The plugin (tests/conftest.py registers it where xdist is installed): the controller makes the folder of
    units and the Units scheduler under --dist loadgroup; each of its workers orders its collection and writes its
    units there. Without --dist loadgroup (a run of one file, -n 0) nothing changes."""

    def __init__(self, config):
        self.folder = None
        if not hasattr(config, "workerinput") and config.getvalue("dist") == "loadgroup":
            self.folder = tempfile.mkdtemp(prefix="rn50-units-")

    def pytest_configure_node(self, node):
        if self.folder:
            node.workerinput[UNITS_KEY] = self.folder

    def pytest_xdist_make_scheduler(self, config, log):
        return Units(config, log, self.folder) if self.folder else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        if UNITS_KEY in getattr(config, "workerinput", {}):
            order(items, known_costs())

    def pytest_collection_finish(self, session):
        workerinput = getattr(session.config, "workerinput", {})
        if UNITS_KEY in workerinput:
            write_units(session.items, workerinput[UNITS_KEY], workerinput["workerid"])

    def pytest_unconfigure(self, config):
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
