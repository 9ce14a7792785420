"""The suite's cost profile, a pytest plugin (tests/conftest.py registers it): each test's wall time and CPU time
(setup, call and teardown: user + system of the test's process and of every child process it waited for, from
getrusage) and the kinds of cost it paid, read from what ran, never from a list of test names:

    trains     a `python -m rn50_mx.train` process (alone, under horovodrun, a launcher or a trial) or training
               steps in the test's own process (rn50_mx.train.train_step called)
    horovod    horovodrun (its script, or its code as rn50_mx.children.horovodrun runs it) or mpirun started (the
               rendezvous of ranks: seconds before the first step)
    daemon     dockerd, containerd, slurmctld, slurmd or munged started
    image      an image built or loaded (docker build/load, mmdebstrap, make image-cpu)
    container  docker run
    slurm      sbatch or srun

The commands are seen twice: every subprocess.Popen of the test's own process (an audit hook: exact, however
short), and the test's whole process tree, sampled every SAMPLE_S while the test runs (the grandchildren: a
training that a launcher script starts); the sampler also counts the processes it saw (those that lived a sample
interval or more: every python that imports MXNet does, about 2.5 s of CPU each). The CPU that a daemon spends for a
test outside the test's process tree (a Slurm job's slurmstepd, a container's processes: both detach from their
parent) is not in its CPU figure; its wall time is. The machine's busy CPU over the session (/proc/stat) is printed
beside the tests' sum, so that what the tests' figures miss shows as the difference.

A worker's last test tears down the session's fixtures too (a Docker engine stopped and waited for, its CPU then
the worker's children's): that teardown is its own row, "session fixtures", not the test's.

At the end of the run the controller prints the totals, each worker's share and the 10 slowest tests, and writes the
whole profile as JSON to the pytest cache (.pytest_cache/d/rn50-profile/profile.json), which `python
bench/test_profile.py` prints by file. Nothing here asserts a time: the profile is for reading.
"""
import json
import os
import resource
import sys
import threading
import time

import pytest

from rn50_mx.children import HOROVODRUN
from tests.support import schedule

SAMPLE_S = 0.25
SLOWEST = 10
PROPERTY = "rn50_cost"  # the user property a test's teardown report carries its figures in (xdist sends it over)
SESSION_FIXTURES = "session fixtures"  # the file and unit of a worker's session teardown row
CACHE_FOLDER = "rn50-profile"

DAEMONS = {"dockerd", "containerd", "slurmctld", "slurmd", "munged"}
LAUNCHERS = {"horovodrun", "mpirun", "mpiexec", "orterun", "prterun"}


def kinds_of(argv):
    """The kinds of cost a command line shows (see the module's docstring)."""
    names = [os.path.basename(a) for a in argv[:2]]  # a Python script runs as [python, /path/script, ...]
    words = set(argv)
    found = set()
    if "rn50_mx.train" in words:
        found.add("trains")
    if LAUNCHERS & set(names) or HOROVODRUN in words:
        found.add("horovod")
    if DAEMONS & set(names):
        found.add("daemon")
    docker = "docker" in names and len(argv) > 1
    if (docker and {"build", "load"} & words) or "mmdebstrap" in names or {"make", "image-cpu"} <= words:
        found.add("image")
    if docker and "run" in words:
        found.add("container")
    if {"sbatch", "srun"} & set(names):
        found.add("slurm")
    return found


def cpu_seconds():
    """User + system seconds of this process and of its waited-for children so far."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def machine_busy():
    """CPU-seconds this machine's CPUs have been busy since boot (user, nice, system, irq and softirq of /proc/stat's
    cpu line: every process's, daemons' and containers' included), or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = ticks
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def children_of(pid):
    """The pids of `pid`'s children now: each of its threads' /proc children file. An ended process has none; so would
    every process on a kernel built without CONFIG_PROC_CHILDREN (Debian's and Ubuntu's kernels have it), where the
    profile's process counts and kinds from grandchildren would read 0."""
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += map(int, f.read().split())
    except (FileNotFoundError, ProcessLookupError):  # it (or a thread of it) ended while read
        pass
    return found


