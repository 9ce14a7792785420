"""The launchers' hostile table (issue 46). Every variable run_with_docker.sh (and run.sub, through the same library)
takes as a name or a number is read from rn50_mx/launch.sh's LAUNCH_INPUTS, so a variable added there joins the table;
each goes through the standard hostile values (tests/support/bad_values.py), bare and with CONT (a private engine and a
small image made with `docker import`). Then each signal (TERM, INT, KILL) to the launcher at each stage: before the
first trial, mid-trial, during the summary.

A value is either refused, in one line naming the variable with its value shown escaped (printf %q) and no trial, or
taken as the name it is. A name taken ends the launch at the lock of its logs, which this test holds ("another launch
is writing the logs"): that comes after every name has been checked and used (a folder created, CONT resolved to its
image), and before any Python or container runs, so the table costs no training. Where the lock cannot be held first
(a LOGDIR the launch creates, a DATESTAMP it draws), the launch ends at the settings check, on data that is not there.
"""
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from tests.support import bad_values, engine
from tests.support.bad_values import shown
from tests.support.procs import ENV_PATH, PYTHONPATH, ROOT, assert_all_end, running
from tests.support.settings import TINY_KEEP_CACHES


def launch_inputs():
    """(name, kind) of each variable in rn50_mx/launch.sh's LAUNCH_INPUTS."""
    script = 'LAUNCHER=x; source rn50_mx/launch.sh; printf "%s\\n" "${LAUNCH_INPUTS[@]}"'
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [tuple(line.split(":")) for line in out.split()]


INPUTS = launch_inputs()
KINDS = dict(INPUTS)
TINY_IMAGE = "rn50-mx-test:no-python"  # an image without python (docker import of one file)

# What a launcher does with each text value, by the variable's kind: the refusal's words, or None (taken as a name).
# An empty value is the variable unset: its default (DATADIR and DGXSYSTEM have none).
NUMBER = "expected a whole number"
REFUSED = {
    "folder": {"newline": "a control character"},
    "stamp": {"newline": "a control character", "glob characters": "expected letters, digits",
              "colon": "expected letters, digits"},
    "image": {"newline": "a control character", "leading dash": "not an image name",
              "glob characters": "not an image name", "colon": "the Docker engine does not answer"},
    "count": {"newline": "a control character", "leading dash": NUMBER, "glob characters": NUMBER, "colon": NUMBER},
    "seconds": {"newline": "a control character", "leading dash": "expected whole seconds",
                "glob characters": "expected whole seconds", "colon": "expected whole seconds"},
    "seed": {"newline": "a control character", "leading dash": NUMBER, "glob characters": NUMBER, "colon": NUMBER},
}
UNSET = {"DATADIR": "DATADIR is not set", "DGXSYSTEM": "DGXSYSTEM is not set"}
# Names a launcher never takes from a variable's value alone.
SPECIAL = {("DGXSYSTEM", "leading dash"): "no "}  # a config/<DGXSYSTEM>.sh that is not there
# With CONT: docker run -v splits at ':'; an image name of the right form that the engine does not have.
WITH_CONT = {("DATADIR", "colon"): "a ':' in the path", ("LOGDIR", "colon"): "a ':' in the path",
             ("CONT", "colon"): "the engine has no such image"}

# What is planted at the path a folder names, or at a stamp's first log (LOGDIR/DATESTAMP_1.log): the refusal's
# words, None for a name taken; a variable of another kind names no path (nothing to plant).
PLANTED = {
    "DATADIR": {"missing": "no such folder", "directory": None, "fifo": "not a folder",
                "link elsewhere": "not a folder", "unreadable": "not a folder", "empty": "not a folder"},
    "LOGDIR": {"missing": None, "directory": None, "fifo": "there, but not a folder",
               "link elsewhere": "there, but not a folder", "unreadable": "there, but not a folder",
               "empty": "there, but not a folder"},
    # what is in the checkpoint folder is the training's to check (rn50_mx.checkpoint), before run_start
    "RN50_CHECKPOINT_DIR": dict.fromkeys(bad_values.PLANTS),
    "DATESTAMP": {"missing": None, **{plant: "holds logs of DATESTAMP=s already" for plant in bad_values.PLANTS
                                      if plant != "missing"}},
}


