"""The hostile pass (issue 19) as a table of probes: a command, the fault it meets, the first stderr line and the exit
status expected, and what must be on disk afterwards. Real files, real processes, real signals: a small tmpfs for a
full disk, a read-only tmpfs for an unwritable folder (root writes through chmod), FIFOs for reads that block, two
processes at once. Most probes fail before MXNet loads, so the table runs in seconds; the few that need training
are marked slow."""
import contextlib
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import pytest

from tests.support.data import packed_train_val
from tests.support.procs import ENV_PATH, PYTHONPATH, ROOT, assert_one_line_naming
from rn50_mx import prep_rec

FIXTURE_LOGS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "inspur_nf5688m6", "result_*.txt")))
CLASSES = ("ankle_boot", "bag", "coat", "dress", "pullover")
TINY = {"NUM_CLASSES": "5", "BATCHSIZE": "4", "NUMEPOCHS": "1", "WARMUP_EPOCHS": "0", "DALI_THREADS": "1",
        "ACCURACY_THRESHOLD": "0.0", "CLEAR_CACHES": "0"}


@dataclass
class Probe:
    """One hostile input: arrange(tmp) -> (command, extra environment); the first stderr line must match `first`
    (a regex), the status must be `status`, and after(tmp) must hold (what is, and is not, on disk)."""
    name: str
    arrange: Callable
    first: str
    status: int = 2
    after: Callable = field(default=lambda tmp: True)


def run(command, env=None, timeout=120, **kwargs):
    full_env = {"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp"), **PYTHONPATH, **(env or {})}
    return subprocess.run(command, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs)


def py(*args):
    return [sys.executable, "-m", *map(str, args)]


