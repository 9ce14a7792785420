"""The hostile pass (issue 19) as a table of probes: a command, the fault it meets, the first stderr line and the exit
status expected, and what must be on disk afterwards. Real files, real processes, real signals: a small tmpfs for a
full disk, a read-only tmpfs for an unwritable folder (root writes through chmod), FIFOs for reads that block, two
processes at once. Most probes fail before MXNet loads, so the table runs in seconds; the few that need training
are marked slow."""
import argparse
import contextlib
import glob
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import pytest

from rn50_mx import prep_rec
from tests.support import bad_values
from tests.support.data import TINY_CLASSES
from tests.support.procs import ENV_PATH, PYTHONPATH, ROOT, files_in, launcher, mounted, py, run, sigterm_to
from tests.support.settings import SHRUNK_LAYERS, STOPPED_RUN, TINY_KEEP_CACHES
from tests.support.studies import planted_study, search_argv
from tests.support.table_runner import as_user, linked_copy

FIXTURE_LOGS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "inspur_nf5688m6", "result_*.txt")))


@dataclass
class Probe:
    """One hostile input: arrange(tmp) -> (command, extra environment); the first stderr line must match `first`
    (a regex), the status must be `status`, and after(tmp) must hold (what is, and is not, on disk)."""
    name: str
    arrange: Callable
    first: str
    status: int = 2
    after: Callable = field(default=lambda tmp: True)


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
    shutil.copy(os.path.join(jpegs, TINY_CLASSES[0], "img000.jpg"), os.path.join(os.fsencode(jpegs), b"bag", name))
    return jpegs


def with_fifo(shared, tmp, name):
    """A copy of the shared data whose `name` is a FIFO no one writes: a reader that opens it waits forever."""
    data = shutil.copytree(shared["data"], tmp / "data")
    os.remove(data / name)
    os.mkfifo(data / name)
    return data


def check_data(data):
    return py("rn50_mx.check", "--data-train", data / "train.rec", "--data-val", data / "val.rec", "--num-classes", "5",
              "--batch-size", "4")


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
    # issue 42 item 7: a FIFO named as an input blocked every reader (7c8846a: check and evaluate hung)
    Probe("check: a FIFO as the val .rec", lambda tmp, sh: (check_data(with_fifo(sh, tmp, "val.rec")), {}),
          r"^rn50_mx\.check: error: .*/val\.rec: a FIFO \(named pipe\), not a regular file: cannot read it$"),
    Probe("check: a FIFO as the train .idx", lambda tmp, sh: (check_data(with_fifo(sh, tmp, "train.idx")), {}),
          r"^rn50_mx\.check: error: .*/train\.idx: a FIFO \(named pipe\), not a regular file"),
    Probe("verify: a FIFO as the .idx",
          lambda tmp, sh: (py("rn50_mx.prep_rec", "verify", with_fifo(sh, tmp, "val.idx") / "val"), {}),
          r"^prep_rec: error: .*/val\.idx: a FIFO \(named pipe\), not a regular file"),
    Probe("verify: a FIFO as the .rec",
          lambda tmp, sh: (py("rn50_mx.prep_rec", "verify", with_fifo(sh, tmp, "val.rec") / "val"), {}),
          r"^prep_rec: error: .*/val\.rec: a FIFO \(named pipe\), not a regular file"),
    Probe("timing: a FIFO as the log", lambda tmp, sh: (py("rn50_mx.timing", with_fifo(sh, tmp, "val.lst") / "val.lst"),
                                                        {}),
          r"^python -m rn50_mx\.timing: error: .*/val\.lst: a FIFO \(named pipe\), not a regular file"),
    Probe("timing: eval_accuracy not a number",
          lambda tmp, sh: (py("rn50_mx.timing", log_with(tmp, {'"value": 0.32822': '"value": "high"'})), {}),
          r"^python -m rn50_mx\.timing: error: .*edited\.log: eval_accuracy 'high' is not a number"),
    # issue 41's container launch: docker run -v splits DATADIR:/data at every ':' (the old code got to docker run)
    Probe("run_with_docker.sh: a ':' in DATADIR", lambda tmp, sh: launcher("./run_with_docker.sh", {
        "CONT": "rn50-mx:cpu", "DOCKER_HOST": f"unix://{tmp}/no-engine", "LOGDIR": str(tmp / "logs"),
        "DATADIR": str(shutil.copytree(sh["data"], tmp / "a:b"))}),
        r"^run_with_docker\.sh: DATADIR=.*/a:b: a ':' in the path, which docker run -v"),
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