def cases():
    for name, kind in INPUTS:
        for value in bad_values.NAMES:
            yield name, "text", value
        for plant in PLANTED.get(name, {}):
            yield name, "plant", plant


CASES = list(cases())


def case_id(case):
    return "-".join(case).replace(" ", "_")


class Launch:
    """One run_with_docker.sh in folder `cwd` after config/CPU.sh, with the table's settings and `changes`: the data
    folder (its files not needed: the lock stops the launch first), the logs in cwd/logs, DATESTAMP s, one trial."""

    def __init__(self, cwd, changes, private=None):
        (cwd / "data").mkdir(exist_ok=True)
        self.cwd = cwd
        self.env = {**TINY_KEEP_CACHES, "DATADIR": str(cwd / "data"), "LOGDIR": str(cwd / "logs"), "DATESTAMP": "s",
                    "NEXP": "1", "DOCKER_HOST": f"unix://{cwd}/no-engine.sock", **changes}
        if private:
            self.env.update(private.env)

    def logdir(self):
        return self.cwd / (self.env["LOGDIR"] or "results")

    def run(self, hold=True):
        """The launch's CompletedProcess, with LOGDIR/DATESTAMP.lock held meanwhile when `hold`."""
        exports = "".join(f"export {name}={shown(value)}; " for name, value in self.env.items())
        command = ["bash", "-c", f"source {ROOT}/config/CPU.sh; {exports}exec {ROOT}/run_with_docker.sh"]
        with contextlib.ExitStack() as stack:
            if hold:
                self.logdir().mkdir(parents=True, exist_ok=True)
                lock = stack.enter_context(open(self.logdir() / f"{self.env['DATESTAMP']}.lock", "a"))
                fcntl.flock(lock, fcntl.LOCK_EX)
            return subprocess.run(command, cwd=self.cwd, capture_output=True, text=True, timeout=300,
                                  env={"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp"), **PYTHONPATH})


def expected(name, how, value, cont):
    """The refusal's words for this case, None for a name taken."""
    if how == "plant":
        return PLANTED[name][value]
    if (name, value) in WITH_CONT and (cont or name == "CONT"):
        return WITH_CONT[(name, value)] if cont else REFUSED["image"][value]
    if value == "empty":
        return UNSET.get(name)
    return SPECIAL.get((name, value), REFUSED[KINDS[name]].get(value))


def prepare(tmp_path, name, how, value):
    """The value of variable `name` for this case: a text, or the name of what was planted (in tmp_path, or at
    DATESTAMP's first log)."""
    if how == "text":
        text = bad_values.NAMES[value]
        if KINDS[name] == "folder" and text and "\n" not in text:
            os.makedirs(tmp_path / text, exist_ok=True)  # the folder the name names is there: it is taken as it is
        return text
    if name == "DATESTAMP":
        (tmp_path / "logs").mkdir()
        bad_values.PLANTS[value](str(tmp_path / "logs" / "s_1.log"))
        return "s"
    bad_values.PLANTS[value](str(tmp_path / "planted"))
    return "planted"


def check_case(tmp_path, name, how, value, cont=None, private=None):
    text = prepare(tmp_path, name, how, value)
    changes = {name: text, **({"CONT": cont} if cont and name != "CONT" else {})}
    launch = Launch(tmp_path, changes, private)
    says = expected(name, how, value, cont)
    default_stamp = name == "DATESTAMP" and text == ""
    created = name == "LOGDIR" and how == "plant" and value == "missing"
    result = launch.run(hold=says is None and not (default_stamp or created))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.stdout[-2000:], result.stderr[-2000:])
    assert "Beginning trial" not in result.stdout
    if says is not None:
        assert lines[0].startswith("run_with_docker.sh: ") and says in lines[0], lines[0]
        if name not in UNSET or text:  # named as given; a path docker cannot mount, as docker would be given it
            given = str(tmp_path / text) if cont and KINDS[name] == "folder" and value == "colon" else text
            assert f"{name}={shown(given)}" in lines[0], lines[0]
    elif default_stamp or created:  # the launch went on to its first command: the image's check, the settings check
        assert lines[0] == (f"rn50_mx.check: error: {tmp_path}/data/train.rec: cannot read (No such file or directory)"
                            if not cont else lines[0]) and (not cont or "cannot run python" in lines[0]), lines[0]
        assert launch.logdir().is_dir()
    else:
        assert lines[0] == (f"run_with_docker.sh: LOGDIR={shown(os.path.realpath(launch.logdir()))}: another launch is "
                            f"writing the logs of DATESTAMP={shown(launch.env['DATESTAMP'])} now"), lines[0]