def launcher(command, env):
    """A launcher after `source config/CPU.sh`, with `env` exported after it."""
    exports = "".join(f"export {name}={value!r}; " for name, value in env.items())
    return ["bash", "-c", f"set -euo pipefail; source config/CPU.sh; {exports}exec {command}"], {}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A JPEG tree and its packed train/val set (5 classes x 7), shared by every probe that only reads them."""
    jpegs, data = packed_train_val(str(tmp_path_factory.mktemp("hostile")), classes=CLASSES)
    return dict(jpegs=jpegs, data=data)


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


def copy_tree(shared, tmp):
    return shutil.copytree(shared["jpegs"], tmp / "jpegs")


def log_with(tmp, lines):
    """A copy of the first reference log with `lines` edited: {old substring: new}."""
    text = open(FIXTURE_LOGS[0]).read()
    for old, new in lines.items():
        text = text.replace(old, new)
    path = tmp / "edited.log"
    path.write_text(text)
    return path


def with_odd_name(shared, tmp, name):
    jpegs = copy_tree(shared, tmp)
    shutil.copy(os.path.join(jpegs, CLASSES[0], "img000.jpg"), os.path.join(os.fsencode(jpegs), b"bag", name))
    return jpegs


def garbage_idx(shared, tmp):
    data = shutil.copytree(shared["data"], tmp / "data")
    with open(data / "val.idx", "a") as f:
        f.write("not\tan offset\n")
    return data


# --- the table: probes that end with one line, before any work, without MXNet or training -------------------------

PROBES = [
    # 2. existing results replaced or appended without a word
    Probe("pack over a complete set", lambda tmp, sh: (py("rn50_mx.prep_rec", "pack", sh["jpegs"], sh["data"] + "/val"),
                                                       {}),
          r"^prep_rec: error: .*/val\.rec: exists; the packed set there is kept \(give --force"),
    Probe("imagenet over a complete set", lambda tmp, sh: (py("rn50_mx.prep_rec", "imagenet", sh["jpegs"], sh["data"]),
                                                           {}),
          r"^prep_rec: error: .*/val\.rec: exists"),
    # 3. outputs checked before the work
    Probe("pack a file name with a tab",
          lambda tmp, sh: (py("rn50_mx.prep_rec", "pack", with_odd_name(sh, tmp, b"a\tb.jpg"), tmp / "out" / "x"), {}),
          r"^prep_rec: error: 'bag/a\\tb\.jpg': file name holds a tab or line break",
          after=lambda tmp: files_in(tmp / "out") == []),
    Probe("pack a file name with a newline",
          lambda tmp, sh: (py("rn50_mx.prep_rec", "pack", with_odd_name(sh, tmp, b"a\nb.jpg"), tmp / "out" / "x"), {}),
          r"^prep_rec: error: 'bag/a\\nb\.jpg': file name holds a tab or line break",
          after=lambda tmp: files_in(tmp / "out") == []),
    Probe("pack a file name that is not UTF-8",
          lambda tmp, sh: (py("rn50_mx.prep_rec", "pack", with_odd_name(sh, tmp, b"caf\xe9.jpg"), tmp / "out" / "x"),
                           {}),
          r"^prep_rec: error: b'bag/caf\\xe9\.jpg': file name is not UTF-8",
          after=lambda tmp: files_in(tmp / "out") == []),
    # 5. numeric bounds
    Probe("LR=nan", lambda tmp, sh: (py("rn50_mx.check"), {"LR": "nan"}),
          r"^rn50_mx\.check: error: LR=nan: must be a finite number"),
    Probe("--lr inf", lambda tmp, sh: (py("rn50_mx.check", "--lr", "inf"), {}),
          r"^rn50_mx\.check: error: --lr=inf: must be a finite number"),
    Probe("WD=-inf", lambda tmp, sh: (py("rn50_mx.check"), {"WD": "-inf"}),
          r"^rn50_mx\.check: error: WD=-inf: must be a finite number"),
    Probe("IMAGE_SHAPE=3,100000,224", lambda tmp, sh: (py("rn50_mx.check"),
                                                       {"IMAGE_SHAPE": "3,100000,224"}),
          r"^rn50_mx\.check: error: IMAGE_SHAPE='3,100000,224': H and W must be 32 to 2048"),
    Probe("IMAGE_SHAPE=3,8,8", lambda tmp, sh: (py("rn50_mx.check"), {"IMAGE_SHAPE": "3,8,8"}),
          r"^rn50_mx\.check: error: IMAGE_SHAPE='3,8,8': H and W must be 32 to 2048"),
    Probe("DALI_PREFETCH_QUEUE=100000", lambda tmp, sh: (py("rn50_mx.check"), {"DALI_PREFETCH_QUEUE": "100000"}),
          r"^rn50_mx\.check: error: DALI_PREFETCH_QUEUE=100000: must be <= 32$"),
    Probe("RN50_EXIT_TIMEOUT=3e9", lambda tmp, sh: (py("rn50_mx.check"), {"RN50_EXIT_TIMEOUT": "3000000000"}),
          r"^rn50_mx\.check: error: RN50_EXIT_TIMEOUT=3000000000: must be <= 86400$"),
    Probe("BATCHSIZE=10000000", lambda tmp, sh: (py("rn50_mx.check"), {"BATCHSIZE": "10000000"}),
          r"^rn50_mx\.check: error: BATCHSIZE=10000000: must be <= 16384"),
    Probe("selftest --ranks 10000", lambda tmp, sh: (py("rn50_mx.selftest", "--ranks", "10000"), {}),
          r"^rn50_mx\.selftest: error: --ranks=10000: must be 0 to \d+ \(the CPUs of this machine\)"),
    Probe("batch larger than the dataset",
          lambda tmp, sh: (py("rn50_mx.check", "--data-train", sh["data"] + "/train.rec", "--data-val",
                              sh["data"] + "/val.rec", "--batch-size", "64", "--num-classes", "5"), {}),
          r"^rn50_mx\.check: error: --batch-size=64: larger than the 35 train images of each of the 1 processes"),
    # 6. operating-system errors
    Probe("symlink loop among the images",
          lambda tmp, sh: (py("rn50_mx.prep_rec", "pack", loop_tree(sh, tmp), tmp / "out" / "x"), {}),
          r"^prep_rec: error: .*bag/loop\.jpg: cannot read \(Too many levels of symbolic links\)",
          after=lambda tmp: files_in(tmp / "out") == []),
    Probe(".idx with a garbage line met by training's check",
          lambda tmp, sh: (py("rn50_mx.check", "--datadir", garbage_idx(sh, tmp), "--num-classes", "5",
                              "--batch-size", "4"), {}),
          r"^rn50_mx\.check: error: .*/val\.idx: line 36: \.idx line is not 'key<TAB>offset'"),
    Probe("--mllog-file is a folder",
          lambda tmp, sh: (py("rn50_mx.train", "--synthetic", "1", "--num-examples", "8", "--batch-size", "4",
                              "--num-epochs", "1", "--warmup-epochs", "0", "--eval-offset", "0",
                              "--image-shape", "3,32,32", "--num-classes", "3", "--mllog-file", tmp), {}),
          r"^rn50_mx\.train: error: .*: cannot write \(Is a directory\)"),
    # 7. near misses
    Probe("BATCHSIZ=8", lambda tmp, sh: (py("rn50_mx.check"), {"BATCHSIZ": "8"}),
          r"^rn50_mx\.check: error: BATCHSIZ: not a variable rn50_mx reads; did you mean BATCHSIZE\?"),
    Probe("NUMEPOCH=2", lambda tmp, sh: (py("rn50_mx.check"), {"NUMEPOCH": "2"}),
          r"^rn50_mx\.check: error: NUMEPOCH: not a variable rn50_mx reads; did you mean NUMEPOCHS\?"),
    Probe("warmup_epochs=1 (lower case)", lambda tmp, sh: (py("rn50_mx.check"), {"warmup_epochs": "1"}),
          r"^rn50_mx\.check: error: warmup_epochs: not a variable rn50_mx reads; did you mean WARMUP_EPOCHS\?"),
    Probe("BATCHSIZ=8 through the launcher", lambda tmp, sh: launcher("./run_and_time.sh",
                                                                      {"BATCHSIZ": "8", "DATADIR": sh["data"]}),
          r"^rn50_mx\.check: error: BATCHSIZ: not a variable", status=2),
    Probe("timing: a log holding two runs",
          lambda tmp, sh: (py("rn50_mx.timing", two_runs(tmp)), {}), r"^python -m rn50_mx\.timing: error: .*: holds 2 runs"),
    Probe("timing: eval_accuracy not a number",
          lambda tmp, sh: (py("rn50_mx.timing", log_with(tmp, {'"value": 0.32822': '"value": "high"'})), {}),
          r"^python -m rn50_mx\.timing: error: .*edited\.log: eval_accuracy 'high' is not a number"),
]


def loop_tree(shared, tmp):
    jpegs = copy_tree(shared, tmp)
    os.symlink("loop.jpg", os.path.join(jpegs, "bag", "loop.jpg"))
    return jpegs


def two_runs(tmp):
    path = tmp / "two.log"
    path.write_text(open(FIXTURE_LOGS[0]).read() + open(FIXTURE_LOGS[1]).read())
    return path


@pytest.mark.parametrize("probe", PROBES, ids=[probe.name for probe in PROBES])
def test_probe(probe, shared, tmp_path):
    command, env = probe.arrange(tmp_path, shared)
    result = run(command, env)
    lines = result.stderr.strip().splitlines()
    assert lines and re.search(probe.first, lines[0]), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.returncode == probe.status, result.stderr[-2000:]
    assert probe.after(tmp_path), os.listdir(tmp_path)


# --- probes with mounts, two writers and signals ---------------------------------------------------------------

def test_full_disk_pack_is_one_line_and_leaves_no_temporaries(shared, tmp_path):
    with mounted(tmp_path / "full", "size=64k") as full:
        result = run(py("rn50_mx.prep_rec", "pack", shared["jpegs"], f"{full}/train"))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.startswith(f"prep_rec: error: {full}/train.rec: cannot write"), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert files_in(full) == []


def test_read_only_outputs_are_one_line_before_any_work(shared, tmp_path):
    with mounted(tmp_path / "ro", "ro,size=64k") as ro:
        pack = run(py("rn50_mx.prep_rec", "pack", shared["jpegs"], f"{ro}/train"))
        assert pack.stderr.strip() == f"prep_rec: error: {ro}/train.rec: cannot write (Read-only file system)"
        logs = run(*launcher("./run_with_docker.sh", {**TINY, "DATADIR": shared["data"], "LOGDIR": ro}))
        assert logs.returncode == 2, logs.stderr[-2000:]
        assert logs.stderr.strip().splitlines()[-1] == (f"run_with_docker.sh: LOGDIR={ro}: not writable (the logs "
                                                        "could not be kept)")
        assert "Beginning trial" not in logs.stdout
        train = run(py("rn50_mx.train", "--synthetic", "1", "--num-examples", "8", "--batch-size", "4",
                       "--num-epochs", "1", "--warmup-epochs", "0", "--eval-offset", "0", "--image-shape", "3,32,32",
                       "--num-classes", "3", "--mllog-file", f"{ro}/mlperf.log"))
        assert train.returncode == 2 and train.stderr.strip() == (
            f"rn50_mx.train: error: {ro}/mlperf.log: cannot write (Read-only file system)")
        tune = run(*launcher(f"python -m rn50_mx.tune --budget 1 --steps 1 --rounds 1 --out {ro} --data-train "
                             f"{shared['data']}/train.rec", {**TINY, "BATCHSIZE": "2"}))
        assert tune.returncode == 2 and tune.stderr.strip() == (
            f"rn50_mx.tune: error: {ro}/CPU_tuned.sh: cannot write (Read-only file system)")
        assert "stopped:" not in tune.stdout  # no search ran
        assert files_in(ro) == []


def start_blocked_pack(shared, tmp, out, *flags):
    """A `pack --force` (default workers) whose last image is a FIFO that never delivers: it holds `out` while it
    waits. Returns the process once its temporaries exist."""
    jpegs = copy_tree(shared, tmp)
    os.mkfifo(os.path.join(jpegs, "bag", "zzz.jpg"))
    proc = subprocess.Popen(py("rn50_mx.prep_rec", "pack", jpegs, out, "--no-shuffle", "--force", *flags),
                            env={"PATH": ENV_PATH, **PYTHONPATH}, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not glob.glob(f"{out}.rec.*.tmp"):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.05)
    return proc


def test_two_packs_into_one_prefix_one_is_refused_and_the_old_set_survives(shared, tmp_path):
    out = tmp_path / "set" / "train"
    prep_rec.pack(shared["jpegs"], str(out))
    before = {name: open(tmp_path / "set" / name, "rb").read() for name in files_in(tmp_path / "set")}
    first = start_blocked_pack(shared, tmp_path, out)
    try:
        second = run(py("rn50_mx.prep_rec", "pack", shared["jpegs"], out, "--force"))
        assert second.returncode == 2 and second.stderr.strip() == (
            f"prep_rec: error: {out}.rec: another process is writing this output now; wait for it to end or "
            "choose another output")
        first.send_signal(signal.SIGTERM)  # 4. a pack stopped while a worker's read blocks ends at once
        assert first.wait(timeout=20) == 130 and first.stderr.read().strip() == "prep_rec: interrupted"
    finally:
        first.kill()
    assert {name: open(tmp_path / "set" / name, "rb").read() for name in files_in(tmp_path / "set")} == before


def test_two_trainings_on_one_mllog_file(tmp_path):
    """The second writer meets the first's lock (a live process holding it through files.new_log), and a log that
    holds a run is never appended to."""
    log = tmp_path / "mlperf.log"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from rn50_mx.files import new_log; "
                               f"new_log({str(log)!r}); print('held', flush=True); time.sleep(60)"],
                              env={"PATH": ENV_PATH, **PYTHONPATH}, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    flags = ["--synthetic", "1", "--num-examples", "8", "--batch-size", "4", "--num-epochs", "1", "--warmup-epochs",
             "0", "--eval-offset", "0", "--image-shape", "3,32,32", "--num-classes", "3", "--mllog-file", log]
    try:
        assert holder.stdout.readline() == "held\n"
        second = run(py("rn50_mx.train", *flags))
        assert second.returncode == 2 and second.stderr.strip() == (
            f"rn50_mx.train: error: {log}: another process is writing this output now; wait for it to end or "
            "choose another output")
    finally:
        holder.kill()
        holder.wait()
    log.write_text(":::MLLOG {}\n")
    again = run(py("rn50_mx.train", *flags))
    assert again.returncode == 2 and again.stderr.strip() == (
        f"rn50_mx.train: error: {log}: exists and holds a log; a log holds one run only: give a new file name (or "
        "remove the old log)")
    assert log.read_text() == ":::MLLOG {}\n"


def test_two_launches_with_one_datestamp_and_an_existing_log(shared, tmp_path):
    env = {**TINY, "DATADIR": shared["data"], "LOGDIR": str(tmp_path), "DATESTAMP": "same"}
    holder = subprocess.Popen(["flock", "--no-fork", str(tmp_path / "same.lock"), "sleep", "60"])
    try:
        while not (tmp_path / "same.lock").exists():
            time.sleep(0.05)
        busy = run(*launcher("./run_with_docker.sh", env))
    finally:
        holder.kill()
        holder.wait()
    assert busy.returncode == 2 and busy.stderr.strip().splitlines()[-1] == (
        f"run_with_docker.sh: LOGDIR={tmp_path}: another launch is writing the logs of DATESTAMP=same now")
    (tmp_path / "same_1.log").write_text("an old trial\n")
    kept = run(*launcher("./run_with_docker.sh", env))
    assert kept.returncode == 2 and kept.stderr.strip().splitlines()[-1] == (
        f"run_with_docker.sh: LOGDIR={tmp_path}: holds logs of DATESTAMP=same already; they are kept (choose another "
        "DATESTAMP)")
    assert (tmp_path / "same_1.log").read_text() == "an old trial\n"


@pytest.mark.slow
def test_a_logdir_that_fills_during_a_trial_is_one_line_and_stops_the_trials(shared, tmp_path):
    """The old launcher counted the trial as failed with no reason given (tee's own complaint landed mid-line in the
    stream) and went on to the next trial, whose log could not be written either."""
    with mounted(tmp_path / "logs", "size=8k") as logs:
        env = {**TINY, "DATADIR": shared["data"], "LOGDIR": logs, "NEXP": "2", "DATESTAMP": "t"}
        result = run(*launcher("./run_with_docker.sh", env), timeout=300)
        assert result.returncode == 1, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-2:] == [
            f"run_with_docker.sh: trial 1 of 2: its log is incomplete (tee: {logs}/t_1.log: No space left on device)",
            "run_with_docker.sh: no further trial runs: its log would be lost too"], result.stderr[-2000:]
        assert "Beginning trial 2" not in result.stdout and "RESULT," in result.stdout  # trial 1 ran to its end


def test_timing_refuses_to_score_runs_of_different_systems_together(tmp_path):
    logs = []
    for i, path in enumerate(FIXTURE_LOGS):
        text = open(path).read()
        if i == 0:
            text = text.replace('"value": "1xNF5688M6"', '"value": "1xDGXA100"')
        logs.append(tmp_path / os.path.basename(path))
        logs[-1].write_text(text)
    result = run(py("rn50_mx.timing", *logs))
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("no score: the runs are not of one system and batch size (1xDGXA100 batch 3264: result_1.txt; "
            "1xNF5688M6 batch 3264: result_2.txt, result_3.txt, result_4.txt, result_5.txt)") in result.stdout


# --- the trial-outcome contract and stopped launchers (training runs) -----------------------------------------

# A stand-in for the checkpointing trainer's side of the contract, loaded into every Python process through
# PYTHONPATH: rn50_mx.train logs resumable_stop (and no run_stop) and exits 75, as a SIGTERM'd training does.
RESUMABLE = """import sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    import os
    print(f"seed {os.environ['SEED']}")
    print(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "resumable_stop", '
          '"value": "/ckpt/epoch_1", "metadata": {"epoch_num": 1, "step": 3}}', flush=True)
    os._exit(75)
