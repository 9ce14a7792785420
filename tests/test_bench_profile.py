"""bench/test_profile.py, the suite's cost report (issue 50): it reads a profile someone may have copied or edited and
writes tests/unit_costs.json, the order make test hands its units out in. Each hostile input is one line naming the
file, never a traceback, a hang or a write through a planted link."""
import json
import os
import shutil
import sys

import pytest

from rn50_mx import files
from tests.support import bad_values
from tests.support.procs import ROOT, run
from tests.support.schedule import known_costs

TESTS = [{"test": "tests/test_a.py::test_one", "file": "tests/test_a.py", "wall": 10.0, "cpu": 8.0, "kinds": ["trains"],
          "processes": 2},
         {"test": "tests/test_a.py::test_two", "file": "tests/test_a.py", "wall": 5.0, "cpu": 1.0, "kinds": []},
         {"test": "tests/test_b.py::test_x", "file": "tests/test_b.py", "unit": "b-split", "wall": 30.0, "cpu": 29.0,
          "kinds": ["horovod", "trains"]}]


@pytest.fixture
def tool(tmp_path):
    """A copy of the tool in a tree of its own, so that --save-costs writes that tree's tests/unit_costs.json."""
    os.makedirs(tmp_path / "tree" / "bench")
    os.makedirs(tmp_path / "tree" / "tests")
    shutil.copy(os.path.join(ROOT, "bench", "test_profile.py"), tmp_path / "tree" / "bench")
    return tmp_path / "tree"


def profile_tool(tree, *args):
    return run([sys.executable, str(tree / "bench" / "test_profile.py"), *map(str, args)], timeout=60)


def write_profile(path, tests=TESTS, **fields):
    path.write_text(json.dumps({"tests": tests, "session_wall": 40.0, **fields}))
    return path


def assert_one_line(result, path):
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"test_profile: {path}"), lines


def test_a_profile_is_reported_by_file_and_its_unit_costs_written_for_the_scheduler(tool, tmp_path):
    profile = write_profile(tmp_path / "profile.json")
    result = profile_tool(tool, profile, "--top", "2")
    assert result.returncode == 0, result.stderr
    assert "3 tests, 45 s of test time, 38 s CPU; the session 40 s" in result.stdout
    assert [line.split()[:5] for line in result.stdout.splitlines() if line.startswith("tests/test_")][:2] == [
        ["tests/test_b.py", "1", "0", "30", "29"], ["tests/test_a.py", "2", "2", "15", "9"]]
    assert "the 2 costliest tests by cpu" in result.stdout and "test_two" not in result.stdout
    result = profile_tool(tool, profile, "--save-costs")
    assert result.returncode == 0, result.stderr
    costs = tool / "tests" / "unit_costs.json"
    assert known_costs(str(costs)) == {"b-split": 30.0, "tests/test_a.py": 15.0}
    assert sorted(os.listdir(tool / "tests")) == ["unit_costs.json"]  # no temporary file, no lock left


def test_the_machine_s_cpu_is_reported_and_the_session_fixtures_row_is_no_unit_to_schedule(tool, tmp_path):
    session = {"test": "session fixtures: the teardown after gw1's last test", "file": "session fixtures",
               "unit": "session fixtures", "wall": 2.0, "cpu": 3.0, "kinds": [], "processes": 0}
    profile = write_profile(tmp_path / "profile.json", TESTS + [session], machine_cpu=100.0)
    result = profile_tool(tool, profile)
    assert result.returncode == 0, result.stderr
    assert "3 tests, 47 s of test time, 41 s CPU; the session 40 s" in result.stdout
    assert "the machine: 100 CPU-s busy over the session; 59 outside the tests' figures" in result.stdout
    assert [line.split()[:6] for line in result.stdout.splitlines() if line.startswith("session fixtures")][0] == [
        "session", "fixtures", "1", "0", "2", "3"]
    against = profile_tool(tool, write_profile(tmp_path / "new.json"), "--against", profile)
    assert against.returncode == 0 and "(before: 3 tests, 41 s CPU, the session 40 s)" in against.stdout
    assert profile_tool(tool, profile, "--save-costs").returncode == 0
    assert known_costs(str(tool / "tests" / "unit_costs.json")) == {"b-split": 30.0, "tests/test_a.py": 15.0}