def test_the_tools_load_mxnet_only_for_work_that_needs_it():
    """A tool that stops on its input says so before MXNet loads (about 2 CPU-seconds): importing its command's
    module loads none. prep_rec loads it at its first record, the rehearsal's own process to compare two models, the
    self-test for its checks; train and evaluate, which need it for any work, are not in the list."""
    tools = ["prep_rec.__main__", "rehearse.__main__", "selftest.__main__", "recipe.__main__", "check", "timing",
             "search.__main__", "tune.__main__"]
    code = ("import importlib, sys\n"
            f"for tool in {tools!r}:\n"
            "    sys.argv = ['rn50_mx.' + tool, '--help']\n"
            "    try:\n"
            "        importlib.import_module('rn50_mx.' + tool)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mxnet')[:1])")
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "[]", result.stdout[-2000:] + result.stderr


def test_a_tool_s_imports_are_frozen_out_of_the_garbage_collector():
    """Every command runs its main() through errors.run_cli, which first freezes what the imports made (gc.freeze):
    no full collection, nor DALI's gc.collect() at exit, walks MXNet's objects again. A tiny training paid about a
    quarter of a CPU-second for them."""
    code = ("import gc\nfrom rn50_mx.errors import run_cli\n"
            "run_cli(lambda: print(gc.get_freeze_count(), sum(gc.get_count())), 'probe')")
    result = run([sys.executable, "-c", code])
    frozen, young = map(int, result.stdout.split())
    assert result.returncode == 0 and frozen > 1000 and young < 100, result.stdout + result.stderr


@pytest.mark.parametrize("handled_by, status, says", [("run_cli", 130, "probe: interrupted"),
                                                      ("the tool", 143, "")])