@pytest.mark.parametrize("name, how, value", CASES, ids=map(case_id, CASES))
def test_each_name_bare(tmp_path, name, how, value):
    """Bare (no engine answers: a CONT value that is an image name meets "the engine does not answer")."""
    check_case(tmp_path, name, how, value)


@pytest.fixture(scope="module")
def tiny_image(docker_engine, tmp_path_factory):
    """TINY_IMAGE in the session's engine: one file, no python."""
    engine.import_small_image(docker_engine, TINY_IMAGE, str(tmp_path_factory.mktemp("tiny")))
    return docker_engine


@pytest.mark.parametrize("name, how, value", CASES, ids=map(case_id, CASES))
def test_each_name_with_cont(tiny_image, tmp_path, name, how, value):
    """With CONT naming an image the engine has: the image is resolved to its ID before the lock is taken."""
    check_case(tmp_path, name, how, value, cont=TINY_IMAGE, private=tiny_image)


@pytest.mark.parametrize("cont, says", [
    ("rn50-mx-test:absent", "CONT=rn50-mx-test:absent: the engine has no such image: build it"),
    (TINY_IMAGE, f"CONT={TINY_IMAGE} (image sha256:"),
])
def test_an_image_that_is_not_there_or_cannot_run_rn50_mx_is_one_line(tiny_image, tmp_path, cont, says):
    """CONT names no image of the engine's, or one that cannot run `python -m rn50_mx.check` (no python in it: the
    old launcher ran every trial to tini's "exec python failed", exit 127, with no line naming CONT)."""
    result = Launch(tmp_path, {"CONT": cont}, tiny_image).run(hold=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"run_with_docker.sh: {says}"), \
        result.stderr
    if cont == TINY_IMAGE:
        assert re.search(r"\): cannot run python -m rn50_mx\.check \(.*python.*\); build it from", lines[0]), lines[0]
    assert "trial" not in result.stdout and not (tmp_path / "logs" / "s_1.log").exists()