@pytest.mark.parametrize("value", ["100", -1, True, [1]], ids=["a text", "negative", "a bool", "a list"])
def test_a_machine_figure_edited_wrong_is_one_line(tool, tmp_path, value):
    bad = write_profile(tmp_path / "bad.json", machine_cpu=value)
    assert_one_line(profile_tool(tool, bad), bad)


def plugin_run(tmp_path, source):
    """(profile, pytest's stdout) of the costs plugin in a pytest run of its own, of the test file `source`."""
    (tmp_path / "conftest.py").write_text(
        "from tests.support.costs import Profile\n\n\ndef pytest_configure(config):\n"
        "    config.pluginmanager.register(Profile(config), 'rn50-cost-profile')\n")
    (tmp_path / "test_plugged.py").write_text(source)
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-c", os.devnull, "--rootdir",
                  str(tmp_path), "-o", f"cache_dir={tmp_path / 'cache'}", str(tmp_path / "test_plugged.py")],
                 timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(tmp_path / "cache" / "d" / "rn50-profile" / "profile.json") as f:
        return json.load(f), result.stdout


def test_a_worker_s_teardown_of_the_session_s_fixtures_is_a_row_of_its_own(tmp_path):
    """A session fixture whose teardown spends a second of a child's CPU (as the Docker engine's stop does) is charged
    to the "session fixtures" row, not to the last test, which paid it before; the profile carries the machine's busy
    CPU over the session."""
    profile, stdout = plugin_run(tmp_path, (
        "import subprocess\nimport sys\n\nimport pytest\n\n\n@pytest.fixture(scope='session')\ndef engine():\n"
        "    yield\n    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 1: pass'])\n\n\ndef test_first(engine):\n    pass\n\n\n"
        "def test_last(engine):\n    pass\n"))
    rows = {t["test"].split("::")[-1]: t for t in profile["tests"]}
    assert rows["session fixtures: the teardown after main's last test"]["cpu"] >= 0.9, rows
    assert rows["test_last"]["cpu"] < 0.5 and rows["test_first"]["cpu"] < 0.5, rows
    assert profile["machine_cpu"] >= 0.9 and "the machine: " in stdout


def test_the_sampler_counts_a_test_s_grandchildren_and_the_kinds_their_command_lines_show(tmp_path):
    """A test's child (bash) starts a grandchild whose command line says it trains, which the test's own Popen does
    not show (one bash word holds it): both are counted, and the kind is the grandchild's. The sampler walks the
    test's tree through the /proc children files (tests/support/costs.py, tree_of)."""
    profile, _ = plugin_run(tmp_path, (
        "import subprocess\nimport sys\n\n\ndef test_tree():\n"
        "    subprocess.run(['bash', '-c', f\"{sys.executable} -c 'import time; time.sleep(1.5)' rn50_mx.train; true\"],"
        " check=True)\n"))
    [row] = [t for t in profile["tests"] if t["test"].endswith("::test_tree")]
    assert row["processes"] == 2 and row["kinds"] == ["trains"], row


def test_a_child_seen_before_its_exec_is_read_again_after_it(tmp_path):
    """A child that the sampler first sees as bash, before its exec of a command that trains (same pid, same start
    time), is one process whose kind is the command's. fc42 (449a862) failed the test above so, under load: the
    sampler read the grandchild between bash's fork and its exec, and never again."""
    profile, _ = plugin_run(tmp_path, (
        "import subprocess\nimport sys\n\n\ndef test_exec():\n"
        "    subprocess.run(['bash', '-c', f\"sleep 0.6; exec {sys.executable} -c 'import time; time.sleep(0.6)' "
        "rn50_mx.train\"], check=True)\n"))
    [row] = [t for t in profile["tests"] if t["test"].endswith("::test_exec")]
    assert row["processes"] == 2 and row["kinds"] == ["trains"], row  # bash (python after its exec) and sleep