def test_a_handled_interrupt_ends_with_its_own_status_wherever_it_landed(tmp_path, handled_by, status, says):
    """A stop that lands in an eval() of a string (collections.namedtuple's, as a lazy import runs) and is handled,
    by run_cli or by the tool (the search's driver returns 143), ends with the tool's status: CPython 3.11 had it die
    by SIGINT (-2) instead, after a clean stop, as test_prep_imagenet's stopped pack did once in CI. A tool runs as
    `python -m`, the one start where Python reads that mark."""
    (tmp_path / "stopped_tool.py").write_text(
        "from rn50_mx.errors import run_cli\n"
        "def stop_in_eval():\n"
        "    eval('(_ for _ in ()).throw(KeyboardInterrupt)')\n"
        "def main():\n"
        + ("    stop_in_eval()\n" if handled_by == "run_cli" else
           "    try:\n        stop_in_eval()\n    except KeyboardInterrupt:\n        return 143\n")
        + "run_cli(main, 'probe')\n")
    result = run([sys.executable, "-m", "stopped_tool"], env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert (result.returncode, result.stderr.strip()) == (status, says), result.stderr[-2000:]


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
        logs = run(*launcher("./run_with_docker.sh", {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": ro}))
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
                             f"{shared['data']}/train.rec", {**TINY_KEEP_CACHES, "BATCHSIZE": "2"}))
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
    """The second writer meets the first's lock (a live process holding it through mlperf_log.new_log), and a log that
    holds a run is never appended to."""
    log = tmp_path / "mlperf.log"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from rn50_mx.mlperf_log import new_log; "
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


def test_a_fifo_as_the_val_rec_is_one_line_in_evaluate(shared, stopped_checkpoints, tmp_path):
    """Issue 42 item 7: evaluate opened the FIFO and waited for a writer forever (7c8846a)."""
    data = with_fifo(shared, tmp_path, "val.rec")
    result = run(py("rn50_mx.evaluate", "--checkpoint-dir", shutil.copytree(stopped_checkpoints, tmp_path / "ckpt"),
                    "--data-val", data / "val.rec", "--num-classes", "3", "--image-shape", "3,32,32", "--num-layers",
                    str(SHRUNK_LAYERS)), timeout=60)
    assert result.stderr.strip().splitlines()[-1] == (f"rn50_mx.evaluate: error: {data / 'val.rec'}: a FIFO (named "
                                                      "pipe), not a regular file: cannot read it")
    assert result.returncode == 2 and "Traceback" not in result.stderr


@pytest.mark.parametrize("edit", [("DIVERGED_EXIT=78", "DIVERGED_EXIT=seventy"), ("DIVERGED_EXIT=78", "DIVERGED_EXIT=75")])
def test_an_edited_exit_codes_file_is_one_line_in_every_command(tmp_path, edit):
    """rn50_mx/exit_codes.sh, read at import by rn50_mx.exits (issue 43), edited (a code not a number, two codes
    alike) in a copy of the package: one line naming the file, exit 2, not a KeyError traceback at
    every command that imports checkpoint; a code read wrong would pass a stop off as another outcome. Training with
    settings and data that pass its early check (--help, answered before the import, needs no exit code)."""
    shutil.copytree(os.path.join(ROOT, "rn50_mx"), tmp_path / "rn50_mx", ignore=shutil.ignore_patterns("__pycache__"))
    codes = tmp_path / "rn50_mx" / "exit_codes.sh"
    codes.write_text(codes.read_text().replace(*edit))
    result = subprocess.run(py("rn50_mx.train", *STOPPED_RUN), env={"PATH": ENV_PATH, "PYTHONPATH": str(tmp_path)},
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and re.fullmatch(rf"rn50_mx: error: {re.escape(str(codes))}: \w+_EXIT.*reinstall "
                                                   r"rn50_mx\n", result.stderr), result.stderr[-2000:]


# --- hostile pass 7 (issue 49): each class's named cases; tests/test_input_table.py runs every input through them --

def checkpoint_copy(stopped_checkpoints, tmp):
    """A copy of the suite's stopped checkpoint folder (table_runner.linked_copy's)."""
    return pathlib.Path(linked_copy(stopped_checkpoints, tmp / "ckpt"))


@pytest.mark.parametrize("plant", [bad_values.link_elsewhere, bad_values.fifo], ids=["link", "fifo"])
@pytest.mark.parametrize("where", ["checkpoint folder", "study"])
def test_a_lock_is_never_opened_through_a_planted_link_or_fifo(stopped_checkpoints, tmp_path, where, plant):
    """Class 1: `ln -s victim CKPT/lock`, then a resume, replaced the victim's content with `process N on HOST` and
    went on; the same at the study's lock (STUDY.db.STUDY.lock); a FIFO there was an OSError traceback (Errno 22,
    ftruncate). Both refuse in one line naming the lock, the victim intact."""
    from rn50_mx import search
    from rn50_mx.checkpoint import lock
    from rn50_mx.errors import InputError

    if where == "study":
        args = argparse.Namespace(results=str(tmp_path / "res"), study="CPU",
                                  storage=f"sqlite:///{tmp_path / 'res' / 'CPU.db'}")
        path, take = search.lock_path(args), lambda: search.hold_lock(args)
        os.makedirs(tmp_path / "res")
    else:
        folder = checkpoint_copy(stopped_checkpoints, tmp_path)
        path, take = os.path.join(folder, "lock"), lambda: lock(folder)
        os.remove(path)
    plant(path)
    with pytest.raises(InputError, match=rf"^{re.escape(path)}: a (symbolic link|FIFO \(named pipe\)), not a regular "
                                         "file"):
        take()
    assert plant is bad_values.fifo or bad_values.victim_intact(path)


@pytest.mark.timeout(60)
def test_a_fifo_at_the_finished_mark_is_one_line_not_a_hung_resume(stopped_checkpoints, tmp_path):
    """Class 4: a FIFO at the checkpoint folder's `finished` mark hung a resume and the launchers' `check --resume`
    (both ask checkpoint.refuse_ended): the old code waits here until the test's timeout."""
    from rn50_mx.checkpoint import refuse_ended
    from rn50_mx.errors import InputError

    folder = checkpoint_copy(stopped_checkpoints, tmp_path)
    os.mkfifo(folder / "finished")
    with pytest.raises(InputError, match=r"/finished: a FIFO \(named pipe\), not a regular file: cannot read it, "
                                         r"where a run marks its end"):
        refuse_ended(str(folder))


def test_a_fifo_as_the_mllog_file_is_one_line(tmp_path):
    """Class 4: a FIFO as --mllog-file was taken for a new log: the run's MLPerf lines went into the pipe, unread
    (past 64 KB the run would block)."""
    from rn50_mx.errors import InputError
    from rn50_mx.mlperf_log import new_log

    os.mkfifo(tmp_path / "mlperf.log")
    with pytest.raises(InputError, match=r"mlperf\.log: a FIFO \(named pipe\), not a regular file: cannot write it"):
        new_log(str(tmp_path / "mlperf.log"))


@pytest.mark.parametrize("fault", ["val.rec a FIFO", "train.idx cut short"])
def test_training_checks_its_data_before_run_start(shared, tmp_path, fault):
    """Class 4: `python -m rn50_mx.train` (no launcher's check before it) met a FIFO val.rec after run_start (its log
    a run that never ended), and trained in silence on the first half of a train.idx cut short. What the files are
    is asked before any work (no byte read: the MLPerf clock starts before the data are touched); an index training
    counts (no --num-examples) is checked to its end when it is counted, before run_start."""
    data = shutil.copytree(shared["data"], tmp_path / "data")
    if fault == "val.rec a FIFO":
        os.remove(data / "val.rec")
        os.mkfifo(data / "val.rec")
    else:
        bad_values.truncated(data / "train.idx")
    result = run(py("rn50_mx.train", "--data-train", data / "train.rec", "--data-val", data / "val.rec",
                    "--num-classes", "5", "--image-shape", "3,32,32", "--batch-size", "4", "--num-epochs", "1",
                    "--warmup-epochs", "0", "--eval-offset", "0", "--dali-threads", "1"),
                 {"OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout[-1500:] + result.stderr[-1500:]
    fifo = fault == "val.rec a FIFO"
    said = "val.rec: a FIFO (named pipe)" if fifo else "train.idx: lists records up to byte "
    assert said in result.stderr.strip().splitlines()[-1] and len(result.stderr.strip().splitlines()) == 1
    assert '"run_start"' not in result.stdout  # a FIFO before init_start; the index when the epoch is sized
    assert fifo != ('"init_start"' in result.stdout)


def two_checkpoints(stopped_checkpoints, tmp):
    """The stopped run's folder with its checkpoint also as step-1 (the one before it: the same files are a usable
    checkpoint under any step's name)."""
    folder = checkpoint_copy(stopped_checkpoints, tmp)
    [step] = [name for name in os.listdir(folder) if name.startswith("step-")]
    shutil.copytree(folder / step, folder / "step-1", copy_function=os.link)
    return folder, folder / step


@pytest.fixture
def open_tmp():
    """A folder under /tmp that another user can reach (pytest's own are root's alone), removed at the end."""
    folder = tempfile.mkdtemp(prefix="rn50-hostile-")
    os.chmod(folder, 0o755)
    yield pathlib.Path(folder)
    shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as another user: needs root")
def test_an_unreadable_rank_file_refuses_its_checkpoint_and_the_previous_one_is_used(stopped_checkpoints, open_tmp,
                                                                                     capsys):
    """Class 5: a rank0.json the user cannot read was a PermissionError traceback; docs/checkpoints.md promises a
    one-line refusal and the previous checkpoint. As nobody (root reads through chmod 0), in this process."""
    from rn50_mx import checkpoint

    folder, newest = two_checkpoints(stopped_checkpoints, open_tmp)
    assert checkpoint.newest_usable(str(folder), set_aside=False) == str(newest)  # as root: the imports, once
    bad_values.unreadable(newest / "rank0.json")
    for path in [folder, *folder.rglob("*")]:  # the user's own folder, but the hard links the fixture shares
        if path != newest / "rank0.json" and (path.is_dir() or path.stat().st_nlink == 1):
            os.chown(path, 65534, 65534)
    with as_user(65534):
        chosen = checkpoint.newest_usable(str(folder), set_aside=False)
    assert chosen == str(folder / "step-1")
    assert capsys.readouterr().err.strip() == (f"rn50_mx: {newest}: refused (rank0.json cannot be read (Permission "
                                               "denied)); using step-1")


def test_a_refused_checkpoint_whose_refused_name_is_taken_is_set_aside_under_another(stopped_checkpoints, tmp_path,
                                                                                     capsys):
    """Class 5: a refused step whose `.refused` name was taken (a refusal of that step before) was an OSError
    traceback (Directory not empty); it is set aside as STEP.refused-2, the earlier one kept."""
    from rn50_mx import checkpoint

    folder, newest = two_checkpoints(stopped_checkpoints, tmp_path)
    bad_values.truncated(newest / "rank0.json")
    os.makedirs(f"{newest}.refused/earlier")
    assert checkpoint.newest_usable(str(folder)) == str(folder / "step-1")
    assert sorted(os.listdir(folder)) == ["lock", "step-1", f"{newest.name}.refused", f"{newest.name}.refused-2"]
    assert capsys.readouterr().err.strip().endswith(f"; renamed {newest.name}.refused-2; using step-1")


def test_a_link_at_a_partial_checkpoint_s_name_is_said_as_what_was_done(tmp_path, capsys):
    """Class 7: a link planted at .tmp-step-N was "a partial checkpoint (its writer stopped): removed" and left (rmtree
    follows no link); now the link itself is removed, said so, and what it points to is kept."""
    from rn50_mx import checkpoint

    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "kept").write_text("x")
    (tmp_path / "ckpt").mkdir()
    os.symlink(tmp_path / "victim", tmp_path / "ckpt" / ".tmp-step-9")
    assert checkpoint.newest_usable(str(tmp_path / "ckpt")) is None
    assert capsys.readouterr().err.strip() == (f"rn50_mx: {tmp_path / 'ckpt' / '.tmp-step-9'}: not a folder (a link "
                                               "or a file in a partial checkpoint's place): the entry removed, "
                                               "nothing it points to")
    assert os.listdir(tmp_path / "ckpt") == [] and (tmp_path / "victim" / "kept").read_text() == "x"


def search_in(tmp, data, *extra):
    return run(py("rn50_mx.search", *search_argv(tmp / "res", tmp / "cfg", data, *extra)), {"OMP_NUM_THREADS": "1"},
               timeout=300)


def test_a_value_planted_in_optuna_s_fixed_params_is_one_line_naming_the_trial(shared, tmp_path):
    """Class 6: {"EVAL_OFFSET": "abc"} planted as a RUNNING trial's fixed_params was queued again, then a ValueError
    traceback from study.ask at this and every later driver. Refused before anything runs."""
    planted_study(tmp_path / "res", trial_runs=[], fixed={"EVAL_OFFSET": "abc"})
    result = search_in(tmp_path, shared["data"])
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"python -m rn50_mx.search: error: sqlite:///{tmp_path / 'res' / 'CPU.db'}: study 'CPU', trial 0: the values "
        "it is queued with: EVAL_OFFSET='abc' is not a value of --knob EVAL_OFFSET=0:1; this search did not write "
        "them"], result.stderr[-2000:]
    assert not (tmp_path / "res" / "CPU.trials").exists()


def test_a_finalist_s_log_of_another_run_is_not_scored(shared, tmp_path):
    """Class 3: an ended finals record whose FOLDER/seedSEED.log is another run's log (here the reference's: another
    seed, other settings) was scored as that finalist's. The log's own seed and settings are checked first."""
    from rn50_mx.search.driver import final_seeds

    seed = final_seeds("CPU", 1)[0]
    folder = tmp_path / "res" / "CPU.finals" / "1" / "sourced"
    folder.mkdir(parents=True)
    shutil.copy(FIXTURE_LOGS[0], folder / f"seed{seed}.log")
    planted_study(tmp_path / "res", finished={"EVAL_OFFSET": 1}, finals=[dict(
        set="sourced", params={"EVAL_OFFSET": 1}, seed=seed, folder=str(folder), launcher="local",
        record=["pgid", 999_999, 1], ended=True)])
    result = search_in(tmp_path, shared["data"], "--finalists", "1")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stdout + result.stderr
    assert result.stderr.startswith(
        f"python -m rn50_mx.search: error: sqlite:///{tmp_path / 'res' / 'CPU.db'}: study 'CPU', finals: the log "
        f"{folder / f'seed{seed}.log'} of finalist sourced seed {seed}, which ended under an earlier driver, is not "
        f"that run's (its seed is 13863, the run's {seed})"), result.stderr
    assert result.stdout == ""


def test_a_finalist_s_group_left_alone_is_not_said_ended(shared, tmp_path):
    """Class 7: the search said a finalist's recorded group "is not provably the recorded run's: left alone", then
    "its processes ended, run again" of the same finalist. Its group here: a process under the recorded id that
    started at another time, which is left running."""
    from rn50_mx import children

    other = subprocess.Popen(["sleep", "600"], start_new_session=True)  # outlives the search on any machine
    try:
        seed = 910_000
        folder = tmp_path / "res" / "CPU.finals" / "1" / "sourced"
        planted_study(tmp_path / "res", finished={"EVAL_OFFSET": 1}, finals=[dict(
            set="sourced", params={"EVAL_OFFSET": 1}, seed=seed, folder=str(folder), launcher="local",
            record=["pgid", other.pid, children.started_at(other.pid) + 1], ended=False)])
        result = search_in(tmp_path, shared["data"])
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[1] == (
            f"search: finalist sourced seed {seed} was running when the last driver stopped: its recorded process "
            "group was left alone (above), run again"), result.stdout
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