def test_a_datestamps_logs_are_matched_exactly(tmp_path):
    """DATESTAMP a took a_1_1.log (trial 1 of DATESTAMP a_1) for one of its own logs and refused to start."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a_1_1.log").write_text("trial 1 of DATESTAMP a_1\n")
    result = Launch(tmp_path, {"DATESTAMP": "a"}).run()
    assert result.stderr.strip() == (f"run_with_docker.sh: LOGDIR={tmp_path}/logs: another launch is writing the logs "
                                     "of DATESTAMP=a now")


# A launcher ending its own launch, as stopped_group does STOP_GRACE seconds after a stop: what it started ends, and
# the ending ends (the launcher and the subshell it runs in are the caller's own).
OWN_LAUNCH = """LAUNCHER=probe; source rn50_mx/launch.sh
sleep 30 & child=$!
found=$(launch_pids "$RN50MX_LAUNCH")
echo "found ${found//$child/the child}"
echo "ended $(end_launch "$RN50MX_LAUNCH" "" 0)"
if kill -0 "$child" 2>/dev/null; then echo "the child runs"; else echo "the child ended"; fi
"""


def test_a_launcher_ending_its_own_launch_ends_what_it_started_and_not_its_helpers():
    """The launcher's helpers (the subshells it runs launch_pids in; ps, grep and awk) carry the launch's id, as
    everything it starts does. The old launch_pids listed them: the caller's command substitution killed itself
    (nothing printed), and stopped_group's end_launch, which spares the launcher, found helpers at each of its 100
    rounds: 20 s more of every stop past its grace."""
    result = subprocess.run(["bash", "-c", OWN_LAUNCH], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PATH": ENV_PATH, "RN50MX_LAUNCH": f"rn50-mx-probe-{os.getpid()}"})
    assert result.stdout.splitlines() == ["found the child", "ended 1 0", "the child ended"], \
        result.stdout + result.stderr


# A holder of rn50_mx/launch.sh's lock at $1, as trials.sh holds LOGDIR/DATESTAMP.lock: it removes the file as it ends.
LOCKER = """LAUNCHER=locker; source rn50_mx/launch.sh
hold_lock "$1" || exit $?
trap 'rm -f -- "$1"' EXIT
echo held
read -r _ || true
"""
# flock, held at its start until the file $GO exists (saying so in $ENTERED), then the real one.
SLOW_FLOCK = """#!/bin/sh
[ -e "$GO" ] || { : > "$ENTERED"; while [ ! -e "$GO" ]; do sleep 0.05; done; }
exec FLOCK "$@"
"""


def test_a_lock_taken_on_the_file_its_holder_removed_is_taken_again_on_the_new_one(tmp_path):
    """Launch B opens the lock file while launch A holds it; A ends and removes the file; launch C creates it anew and
    locks it; only then does B's flock run (held there by a slow flock), on the removed file, and succeed. B must see
    that the file it locked is no longer the one at the name, take the lock there again and be refused, as C holds
    it. The old hold_lock returned B's lock: two launches wrote one DATESTAMP's logs and resumed one trial."""
    lock, shim, go, entered = tmp_path / "t.lock", tmp_path / "shim", tmp_path / "go", tmp_path / "entered"
    shim.mkdir()
    (shim / "flock").write_text(SLOW_FLOCK.replace("FLOCK", shutil.which("flock", path=ENV_PATH)))
    (shim / "flock").chmod(0o755)

    def locker(path=ENV_PATH):
        return subprocess.Popen(["bash", "-c", LOCKER, "locker", str(lock)], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True,
                                env={"PATH": path, "GO": str(go), "ENTERED": str(entered)})

    a = locker()
    assert a.stdout.readline() == "held\n"
    b = locker(f"{shim}:{ENV_PATH}")
    c = None
    try:
        while not entered.exists():
            assert b.poll() is None
            time.sleep(0.05)
        a.stdin.close()
        assert a.wait(timeout=30) == 0 and not lock.exists()
        c = locker()
        assert c.stdout.readline() == "held\n"
        go.touch()
        assert b.stdout.readline() == "", "B holds the lock that C holds"  # "held", on the old code
        assert b.wait(timeout=30) == 1
    finally:
        for proc in (a, b, c):
            if proc:
                proc.kill()
                proc.wait()


# --- signals at each stage -----------------------------------------------------------------------------------------

# A training that ends at once with run_stop success: a stand-in, planted through PYTHONPATH, so that the launch
# reaches its summary in seconds (the summary stage alone is under test).
FINISHES = """import sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    print(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "INTERVAL_END", "key": "run_stop", "value": null, '
          '"metadata": {"status": "success"}}', flush=True)
    import os
    os._exit(0)
"""
# The stage's process held there (opening a FIFO that no one writes) until the signal's effects end it: a check or a
# summary that finished within the watcher's settling time left nothing for a SIGKILLed launcher's watcher to end.
HELD = """import sys
if {marker!r} in " ".join(sys.orig_argv):
    open({fifo!r}).close()
"""


# The process whose presence says the launch is at the stage.
STAGES = {"before the first trial": "-m rn50_mx.check --data-train", "mid-trial": "-m rn50_mx.train",
          "during the summary": "-m rn50_mx.timing"}
SAYS = {"before the first trial": "stopped by SIG{sig} before the first trial; no further trial runs",
        "mid-trial": "stopped by SIG{sig} in trial 1 of 1 (no run_stop); no further trial runs",
        "during the summary": "stopped by SIG{sig} during the timing summary"}


def launch_processes(launch_id):
    """The processes whose environment holds the launch's id (rn50_mx/launch.sh's tie: every process it started)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if launch_id in proc.environ().get("RN50MX_LAUNCH", "").split() and running(proc):
                found.append(proc)
    return found


