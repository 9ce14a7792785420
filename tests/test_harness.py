"""`make test`'s own machinery, each run on a suite of its own: how it shares the suite between its workers
(tests/support/schedule.py: four units handed out by the real scheduler in a real pytest-xdist session of two workers),
what it ends after a test's call (tests/support/procs.py, Reaper), and what it says of a child a signal does not end."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.procs import FAULT_STACKS, ended_after, run, running

CONFTEST = ("from tests.support import schedule\n\n\ndef pytest_configure(config):\n"
            "    config.pluginmanager.register(schedule.Distribution(config), 'rn50-distribution')\n")
# Each test writes which worker ran it; the lone test waits (up to a minute) until test_c_mid has run.
RECORD = "import os\nimport time\n\n\ndef ran(name):\n" \
         "    with open(os.path.join(os.environ['RAN'], name), 'w') as f:\n" \
         "        f.write(os.environ['PYTEST_XDIST_WORKER'])\n"
UNITS = {
    "test_a_lone.py": "def test_lone():\n    deadline = time.time() + 60\n"
                      "    while not os.path.exists(os.path.join(os.environ['RAN'], 'mid')) and time.time() < deadline:\n"
                      "        time.sleep(0.1)\n    ran('lone')\n",
    "test_b_big.py": "".join(f"def test_big{i}():\n    ran('big{i}')\n\n\n" for i in range(4)),
    "test_c_mid.py": "def test_mid():\n    ran('mid')\n\n\ndef test_mid2():\n    ran('mid2')\n",
    "test_d_small.py": "def test_small():\n    ran('small')\n",
}


def run_suite(tmp_path, conftest, files, *options, timeout=120):
    """(pytest's result, the folder its tests write to, as $RAN) of a suite of its own: `conftest` and {name: source}
    in tmp_path/suite, run by this python's pytest with `options`."""
    suite, ran = tmp_path / "suite", tmp_path / "ran"
    suite.mkdir()
    ran.mkdir()
    (suite / "conftest.py").write_text(conftest)
    for name, source in files.items():
        (suite / name).write_text(source)
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-c", os.devnull,
                  "--rootdir", str(suite), *options, str(suite)], env={"RAN": str(ran)}, timeout=timeout)
    return result, ran


def test_a_worker_running_a_one_test_unit_is_handed_the_cheapest_unit_as_its_next(tmp_path):
    """xdist's worker starts a test only once it holds the next one, so a worker handed a one-test unit (the demo) gets
    a second unit at once: the cheapest left (test_d_small), not the next costliest (test_c_mid), which the other
    worker takes when its unit runs short. The old scheduler gave test_c_mid to the lone test's worker, behind it
    (test_demo then test_rehearse: the session's longest path). Unknown to tests/unit_costs.json, the units go out in
    their collection order, the costliest first as far as this suite is concerned."""
    result, ran = run_suite(tmp_path, CONFTEST, {name: RECORD + "\n\n" + body for name, body in UNITS.items()},
                            "-n", "2", "--dist", "loadgroup", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    worker = {name: (ran / name).read_text() for name in os.listdir(ran)}
    assert len(worker) == 8 and len(set(worker.values())) == 2, worker
    assert worker["small"] == worker["lone"] != worker["mid"] == worker["mid2"] == worker["big0"], worker


LEFT = """import os
import signal
import subprocess
import sys

import pytest


def record(name, pid):
    with open(os.path.join(os.environ['RAN'], name), 'w') as f:
        f.write(str(pid))


@pytest.fixture(scope='session')
def daemon():
    proc = subprocess.Popen(['sleep', '600'], start_new_session=True)
    record('daemon', proc.pid)
    yield proc
    proc.kill()
    proc.wait()


def test_fails_with_a_group_left(daemon):
    group = subprocess.Popen(['bash', '-c', 'sleep 600 & echo $! > "$RAN/grandchild.tmp" && mv "$RAN/grandchild.tmp" '
                              '"$RAN/grandchild"; wait'], start_new_session=True)
    record('group', group.pid)
    while not os.path.exists(os.path.join(os.environ['RAN'], 'grandchild')):  # the reaper ends bash at the failure
        assert group.poll() is None
    assert False, 'failed midway'


def test_passes_with_a_child_that_ignores_sigterm_left(daemon):
    record('daemon_alive', int(daemon.poll() is None))
    child = subprocess.Popen([sys.executable, '-c', 'import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
                              'open(sys.argv[1], "w").close(); time.sleep(600)', os.path.join(os.environ['RAN'], 'ready')])
    record('stubborn', child.pid)
    record('helper', os.spawnv(os.P_NOWAIT, '/bin/sleep', ['sleep', '600']))  # not through subprocess: a library's own
    while not os.path.exists(os.path.join(os.environ['RAN'], 'ready')):
        assert child.poll() is None
"""


def test_what_a_test_s_call_left_running_ends_with_it_and_a_session_fixture_s_daemon_outlives_it(tmp_path):
    """A test that fails midway leaves a process group (bash and its sleep, in a session of their own: what test_slurm's
    search driver was); one that passes leaves a child that ignores SIGTERM. Both are ended when their call ends,
    the stubborn one by SIGKILL after the grace. The session fixture's process, started in setup, runs on into the
    second test and to its own teardown, and a process the call started other than through subprocess (as Open MPI
    starts its singleton daemon for the process itself) is left running."""
    result, ran = run_suite(tmp_path, "from tests.support.procs import Reaper\n\n\ndef pytest_configure(config):\n"
                            "    config.pluginmanager.register(Reaper(grace_s=2), 'rn50-reaper')\n", {"test_left.py": LEFT})
    assert "1 failed, 1 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    pids = {name: int((ran / name).read_text()) for name in ("daemon", "group", "grandchild", "stubborn")}
    assert (ran / "daemon_alive").read_text() == "1"
    deadline = time.time() + 10
    while any(alive(pid) for pid in pids.values()) and time.time() < deadline:
        time.sleep(0.2)
    assert not [name for name, pid in pids.items() if alive(pid)], pids
    helper = psutil.Process(int((ran / "helper").read_text()))
    try:
        assert running(helper)
    finally:
        helper.kill()


def alive(pid):
    try:
        return running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def test_a_child_a_signal_does_not_end_fails_the_test_with_its_threads_and_stacks():
    """ended_after's report: a child that ignores SIGTERM is still there after the timeout; the failure names each
    of its threads (the main one asleep in the kernel, SIGTERM not caught) and the Python line it waits on."""
    waits = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" \
            "time.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", waits], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **FAULT_STACKS})
    assert proc.stdout.readline() == "ready\n"
    with pytest.raises(pytest.fail.Exception) as failed:
        ended_after(proc, signal.SIGTERM, timeout=1)
    report = str(failed.value)
    first = f"still running 1 s after signal {signal.SIGTERM}:\n{proc.pid} python S (sleeping) blocked "
    assert first in report, report
    assert 'File "<string>", line 4 in <module>' in report and proc.poll() is not None, report