def tree_of(pid):
    """{pid: its start time in clock ticks} of the processes under `pid` now, found through the children files of
    the tree alone: psutil's walk reads every process on the machine (1.3 ms with 67 of them; this, 0.08 with 3
    children), and the sampler looks 4 times a second on each worker."""
    found, todo = {}, children_of(pid)
    while todo:
        child = todo.pop()
        try:
            with open(f"/proc/{child}/stat") as f:
                found[child] = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime (proc(5))
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue  # ended meanwhile
        todo += children_of(child)
    return found


def cmdline_of(pid):
    """`pid`'s argv ([] when it ended, or is a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [os.fsdecode(arg) for arg in f.read().split(b"\0")[:-1]]
    except (FileNotFoundError, ProcessLookupError):
        return []


class Watch:
    """The kinds of cost the running test paid: its Popen calls (the audit hook) and its process tree (sampled by a
    thread while a test runs)."""

    def __init__(self):
        self.kinds = set()
        self.processes = 0  # of the running test's tree, seen by the sampler
        self.seen = {}  # (pid, start time) -> its command line when last read
        self.running = threading.Event()
        self.lock = threading.Lock()
        sys.addaudithook(self.audit)
        threading.Thread(target=self.sample, name="rn50-cost-sampler", daemon=True).start()

    def audit(self, event, args):
        if event == "subprocess.Popen" and self.running.is_set():
            argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
            self.add(kinds_of([os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]))

    def add(self, kinds, processes=0):
        with self.lock:
            self.kinds |= kinds
            self.processes += processes

    def sample(self):
        me = os.getpid()
        while True:
            self.running.wait()
            for key in tree_of(me).items():
                # read again at every look: a child seen between its fork and its exec still shows its parent's
                # command line (bash's, one word holding the command), and the exec keeps its pid and start time
                argv = cmdline_of(key[0])
                if self.seen.get(key) != argv:
                    self.add(kinds_of(argv), int(key not in self.seen))
                    self.seen[key] = argv
            time.sleep(SAMPLE_S)

    def start(self, train_module):
        with self.lock:
            self.kinds, self.processes = set(), 0
        self.wrap_train_step(train_module)
        self.running.set()

    def stop(self):
        """(kinds, processes) of the test that ran."""
        self.running.clear()
        with self.lock:
            return sorted(self.kinds), self.processes

    def wrap_train_step(self, train_module):
        """Once rn50_mx.train is imported in this process, its train_step reports the test as one that trains (fit
        and every test that steps call it through the module)."""
        if train_module is None or getattr(train_module.train_step, "_rn50_cost", False):
            return
        step = train_module.train_step

        def counted_step(*args, **kwargs):
            self.add({"trains"})
            return step(*args, **kwargs)

        counted_step._rn50_cost = True
        train_module.train_step = counted_step


class Profile:
    """The plugin: figures taken in the process that runs the test (an xdist worker, or the only process), gathered
    and printed by the one that reports."""

    def __init__(self, config):
        self.config = config
        self.watch = Watch()
        self.began = {}  # nodeid -> (wall clock, CPU seconds)
        self.last_teardown = None  # (wall, CPU seconds) of this worker's last teardown, the session's fixtures in it
        self.tests = []
        self.session_start = time.time()
        self.machine_start = machine_busy()

    # --- where the test runs ---------------------------------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item):
        self.began[item.nodeid] = (time.time(), cpu_seconds())
        self.watch.start(sys.modules.get("rn50_mx.train"))
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        """The teardown after a worker's last test (nextitem None) ends the session's fixtures: timed apart."""
        start, cpu = time.time(), cpu_seconds()
        yield
        if nextitem is None:
            self.last_teardown = (time.time() - start, cpu_seconds() - cpu)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if call.when != "teardown" or item.nodeid not in self.began:
            return
        start, cpu = self.began.pop(item.nodeid)
        kinds, processes = self.watch.stop()
        group = schedule.unit(item)
        worker, end = os.environ.get("PYTEST_XDIST_WORKER", "main"), time.time()
        session_wall, session_cpu = self.last_teardown or (0.0, 0.0)  # the session's teardown: not this test's
        rows = [{"test": item.nodeid.removesuffix("@" + group), "file": item.nodeid.split("::")[0], "unit": group,
                 "wall": round(end - start - session_wall, 3), "cpu": round(cpu_seconds() - cpu - session_cpu, 3),
                 "kinds": kinds, "processes": processes, "end": round(end, 3), "worker": worker}]
        if self.last_teardown:
            rows.append({"test": f"{SESSION_FIXTURES}: the teardown after {worker}'s last test",
                         "file": SESSION_FIXTURES, "unit": SESSION_FIXTURES, "wall": round(session_wall, 3), "cpu": round(session_cpu, 3),
                         "kinds": [], "processes": 0, "end": round(end, 3), "worker": worker})
            self.last_teardown = None
        report.user_properties += [(PROPERTY, row) for row in rows]

    # --- where the reports arrive ----------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report):
        if report.when == "teardown":
            self.tests += [value for name, value in report.user_properties if name == PROPERTY]

    def pytest_terminal_summary(self, terminalreporter):
        if hasattr(self.config, "workerinput") or not self.tests:
            return
        elapsed = time.time() - self.session_start
        now = machine_busy()
        machine = now - self.machine_start if None not in (now, self.machine_start) else None
        path = self.save(elapsed, machine)
        write = terminalreporter.write_line
        terminalreporter.section("cost profile")
        for line in summary(self.tests, elapsed, self.session_start, machine=machine):
            write(line)
        write(f"the whole profile: {path or 'not saved (no cache)'}; by file: python bench/test_profile.py")

    def save(self, elapsed, machine):
        cache = getattr(self.config, "cache", None)
        if cache is None:
            return None
        path = os.path.join(cache.mkdir(CACHE_FOLDER), "profile.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"session_wall": round(elapsed, 1), "start": self.session_start,
                       "machine_cpu": machine and round(machine, 1), "tests": self.tests}, f, indent=0)
        os.replace(path + ".tmp", path)
        return path


def summary(tests, elapsed, start, slowest=SLOWEST, machine=None):
    """The lines printed at the end of a run: totals (with `machine`, the machine's busy CPU-seconds over the session),
    each worker's busy time and when it ran out of tests, and the slowest tests by wall time."""
    wall, cpu = sum(t["wall"] for t in tests), sum(t["cpu"] for t in tests)
    count = sum(t["file"] != SESSION_FIXTURES for t in tests)
    lines = [f"{count} tests: {wall:.0f} s of test time, {cpu:.0f} s CPU (the tests' processes and the children they "
             f"waited for, the session fixtures' teardown included); the session {elapsed:.0f} s"]
    if machine is not None:
        lines.append(f"the machine: {machine:.0f} CPU-s busy over the session ({machine / elapsed:.2f} of its "
                     f"{os.cpu_count()} CPUs); {machine - cpu:.0f} outside the tests' figures (daemons, containers, "
                     "Slurm jobs, pytest's own processes, and anything else that ran meanwhile)")
    workers = sorted({t["worker"] for t in tests})
    if len(workers) > 1:
        lines.append("workers: " + ", ".join(
            f"{w} busy {sum(t['wall'] for t in tests if t['worker'] == w):.0f} s, done at "
            f"{max(t['end'] for t in tests if t['worker'] == w) - start:.0f} s" for w in workers))
    lines.append(f"the {slowest} slowest (wall s, CPU s, kinds of cost):")
    for t in sorted(tests, key=lambda t: -t["wall"])[:slowest]:
        lines.append(f"{t['wall']:8.1f} {t['cpu']:8.1f}  {','.join(t['kinds']) or '-':24} {t['test']}")
    return lines