def kill_by_name(launch_id, name):
    """SIGKILL to each process of launch `launch_id` whose command line names `name`, as `pkill -9 -f NAME` sends it
    (kept to this launch: the suite's other launches run beside it)."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            command = " ".join(proc.cmdline())
            if name in command and (launch_id in command or launch_id in proc.environ().get("RN50MX_LAUNCH", "")):
                proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("stage, sig", [(stage, sig) for stage in STAGES for sig in ("TERM", "INT", "KILL")] +
                         [("mid-trial", "KILL by name")])
def test_a_signal_at_each_stage_leaves_nothing_running(shared, tmp_path, stage, sig):
    """The signal to the launcher alone (kill, the OOM killer, a CI runner ending its job's first process). TERM and
    INT: the launcher stops what runs and says where, exit 128 + the signal. KILL: its watcher ends every process it
    started, and says so. The old launcher, SIGKILLed, left the trial (run_and_time.sh, its log filter, the training)
    to run on under init to the end. KILL by name (`pkill -9 -f run_with_docker.sh`): the same; the watcher's command
    line named the launcher, so it died with it and the trial ran on. Mid-trial is a real training (signalled once
    its process runs); the summary follows a stand-in trial that ends at once (FINISHES); the data check and the
    summary are held until the signal's effects end them (HELD), so that each is still running then on any
    machine. The `sleep` on PATH is a wrapper that runs the real one as its child: the old stop's grace timer was a
    background `sleep`, ended with `pkill -P TIMER sleep` and then the timer; a `sleep` that was not yet `sleep` then
    (forked, not yet exec'd: one CI run in many, under load), as a wrapper's child always is, ran on after the
    launcher's last line, and its watcher ended it with a line of its own."""
    env = {**TINY_KEEP_CACHES, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DATADIR": shared["data"],
           "LOGDIR": str(tmp_path / "logs"), "NEXP": "1", "DATESTAMP": "t"}
    site = tmp_path / "site"
    site.mkdir()
    wrapped = tmp_path / "bin"
    wrapped.mkdir()
    (wrapped / "sleep").write_text(f'#!/bin/sh\n{shutil.which("sleep")} "$@"\n')
    (wrapped / "sleep").chmod(0o755)
    bad_values.fifo(tmp_path / "never")
    (site / "sitecustomize.py").write_text((FINISHES if stage == "during the summary" else "") + (
        HELD.format(marker=STAGES[stage], fifo=str(tmp_path / "never")) if stage != "mid-trial" else ""))
    exports = "".join(f"export {name}={shown(value)}; " for name, value in env.items())
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen(["bash", "-c", f"source config/CPU.sh; {exports}exec ./run_with_docker.sh"], cwd=ROOT,
                                env={"PATH": f"{wrapped}:{ENV_PATH}", "HOME": "/tmp",
                                     "PYTHONPATH": f"{site}:{ROOT}"},
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, launch_id = time.time() + 600, None
        while True:
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            with contextlib.suppress(psutil.Error):
                launch_id = launch_id or psutil.Process(proc.pid).environ().get("RN50MX_LAUNCH")
                tree = psutil.Process(proc.pid).children(recursive=True)
                if any(STAGES[stage] in " ".join(p.cmdline()) for p in tree):
                    break
            time.sleep(0.05)
        assert (stage == "before the first trial") == (not (tmp_path / "logs" / "t_1.log").exists())
        if sig == "KILL by name":
            kill_by_name(launch_id, "run_with_docker.sh")
        else:
            proc.send_signal(getattr(signal, f"SIG{sig}"))
        status = proc.wait(timeout=120)
        tic = time.time()
        while launch_processes(launch_id) and time.time() - tic < 60:
            time.sleep(0.2)
        assert not launch_processes(launch_id), [p.cmdline() for p in launch_processes(launch_id)]
        assert_all_end(tree, timeout=30)
        text = out.read_text()
        if sig.startswith("KILL"):
            assert status == -9 and re.search(r"process \d+ ended, \d+ process\(es\) and 0 container\(s\) of its "
                                              r"launch still running: ended them", text), text[-3000:]
        else:
            assert status == {"TERM": 143, "INT": 130}[sig], text[-3000:]
            assert text.strip().splitlines()[-1] == "run_with_docker.sh: " + SAYS[stage].format(sig=sig), text[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
