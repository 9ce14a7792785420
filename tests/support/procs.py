"""Running our commands and scripts as a user would: a clean environment, the test run's python first on PATH."""
import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rn50_mx.rehearse import stages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The python of this test run, and its horovodrun, come first on PATH: the scripts call `python`.
ENV_PATH = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
# Every process a test starts imports this checkout's rn50_mx and tests/, whichever checkout the venv's editable
# install points at: `tests` is not installed, and a script run by path has only its own folder on sys.path.
PYTHONPATH = {"PYTHONPATH": os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
# make test runs three workers on two cores, so a process of two OpenMP threads (config/CPU.sh's OMP_NUM_THREADS is
# $(nproc)) always shares its cores with the other workers', and libgomp's idle threads spin (up to 300,000 turns)
# before they sleep, on CPU that worker needs. PASSIVE (OpenMP's own variable) puts them to sleep at once; the same
# threads do the same work, so results do not change (the demo: top-1 0.7734 at epoch 4 either way). tests/conftest.py
# puts it in the tests' own environment, which clean_environ() and the tests' launches inherit; the helpers below that
# start from an empty one add it. Measured on config/CPU.sh's steps beside one busy process: 18.8 -> 11.9 s CPU.
SHARED_CORES = {"OMP_WAIT_POLICY": "PASSIVE"}
# One OpenMP thread for a test's process that computes after `source config/CPU.sh` (whose OMP_NUM_THREADS is $(nproc)):
# make test's three workers keep both cores busy, and a process of two threads then waits on the one descheduled at
# every parallel region, PASSIVE or not. The self-test's CPU check at batch 32 beside two busy processes: 64.7
# CPU-seconds with two threads against 10.7 with one (two runs each, the same rows passing); alone, 11.9. The same
# code runs: the thread count chooses no path.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def gloo_ranks(n):
    """The command prefix that starts n Gloo ranks on this machine: the rehearsal's (rehearse.stages.horovodrun, this
    Python's Horovod), whose ranks poll Horovod's cycle every CYCLE_MS = 25 ms, not at Horovod's shorter default:
    the ranks share 2 cores with the other workers' tests, and a 2-rank run of 12 tiny steps took 12.4-13.5
    CPU-seconds at the default, 11.6-12.1 at 5 ms, 10.9-11.5 at 25 ms (against 11.7-11.8 at 5 then: 3 runs each,
    side by side). A latency, not a code path: the launchers' trials keep the config's cycle."""
    return stages.horovodrun(n)


def wait_for(proc, out, pattern, timeout=240):
    """Until `pattern` is in the file `out` that `proc` (or a child of it) writes, a file not there yet read as
    empty; a process that ends first or a timeout fails the test, and its group is killed (start `proc` with
    start_new_session=True)."""
    def text():
        return open(out).read() if os.path.exists(out) else ""

    deadline = time.time() + timeout
    while not re.search(pattern, text(), re.M):
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"never saw {pattern!r}: " + text()[-3000:])
        time.sleep(0.1)


def bash(script, env=None, cwd=ROOT, timeout=120):
    """Run `script` with bash -c in a clean environment (plus `env`); returns the CompletedProcess."""
    full_env = {"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp"), **PYTHONPATH, **SHARED_CORES,
                **(env or {})}
    return subprocess.run(["bash", "-c", script], env=full_env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def sourced(system, command, env=None, **kwargs):
    """`command` after `source config/<system>.sh`, with the environment `env` exported after the config."""
    exports = "".join(f"export {name}={value!r}; " for name, value in (env or {}).items())
    return bash(f"set -euo pipefail; source config/{system}.sh; {exports}{command}", **kwargs)


def config_environ(system, env=None):
    """The environment `source config/<system>.sh` makes (`env` exported after it), as a dict."""
    out = sourced(system, "env -0", env).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def assert_one_line_naming(result, name):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0] and "Traceback" not in result.stderr
    assert "RESULT," not in result.stdout


def clean_environ():
    """This process's environment without any variable rn50_mx reads, so only the test's flags count."""
    from rn50_mx import config
    ours = {f.metadata["env"] for f in config.FIELDS.values()} | set(config.REFERENCE_ONLY_ENV)
    kept = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith(config.OWNED_ENV_PREFIXES)}
    return {**kept, **PYTHONPATH}


