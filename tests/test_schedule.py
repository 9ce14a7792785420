"""tests/support/schedule.py, how `make test` shares the suite between its workers (issue 50), run on a suite of its
own: four units handed out costliest first by the real scheduler in a real pytest-xdist session of two workers."""
import os
import sys

from tests.support.procs import run

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


def test_a_worker_running_a_one_test_unit_is_handed_the_cheapest_unit_as_its_next(tmp_path):
    """xdist's worker starts a test only once it holds the next one, so a worker handed a one-test unit (the demo) gets
    a second unit at once: the cheapest left (test_d_small), not the next costliest (test_c_mid), which the other
    worker takes when its unit runs short. The old scheduler gave test_c_mid to the lone test's worker, behind it
    (test_demo then test_rehearse: the session's longest path). Unknown to tests/unit_costs.json, the units go out in
    their collection order, the costliest first as far as this suite is concerned."""
    suite, ran = tmp_path / "suite", tmp_path / "ran"
    suite.mkdir()
    ran.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name, body in UNITS.items():
        (suite / name).write_text(RECORD + "\n\n" + body)
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-c", os.devnull,
                  "--rootdir", str(suite), "-n", "2", "--dist", "loadgroup", str(suite)], env={"RAN": str(ran)},
                 timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    worker = {name: (ran / name).read_text() for name in os.listdir(ran)}
    assert len(worker) == 8 and len(set(worker.values())) == 2, worker
    assert worker["small"] == worker["lone"] != worker["mid"] == worker["mid2"] == worker["big0"], worker