@pytest.mark.parametrize("plant", bad_values.PLANTS.values(), ids=bad_values.PLANTS)
def test_anything_but_a_profile_at_the_path_is_one_line(tool, tmp_path, plant):
    path = tmp_path / "profile.json"
    plant(str(path))  # unreadable: root reads through chmod, and "x" is no profile either
    result = profile_tool(tool, path)
    assert_one_line(result, path)
    if plant is bad_values.link_elsewhere:
        assert bad_values.victim_intact(str(path))


@pytest.mark.parametrize("tests", [
    {"a": 1}, [dict(TESTS[0], wall="10")], [dict(TESTS[0], wall=float("nan"))], [dict(TESTS[0], cpu=-1)],
    [dict(TESTS[0], kinds="trains")], [dict(TESTS[0], kinds=[1])], [dict(TESTS[0], unit=3)], [{"test": "t"}],
    [dict(TESTS[0], processes=True)], ["a test"]],
    ids=["not a list", "wall a text", "wall NaN", "cpu negative", "kinds a text", "a kind a number", "unit a number",
         "fields missing", "processes a bool", "a test a text"])
def test_a_profile_edited_wrong_is_one_line_here_and_as_the_older_one(tool, tmp_path, tests):
    bad = write_profile(tmp_path / "bad.json", tests)
    good = write_profile(tmp_path / "good.json")
    assert_one_line(profile_tool(tool, bad), bad)
    assert_one_line(profile_tool(tool, good, "--against", bad), bad)


def test_a_truncated_profile_is_one_line(tool, tmp_path):
    path = write_profile(tmp_path / "profile.json")
    bad_values.truncated(str(path))
    assert_one_line(profile_tool(tool, path, "--save-costs"), path)
    assert os.listdir(tool / "tests") == []


@pytest.mark.parametrize("value", ["0", "-1", "x", "", "1.5"])
def test_a_bad_top_is_refused_naming_it(tool, tmp_path, value):
    result = profile_tool(tool, write_profile(tmp_path / "profile.json"), "--top", value)
    assert result.returncode == 2 and "argument --top: expected a whole number of tests" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("plant", [bad_values.directory, bad_values.link_elsewhere, bad_values.fifo],
                         ids=["directory", "link", "fifo"])
def test_the_unit_costs_are_never_written_through_what_is_planted_there(tool, tmp_path, plant):
    costs = tool / "tests" / "unit_costs.json"
    plant(str(costs))
    result = profile_tool(tool, write_profile(tmp_path / "profile.json"), "--save-costs")
    assert_one_line(result, costs)
    assert "not a regular file" in result.stderr
    if plant is bad_values.link_elsewhere:
        assert bad_values.victim_intact(str(costs)) and os.path.islink(costs)


def test_a_second_writer_of_the_unit_costs_and_a_full_disk_are_one_line_and_keep_the_old_file(tool, tmp_path):
    costs = tool / "tests" / "unit_costs.json"
    costs.write_text('{"old": 1.0}\n')
    profile = write_profile(tmp_path / "profile.json")
    fd = files.lock_file(str(costs) + ".lock", str(costs))  # another writer holds it
    try:
        result = profile_tool(tool, profile, "--save-costs")
    finally:
        os.close(fd)
    assert_one_line(result, costs)
    assert costs.read_text() == '{"old": 1.0}\n'
    if os.geteuid() != 0:
        pytest.skip("a full disk is a tmpfs mount: root only")
    os.remove(str(costs) + ".lock")
    full = tmp_path / "full"
    with bad_values.full_disk(full):
        planted = tool / "tests"
        shutil.rmtree(planted)
        os.symlink(full, planted)
        result = profile_tool(tool, profile, "--save-costs")
        assert_one_line(result, planted / "unit_costs.json")
        assert [name for name in os.listdir(full) if not name.startswith(".filler")] == []