def run_recipe(config_dir, *flags):
    """`python -m rn50_mx.recipe` writing into `config_dir` (the conftest's config_dir)."""
    return subprocess.run([sys.executable, "-m", "rn50_mx.recipe", "--config-dir", str(config_dir), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def run_train(argv, env=None, timeout=600):
    """`python -m rn50_mx.train ARGV` in a clean environment (plus `env`); the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "rn50_mx.train", *argv], env={**clean_environ(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def run(command, env=None, timeout=120, **kwargs):
    full_env = {"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp"), **PYTHONPATH, **SHARED_CORES,
                **(env or {})}
    return subprocess.run(command, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)


def py(*args):
    return [sys.executable, "-m", *map(str, args)]


def launcher(command, env):
    """A launcher after `source config/CPU.sh`, with `env` exported after it."""
    exports = "".join(f"export {name}={value!r}; " for name, value in env.items())
    return ["bash", "-c", f"set -euo pipefail; source config/CPU.sh; {exports}exec {command}"], {}


@contextlib.contextmanager
def mounted(path, options):
    """A tmpfs at `path` mounted with `options` (root only: the probe is skipped elsewhere)."""
    os.makedirs(path, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("needs root to mount a tmpfs")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def files_in(folder):
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def sigterm_to(command, out, ready, group=False):
    """Start `command` (from the repository), send it SIGTERM once ready(output, its processes) holds (with `group`,
    SIGINT to its process group, as a terminal's Ctrl-C); none of its processes may be left running. Returns its exit
    status and its output."""
    with open(out, "w") as sink:
        proc = subprocess.Popen(command, env={"PATH": ENV_PATH, "HOME": "/tmp", **PYTHONPATH, **SHARED_CORES},
                                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=group)
    procs = []
    try:
        deadline = time.time() + 300
        while not ready(out.read_text(), procs):
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
            with contextlib.suppress(psutil.NoSuchProcess):
                procs = psutil.Process(proc.pid).children(recursive=True)
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
        assert_all_end(procs, timeout=15)
        return status, out.read_text()
    finally:
        for p in [*procs, psutil.Process(proc.pid)] if proc.poll() is None else procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


# faulthandler on in a child (PYTHONFAULTHANDLER): its SIGABRT handler prints every thread's Python stack.
FAULT_STACKS = {"PYTHONFAULTHANDLER": "1"}


def ended_after(proc, sig, timeout=60):
    """(stdout, stderr) of `proc` (a Popen with pipes) once it has ended after `sig`. One still running after `timeout`
    s fails the test with what each of its threads was doing (/proc: state, blocked and pending signals, the kernel's
    wait channel) and, started with FAULT_STACKS, every thread's Python stack (faulthandler, on SIGABRT): a stop that
    never lands is a finding to read, not a bare timeout (fc73: a pack SIGTERMed while it waited on a FIFO)."""
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        threads = "\n".join(thread_lines(proc.pid))
        proc.send_signal(signal.SIGABRT)
        try:
            stacks = proc.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            stacks = proc.communicate()[1]
        pytest.fail(f"still running {timeout} s after signal {sig}:\n{threads}\n{stacks[-6000:]}")


def thread_lines(pid):
    """One line per thread of process `pid`: its id, name, state, blocked and pending signals (the thread's and the
    process's) and where in the kernel it waits."""
    lines = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read()
            lines.append(f"{tid} {status['Name']} {status['State']} blocked {status['SigBlk']} pending "
                         f"{status['SigPnd']}/{status['ShdPnd']} caught {status['SigCgt']} in {wchan}")
    return lines


def running(process):
    """Whether `process` (a psutil.Process) still runs. A zombie has ended (only its entry is left until its parent
    reaps it), and so has a process that ends while it is asked: psutil raises then, and a test that looks while
    processes come and go must not fail on one that just ended."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_end(processes, timeout):
    """Waits up to `timeout` seconds for `processes` (psutil.Process) to end, then asserts that none still runs,
    naming the command lines of those that do."""
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    left = [p for p in alive if running(p)]
    assert not left, [command_line(p) for p in left]


def command_line(process):
    """`process`'s argv, or its pid once it has ended (for a message about it)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return process.pid


def descendants(pid):
    """{process: its command line} of the processes under `pid` now (one that ends meanwhile left out: a test that
    looks while processes come and go must not fail on one that just ended)."""
    found = {}
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found[proc] = proc.cmdline()
    return found


class Reaper:
    """A pytest plugin (tests/conftest.py registers it): what a test's call started and left running is ended when the
    call ends, however it ended. A test that starts a command in a session of its own (start_new_session, so that a
    signal reaches its whole group) and fails before it ends it would otherwise leave it to the rest of the suite:
    in a make test of 7e5f770, test_slurm's search driver, left by an assertion, kept its 200-epoch Slurm job
    training for the other 19 minutes (600 CPU-seconds outside the tests' figures), and the next test timed out
    waiting for it. Each process the call started through subprocess (Popen, which run() uses) and left running gets
    SIGTERM (its whole group when it leads one: a search driver cancels its jobs on it), then it and everything under
    it SIGKILL after grace_s. Only those: what a library starts for this process itself stays (Open MPI's singleton
    daemon, `orted --hnp`, which Horovod's MPI path started in a worker: ending it aborted the worker), and so do the
    daemons of session fixtures, started in setup."""

    def __init__(self, grace_s=15):
        self.grace_s = grace_s
        self.started = None  # the Popen objects of the running call
        popen_init = subprocess.Popen.__init__

        @functools.wraps(popen_init)
        def counted(popen, *args, **kwargs):
            popen_init(popen, *args, **kwargs)
            if self.started is not None:
                self.started.append(popen)
        subprocess.Popen.__init__ = counted

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.started = []
        try:
            yield
        finally:
            left = [popen.pid for popen in self.started if popen.poll() is None]
            self.started = None
            self.end(left)

    def end(self, pids):
        """SIGTERM to each of `pids` (a leader's whole group), SIGKILL to what is left of them and of their trees
        after grace_s."""
        tree = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                tree += [root, *root.children(recursive=True)]
            with contextlib.suppress(OSError):
                if os.getsid(pid) == pid:
                    os.killpg(pid, signal.SIGTERM)
                else:
                    os.kill(pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=self.grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