"""

# A rank that hangs on its way out after run_stop success (rank 1 of 2): its exit alarm ends it and horovodrun
# exits 1; the log says success.
HANGS_AT_EXIT = """import atexit, os, sys, time
rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))  # horovodrun's Gloo, or mpirun
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"] and rank == "1":
    atexit.register(time.sleep, 600)
"""


def site(tmp, text):
    folder = tmp / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(text)
    return {"PYTHONPATH": os.pathsep.join([str(folder), *PYTHONPATH.values()])}


def test_a_resumable_stop_ends_the_trials_with_75(shared, tmp_path):
    env = {**TINY, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "3", "DATESTAMP": "r"}
    command, _ = launcher("./run_with_docker.sh", env)
    result = run(command, site(tmp_path, RESUMABLE))
    assert result.returncode == 75, result.stderr[-2000:]
    assert "run_and_time.sh: stopped, resumable (checkpoint \"/ckpt/epoch_1\")" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "run_with_docker.sh: trial 1 of 3: stopped, resumable; no further trial runs")
    assert files_in(tmp_path / "logs") == ["r.resume", "r_1.log"]
    assert "RESULT," not in result.stdout


def test_the_next_launch_resumes_the_stopped_trial_in_its_log(shared, tmp_path):
    """A launch with the DATESTAMP of one whose trial 1 stopped resumable (r.resume: run.sub's requeued job) runs
    trial 1 again with its seed (the checkpoint's), appending to r_1.log on a line of its own though the stopped
    trial's last line was cut, and a launch that stopped before the trial leaves it to resume; the old code refused
    the DATESTAMP (its logs exist)."""
    env = {**TINY, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "3", "DATESTAMP": "r"}
    command, _ = launcher("./run_with_docker.sh", env)
    stub = site(tmp_path, RESUMABLE)
    assert run(command, stub).returncode == 75
    bad, _ = launcher("./run_with_docker.sh", {**env, "BATCHSIZE": "abc"})
    assert run(bad, stub).returncode == 2  # stopped before the trial: it is still to resume
    log = tmp_path / "logs" / "r_1.log"
    stopped = log.read_text() + "a line cut short"
    log.write_text(stopped)
    result = run(command, stub)
    assert result.returncode == 75, result.stderr[-2000:]
    assert files_in(tmp_path / "logs") == ["r.resume", "r_1.log"]
    text = log.read_text()
    assert text.startswith(stopped + "\nResuming trial 1 of 3\n"), text[len(stopped) - 200:]
    seeds = re.findall(r"^seed (\d+)$", text, re.M)
    assert len(seeds) == 2 and seeds[0] == seeds[1], seeds


@pytest.mark.parametrize("state, says", [
    ("resume_trial=1\nresume_seed=7\ntouch {marker}\n", "line 3 is not the launcher's state (touch "),
    ("resume_trial=$(touch {marker})\n", "line 1 is not the launcher's state (resume_trial=$(touch "),
    ("resume_trial=1\nresume_seed=7\nused_seeds=7; touch {marker}\nfailed=\n", "line 3 is not the launcher's state"),
    ("resume_trial=9\nresume_seed=7\nused_seeds=7\nfailed=\n", "resumes trial 9, not one of NEXP=3"),
])
def test_the_resume_state_is_read_as_data_never_run(shared, tmp_path, state, says):
    """LOGDIR/DATESTAMP.resume (a results folder, often shared and mounted into the container) was `source`d by the
    launcher: text planted in it ran on the host. It is read as the four lines of numbers the launcher writes; any
    other line, or a trial above NEXP, is one line and no trial runs."""
    marker = tmp_path / "ran"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "r.resume").write_text(state.format(marker=marker))
    env = {**TINY, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "3", "DATESTAMP": "r"}
    command, _ = launcher("./run_with_docker.sh", env)
    result = run(command, site(tmp_path, RESUMABLE))
    assert result.returncode == 2 and not marker.exists()
    assert_one_line_naming(result, f"run_with_docker.sh: {tmp_path}/logs/r.resume: {says}")
    assert files_in(tmp_path / "logs") == ["r.resume"]


@pytest.mark.slow
def test_run_stop_success_is_success_when_a_rank_hangs_at_exit(shared, tmp_path):
    """Two ranks under horovodrun (MPI, as Horovod is built here and in the image); rank 1 hangs after run_stop and
    its alarm ends it: horovodrun exits non-zero, the trial succeeded."""
    env = {**TINY, "DGXNGPU": "2", "KVSTORE": "horovod", "DATADIR": shared["data"], "RN50_EXIT_TIMEOUT": "2"}
    command, _ = launcher("./run_and_time.sh", env)
    result = run(command, site(tmp_path, HANGS_AT_EXIT), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "after run_stop success (a process hung on its way out" in result.stderr
    assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", result.stdout, re.M)


def sigterm_to(command, out, ready):
    """Start `command` (from the repository), send it SIGTERM once ready(output, its processes) holds; none of its
    processes may be left running. Returns its exit status and its output."""
    with open(out, "w") as sink:
        proc = subprocess.Popen(command, env={"PATH": ENV_PATH, "HOME": "/tmp", **PYTHONPATH}, cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT)
    procs = []
    try:
        deadline = time.time() + 300
        while not ready(out.read_text(), procs):
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
            with contextlib.suppress(psutil.NoSuchProcess):
                procs = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
        _, alive = psutil.wait_procs(procs, timeout=15)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [p.cmdline() for p in alive]
        return status, out.read_text()
    finally:
        for p in [*procs, psutil.Process(proc.pid)] if proc.poll() is None else procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def sigterm_to_run_with_docker(env, out, ready):
    """sigterm_to() on run_with_docker.sh (`env` after config/CPU.sh), which must exit 143; its output."""
    status, text = sigterm_to(launcher("./run_with_docker.sh", env)[0], out, ready)
    assert status == 143, text[-3000:]
    return text


def runs(procs, module):
    return any(module in " ".join(p.cmdline()) for p in procs)


@pytest.mark.slow
def test_sigterm_on_run_with_docker_stops_the_running_trial(shared, tmp_path):
    """The old launcher died alone and left the trial training to its end."""
    env = {**TINY, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DATADIR": shared["data"],
           "LOGDIR": str(tmp_path / "logs"), "NEXP": "2", "DATESTAMP": "t"}
    text = sigterm_to_run_with_docker(env, tmp_path / "out.txt",
                                      lambda out, procs: '"key": "epoch_start"' in out and runs(procs, "rn50_mx.train"))
    assert "run_with_docker.sh: stopped by SIGTERM in trial 1 of 2 (no run_stop); no further trial runs" in text
    assert "RESULT," not in text and "Beginning trial 2" not in text
    assert files_in(tmp_path / "logs") == ["t_1.log"]


@pytest.mark.slow
def test_sigterm_before_the_first_trial_stops_the_self_test(shared, tmp_path):
    """SELFTEST=1: the old launcher ran the self-test outside any trial's group and died alone on SIGTERM, leaving
    the self-test (minutes on a GPU node) running; a SIGTERM while a long child ran ended it without its line."""
    env = {**TINY, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "1", "DATESTAMP": "t",
           "SELFTEST": "1"}

    def self_test_under_way(out, procs):
        """The self-test has run for a few seconds: the launcher is waiting on it when the SIGTERM comes."""
        if not runs(procs, "rn50_mx.selftest"):
            return False
        time.sleep(3)
        return True

    text = sigterm_to_run_with_docker(env, tmp_path / "out.txt", self_test_under_way)
    assert "run_with_docker.sh: stopped by SIGTERM before the first trial; no further trial runs" in text
    assert "Beginning trial" not in text


@pytest.mark.slow
def test_slurms_sigusr1_to_every_process_of_a_trial_stops_it_resumable(shared, tmp_path):
    """Slurm's --signal=USR1 (run.sub) reaches every process of the step: run_and_time.sh died of it (bash's default
    action) while the rank wrote its checkpoint, so the trial was a failure and the job was not requeued."""
    folder = tmp_path / "ckpt"
    env = {**TINY, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DATADIR": shared["data"],
           "RN50_CHECKPOINT_DIR": str(folder)}
    command, _ = launcher("./run_and_time.sh", env)
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen(command, env={"PATH": ENV_PATH, "HOME": "/tmp", **PYTHONPATH}, cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while '"key": "epoch_start"' not in out.read_text():
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGUSR1)
        assert proc.wait(timeout=120) == 75, out.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert "run_and_time.sh: stopped, resumable (checkpoint " in text and "RESULT," not in text
    assert [name for name in files_in(folder) if name.startswith("step-")]


@pytest.mark.slow
def test_sigterm_on_make_demo_while_it_packs_leaves_nothing_running(tmp_path):
    """make passes a SIGTERM on to its own children only: the old recipe ran the packer under a shell, which died
    alone, and the packer went on writing the data set after `make demo` had ended."""
    command = ["make", "--no-print-directory", "demo", f"DATA={tmp_path / 'data'}", f"LOGDIR={tmp_path / 'logs'}"]

    def packing(out, procs):
        """The packer itself is running (not a shell on its way to it)."""
        with contextlib.suppress(psutil.NoSuchProcess):
            return any(p.name().startswith("python") and "fashion-mnist" in p.cmdline() for p in procs)

    status, text = sigterm_to(command, tmp_path / "out.txt", packing)
    assert status == -signal.SIGTERM, text[-3000:]
    assert not (tmp_path / "logs").exists()
