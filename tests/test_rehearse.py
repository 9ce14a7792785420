"""`python -m rn50_mx.rehearse`: every GPU config's code path run on this CPU, on the stand-in build (rn50_mx/standin),
as a user runs it before queueing on a cluster: the shipped NF5688M6 config end to end (the run, SIGTERM and an
exact resume, evaluate, the self-test), then one quick rehearsal (the run alone; the open path's stopped, resumed
and evaluated too) per code path among the GPU configs in config/ and those the recipe writes for A100 and H100 at
1, 2 and 8 nodes, closed and open; configs that differ only in values (LR, weight decay, hints: plan.VALUES_ONLY)
or in the run's lengths (plan.DERIVED) share a path. Then GPU review 4's crashes, each a config whose rehearsal
fails on the code before, and the command's refusals."""
import contextlib
import glob
import inspect
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rn50_mx import config, recipe
import rn50_mx.rehearse as rehearsal
from rn50_mx.rehearse import plan, stages
from tests.support.procs import (ENV_PATH, PYTHONPATH, ROOT, assert_all_end, assert_one_line_naming, descendants,
                                 mounted)

GPU_ONLY_WORDS = "this says nothing of whether the GPU run will work"


def rehearse(system, *args, env=None, timeout=900, config_dir="config"):
    """`source <config_dir>/<system>.sh && python -m rn50_mx.rehearse ARGS` (with `env` exported after the config)."""
    script = (f"set -euo pipefail; source {config_dir}/{system}.sh; {exports(env or {})}"
              f"exec {sys.executable} -m rn50_mx.rehearse {' '.join(args)}")
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp"), **PYTHONPATH})


def exports(env):
    """bash's exports of the variables {name: value}."""
    return "".join(f"export {name}={value!r}; " for name, value in env.items())


def rows(text):
    """{stage: (status, detail)} of the rehearsal's table (the last row of a name)."""
    found = {}
    for line in text.splitlines():
        for name in ("config", "train", "stop and resume", "evaluate", "self-test", "tune"):
            if line.startswith(name + "  "):
                status, _, detail = line[len(name):].strip().partition("  ")
                found[name] = (status, detail.strip())
    return found


@pytest.mark.slow
def test_the_shipped_config_rehearses_end_to_end(tmp_path):
    result = rehearse("NF5688M6", "--work", str(tmp_path / "work"))
    table = rows(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for stage in ("train", "stop and resume", "evaluate", "self-test", "tune"):
        assert table[stage][0] == "ok", (stage, table)
    assert "bit-identical" in table["stop and resume"][1] and "the run's last eval" in table["evaluate"][1]
    # the self-test's steps ran on the stand-in and claimed no rate: it said "the input keeps up" before
    [steps] = [line for line in open(tmp_path / "work" / "selftest.out") if line.startswith("train steps ")]
    assert "1 step(s) on synthetic and 1 on real batches ran (stand-in: no figure)" in steps, steps
    assert GPU_ONLY_WORDS in result.stdout and "GPU only" in result.stdout
    assert "8 ranks (1 x 8) -> 2 on this machine" in result.stdout
    assert "50 -> 26 layers (2 units a stage: its projection unit and an identity unit)" in result.stdout
    assert ", 3 steps an epoch, " in result.stdout  # the stop lands by step 8 (plan.MIN_EPOCHS)


@pytest.mark.slow
def test_a_config_whose_loss_diverges_is_a_finding_of_the_train_stage(records, tmp_path):
    """Issue 43's case: NF5688M6 (an LR scaled for LARS) with plain SGD without momentum, --quick on one rank. Training
    stops itself on the diverged loss, and the rehearsal ends by saying that the config diverges, in how many steps at
    which LR with which optimizer, as a finding of the train stage and not a stage failed in the code (exit 78). The old
    code trained on: its train stage passed, and only its stop-and-resume stage failed (on a NaN checkpoint that it
    called forged)."""
    result = rehearse("NF5688M6", "--quick", "--ranks", "1", *records, "--work", str(tmp_path / "work"),
                      env={"OPTIMIZER": "sgd", "MOM": "0"})
    assert result.returncode == 78, result.stdout[-3000:] + result.stderr[-2000:]
    status, detail = rows(result.stdout)["train"]
    assert status == "FAIL" and detail.startswith("the config diverges in "), detail
    last = result.stdout.strip().splitlines()[-1]
    assert re.match(r"rehearse: the config diverges in \d+ steps at LR 10\.5 with OPTIMIZER=sgd \(loss .*\): a "
                    r"finding about the settings that set the step size, not a failure of the code \(train stage\)$",
                    last), last
    assert "rehearse: no stage failed in the code" in result.stdout
    assert ", 2 steps an epoch, " in result.stdout  # --quick stops nothing (plan.QUICK_STEPS)


def sourced(path, **env):
    """The environment a config file makes (sourced in a clean bash), the variables `env` exported after it."""
    out = subprocess.run(["bash", "-c", f'source "$1" && {exports(env)}env -0', "bash", path], capture_output=True,
                         text=True, env={"PATH": ENV_PATH}).stdout
    return dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)


def settings_of(path):
    """The settings a config file gives."""
    return config.load([], environ=sourced(path))


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """A copy of config/ with the recipe's configs for A100 and H100 at 1, 2 and 8 nodes, closed and open, written by
    the recipe's main in this process (test_recipe runs its command: here 12 processes would import MXNet for the
    memory line, 40 CPU-seconds against 17)."""
    folder = tmp_path_factory.mktemp("configs") / "config"
    shutil.copytree(os.path.join(ROOT, "config"), folder)
    for gpu in ("A100", "H100"):
        for nodes in (1, 2, 8):
            for division in ("closed", "open"):
                with contextlib.redirect_stdout(io.StringIO()):
                    recipe.main(["--nodes", str(nodes), "--gpus-per-node", "8", "--gpu", gpu, "--system",
                                 f"R{gpu}x{nodes}", "--config-dir", str(folder), "--division", division])
                assert os.path.exists(folder / f"R{gpu}x{nodes}{'_open' if division == 'open' else ''}.sh")
    return folder


def code_paths(folder):
    """{code path: [config names]} of the GPU configs in `folder` (those not named CPU*, fragments left out)."""
    paths = {}
    for path in sorted(glob.glob(str(folder / "*.sh"))):
        name = os.path.basename(path)[:-3]
        if name.startswith("CPU") or name in ("gpu_common", "A100x8_1node_common"):
            continue
        s = settings_of(path)
        paths.setdefault(plan.code_path(s, plan.shrink(s, 2, {"train": "t.rec", "val": "v.rec"})), []).append(name)
    return paths


def covering(paths, base):
    """{path: the path that rehearses it} for each code path whose every change from `base` (a setting and its
    value) another path makes too, with more: rehearsing that one runs each of its changes."""
    changes = {path: set(path) - set(base) for path in paths if path != base}
    return {path: next(other for other in changes if changes[path] < changes[other]) for path in changes
            if any(changes[path] < changes[other] for other in changes)}


@pytest.mark.slow
@pytest.mark.timeout(2700)  # 229 s of wall at 7b9429c on make test's 3 workers: a slow machine's margin
def test_every_gpu_config_s_code_path_rehearses(configs, records, tmp_path, monkeypatch):
    """12 recipe configs and the 4 shipped ones; the path of NF5688M6 is the end-to-end test's, the others --quick
    (the run alone), and the open levers' path through the stop and resume and evaluate stages too. A path whose
    changes from NF5688M6's another path makes too is rehearsed by that one, its changes taken to act apart
    (covering()): the 8-node closed configs' (evals from the first epoch), rehearsed by DGXA100_multi_8x8x204's (the
    same evals, with DALI's cache and ROI decode changed as well); the 1- and 2-node open configs', by the 8-node open
    configs' (the same levers, with evals from the first epoch: a 5-epoch shrunk run, its ramp over all 5, which the
    stop and resume crosses). The run's lengths are the eval schedule's (plan.DERIVED). So are the open path's self-test
    and tuner: their stand-in GPU path is the end-to-end test's, their open levers' (progressive resizing,
    --val-crop) test_selftest's and test_tune's on the CPU. The quick ones run on the records generated once for the
    module, as the end-to-end test's generation is rehearsed there."""
    paths = code_paths(configs)
    assert sum(map(len, paths.values())) == 16 and len(paths) >= 4, paths
    base = next(path for path, names in paths.items() if "NF5688M6" in names)
    covered = covering(paths, base)
    assert {tuple(paths[path]): paths[other][0] for path, other in covered.items()} == {
        ("RA100x8", "RH100x8"): "DGXA100_multi_8x8x204",
        ("RA100x1_open", "RA100x2_open", "RH100x1_open", "RH100x2_open"): "RA100x8_open"}, covered
    failed, full = [], None
    for path, names in paths.items():
        if path == base or path in covered:
            continue
        # the open levers' path beyond its run: the weight EMA's --save-model under 2 ranks failed there ("Horovod has
        # been shut down": a rank exited with the BatchNorm statistics' allreduce still queued)
        if full is None and any(name.endswith("_open") for name in names):
            full = names
            try:
                shrunk, reference = stopped_and_resumed(sourced(configs / f"{names[0]}.sh"), tmp_path / names[0],
                                                        monkeypatch)
                assert "the run's last eval" in stages.evaluate(shrunk, str(tmp_path / names[0]), reference)
            except stages.StageFailed as err:
                failed.append((names, str(err)))
            continue
        result = rehearse(names[0], "--quick", *records, "--work", str(tmp_path / names[0]), config_dir=str(configs))
        train = rows(result.stdout).get("train")
        if result.returncode != 0 or not train or train[0] != "ok":
            failed.append((names, train or result.stdout[-1500:] + result.stderr[-1000:]))
    assert full and not failed, (full, failed)


def stopped_and_resumed(environ, work, monkeypatch):
    """(the plan, the run's reference) after the rehearsal's run and its stop and resume stages on 2 ranks of the
    config that `environ` holds, as the command runs them: its variables are set for the rest of the test, as under
    the command (the stages' commands inherit them). A stage that fails raises StageFailed with its line."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    shrunk = rehearsal.planned(config.load([], environ=environ), 2, str(work))
    _, reference = stages.train(shrunk, str(work))
    assert "bit-identical" in stages.stop_and_resume(shrunk, str(work), reference)
    return shrunk, reference


@pytest.mark.slow
def test_float32_nhwc_with_a_batch_schedule_from_the_first_epoch_trains_stops_and_resumes(monkeypatch, tmp_path):
    """Configs a rehearsal failed that work, in one: DTYPE=float32 with NHWC and a batch schedule (the schedule's way
    out of its float16 refusal; an open-division lever) that starts at 2 steps an update and changes at epoch 20, a
    val crop and 3 classes, the stages as the command runs them.
    - GPU review 4, F1: float32 NHWC died at the first BatchNorm on NVIDIA's MXNet, the fused kernels on for any
      dtype; the stand-in refuses as the fork does ("Fused ReLU activation is only supported with float16 NHWC
      Batchnorm"), so the train stage failed there.
    - Two steps an update from the first epoch end no update at step 1, so the run never prints "epoch 1 step 1/":
      the stop stage waited for that line until the run ended, then failed ("ended before").
    - Issue 42 item 5, the configs `check` passes that the shrink broke (7c8846a; WORKING's values): the schedule's
      epoch 20 left past the shrunk run's last, the val crop scaled below 32 px, 4 classes generated whatever
      NUM_CLASSES; the train stage failed on the first it met. The stop and resume crosses the schedule's change."""
    environ = sourced(os.path.join(ROOT, "config", "NF5688M6.sh"), DTYPE="float32", SUBMISSION_DIVISION="open",
                      **{**WORKING, "RN50_BATCH_SCHEDULE": "0:2,20:1"})
    shrunk, _ = stopped_and_resumed(environ, tmp_path, monkeypatch)
    assert "batch schedule 0:2,20:1 -> 0:2,1:1" in shrunk.shrunk[-1] and shrunk.flags["val_crop"] == 32, shrunk


@pytest.mark.parametrize("system, args, env, name", [
    ("NF5688M6", ["--ranks", "0"], {}, "--ranks=0"),
    ("NF5688M6", ["--ranks", "100000"], {}, "--ranks=100000"),
    ("CPU", ["--quick"], {}, "DEVICE=cpu: not a GPU config"),
    ("NF5688M6", ["--quick"], {"DTYPE": "float8"}, "DTYPE"),
    ("NF5688M6", ["--quick"], {"RN50_STANDIN_SM": "91"}, "RN50_STANDIN_SM=91: must be one of"),
    ("NF5688M6", ["--quick"], {"RN50_STANDIN_SM": "sm_90"}, "RN50_STANDIN_SM='sm_90': expected int"),
])
def test_bad_input_is_one_line(system, args, env, name):
    assert_one_line_naming(rehearse(system, *args, env=env, timeout=120), name)


def test_a_work_folder_it_cannot_own_is_one_line(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "run.log").write_text("someone's log\n")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    (tmp_path / "a file").write_text("")
    for work, words in (("used", "must be a new or empty folder"), ("link", "must be a new or empty folder"),
                        ("a file/sub", "cannot write there")):
        result = rehearse("NF5688M6", "--quick", "--work", repr(str(tmp_path / work)), timeout=120)
        assert_one_line_naming(result, words)
    assert (tmp_path / "used" / "run.log").read_text() == "someone's log\n"
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.slow
def test_sigterm_midway_leaves_no_process(tmp_path):
    """A stopped rehearsal ends its horovodrun and every rank (children.stop_on_sigterm)."""
    script = (f"set -euo pipefail; source config/NF5688M6.sh; exec {sys.executable} -m rn50_mx.rehearse --quick "
              f"--work {tmp_path / 'work'}")
    proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={"PATH": ENV_PATH, "HOME": "/tmp", **PYTHONPATH}, start_new_session=True)
    deadline = time.time() + 300
    while not any("rn50_mx.train" in " ".join(command) for command in descendants(proc.pid).values()):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.5)
    tree = list(descendants(proc.pid))
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert_all_end(tree, timeout=60)


# horovodrun's output of failed stages, shortened from real rehearsals of mutations (issue 32): the ranks' lines
# prefixed and interleaved, the first failure's consequences on its peer after it, horovodrun's own traceback last.
HOROVODRUN_TAIL = """Process 0 exit with status code 1.
Terminating remaining workers after failure of Process 0.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/horovod/runner/gloo_run.py", line 284, in launch_gloo
    raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be \
terminated. The first process to do so was:
Process name: 0
Exit code: 1
"""
SHUTDOWN = "MXNetError: Horovod has been shut down. This was caused by an exception on one of the ranks"
MIXED = ("mxnet.base.MXNetError: Operator preloaded_multi_sgd_mom_update require all inputs live on the same "
         "context: {cpu(1), cpu(2)}")
REFUSAL = "rn50_mx.standin.ngc.Refusal: Fused ReLU activation is only supported with float16 NHWC Batchnorm on Volta."
STALL = ("rn50_mx.train: stalled: rank 0 made no progress for 38.3 s in step at epoch 1 step 5 (bound 37.8 s): in a "
         "training step, or waiting for MXNet's engine to finish the steps the host issued, their allreduces included; "
         "the bound is the larger of the floor, 20 s (--stall-seconds, RN50_STALL_SECONDS), and 20 x the slowest "
         "recent interval (1.9 s); every thread's stack is above; the run stops (exit 79)")  # rank 1 stopped (SIGSTOP)
FAILED_STAGES = [
    (f"""[0]<stdout>:epoch 3: 3.9 img/s
[1]<stderr>:Traceback (most recent call last):
[1]<stderr>:  File "/repo/rn50_mx/train.py", line 269, in run
[0]<stderr>:Traceback (most recent call last):
[1]<stderr>:    return train_on(s, d, ctx, base_seed, seed, saver)
[0]<stderr>:  File "/repo/rn50_mx/checkpoint/folder.py", line 140, in attempt
[1]<stderr>:           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[1]<stderr>:    raise mx.MXNetError(f"Operator {{op_name}} require all inputs live on the same context: {{contexts}}")
[1]<stderr>:{MIXED}
[0]<stderr>:    raise get_last_ffi_error()
[0]<stderr>:mxnet.base.MXNetError: {SHUTDOWN}
{HOROVODRUN_TAIL}""", MIXED),
    (f"""[1]<stdout>:Error in CustomOp.forward: Traceback (most recent call last):
[1]<stdout>:  File "/repo/rn50_mx/standin/ngc.py", line 79, in refuse
[1]<stdout>:    raise Refusal(message)
[1]<stdout>:{REFUSAL}
[1]<stdout>:
[1]<stderr>:Traceback (most recent call last):
[1]<stderr>:  File "/venv/lib/python3.11/site-packages/mxnet/base.py", line 246, in check_call
[1]<stderr>:    raise get_last_ffi_error()
[1]<stderr>:mxnet.base.MXNetError: Fused ReLU activation is only supported with float16 NHWC Batchnorm on Volta.
{HOROVODRUN_TAIL}""", REFUSAL),
    (f"""[1]<stderr>:mxnet.base.MXNetError: Traceback (most recent call last):
[1]<stderr>:  File "../src/operator/custom/custom.cc", line 345
[1]<stderr>:MXNetError: Check failed: reinterpret_cast<CustomOpFBFunc>(...)
{HOROVODRUN_TAIL}""", "MXNetError: Check failed: reinterpret_cast<CustomOpFBFunc>(...)"),
    (f"""[0]<stderr>:rn50_mx.train: error: --save-model /w/resumed: cannot write (Horovod has been shut down.)
[1]<stderr>:Exception ignored in atexit callback: <function _notify_shutdown at 0x7fe74b742b60>
[1]<stderr>:Traceback (most recent call last):
[1]<stderr>:mxnet.base.MXNetError: {SHUTDOWN}
{HOROVODRUN_TAIL}""", "rn50_mx.train: error: --save-model /w/resumed: cannot write (Horovod has been shut down.)"),
    (f"""[0]<stdout>:  epoch 1 step 4/64: 3.3 img/s, lr 0.0879
[0]<stderr>:Thread 0x00007feabda8db80 (most recent call first):
[0]<stderr>:  File "/venv/lib/python3.11/site-packages/mxnet/ndarray/ndarray.py", line 2372 in wait_to_read
[0]<stderr>:  File "/repo/rn50_mx/train.py", line 75 in train_epoch
[0]<stderr>:{STALL}
{HOROVODRUN_TAIL.replace("code 1", "code 79").replace("Exit code: 1", "Exit code: 79")}""", STALL[:300]),
    (HOROVODRUN_TAIL, "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus "
                      "causing the job to be terminated. The first process to do so was:"),
]


@pytest.mark.parametrize("output, line", FAILED_STAGES)
def test_a_failed_stage_names_the_first_failure_a_rank_printed(output, line):
    """A stage's FAIL line is the exception that ended the first rank's traceback, or its one-line error, not what
    followed from it: its peer's Horovod shutdown or horovodrun's last words (which the rows printed for review 3's
    F1 and review 4's F1 and F3 before: 'RuntimeError: Horovod detected that one or more processes exited ...')."""
    assert stages.cause(output) == line


def test_a_child_that_prints_the_awaited_line_and_ends_at_once_is_waited_for(tmp_path):
    """wait(until=...) reads the whole output once the child has ended: a tiny run that prints the awaited progress
    line and then finishes between two looks was a false 'ended before' (the old loop left on the exit unread)."""
    out = tmp_path / "out"

    def child(script):
        with open(out, "w") as sink:
            return stages.children.start(["sh", "-c", script], stdout=sink)

    stages.wait(child("echo '  epoch 1 step 2/3: 4.5 img/s'"), out, until=r"epoch 1 step \d+/")
    with pytest.raises(stages.StageFailed, match=r"^ended \(exit 3\) before 'epoch 1 step \\\\d\+/': :::MLLOG"):
        stages.wait(child("echo ':::MLLOG {}'; exit 3"), out, until=r"epoch 1 step \d+/")


@pytest.mark.slow
def test_sigkill_midway_leaves_no_process_and_no_temporary_folder(tmp_path):
    """Issue 42, item 3: horovodrun and its ranks run in sessions of their own, so a SIGKILLed rehearsal left them
    training, writing into a temporary folder nothing removed. Its children now get SIGTERM from the kernel when it
    ends (PR_SET_PDEATHSIG), and a process waiting for its end removes the folder once they have gone."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    script = f"set -euo pipefail; source config/NF5688M6.sh; exec {sys.executable} -m rn50_mx.rehearse --quick"
    proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env={"PATH": ENV_PATH, "HOME": "/tmp", "TMPDIR": str(temp), **PYTHONPATH},
                            start_new_session=True)
    tree = {}
    try:
        deadline = time.time() + 300
        while not any("rn50_mx.train" in " ".join(command) for command in tree.values()):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.5)
            tree = descendants(proc.pid)
        assert os.listdir(temp), "the rehearsal's temporary folder"
        proc.kill()
        proc.wait()
        assert_all_end(tree, timeout=60)
        deadline = time.time() + 30
        while os.listdir(temp) and time.time() < deadline:
            time.sleep(0.5)
        assert os.listdir(temp) == []
    finally:
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_the_ranks_poll_horovod_at_the_rehearsal_s_cycle_whatever_the_config_exports():
    """A GPU config exports HOROVOD_CYCLE_TIME=0.1 (gpu_common.sh): stand-in ranks polling Gloo every 0.1 ms spent
    45% of a core each while idle, on the cores they compute on. horovodrun's --cycle-time-ms hands CYCLE_MS to its
    ranks over the variable (horovod/runner/common/util/config_parser.py, set_env_from_args)."""
    rank = "import os; print('cycle', os.environ['HOROVOD_CYCLE_TIME'])"
    result = subprocess.run([*stages.horovodrun(1), sys.executable, "-c", rank], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "HOROVOD_CYCLE_TIME": "0.1"})
    assert result.returncode == 0 and f"cycle {float(stages.CYCLE_MS)}\n" in result.stdout, \
        result.stdout + result.stderr


def test_horovodrun_is_this_python_s_horovod_wherever_its_scripts_went(tmp_path):
    """Issue 42, item 8: the rehearsal looked for horovodrun only beside sys.executable, which fails under Debian's
    python3 with pip's scripts in /usr/local/bin or under pip install --user. horovodrun is now this Python's Horovod,
    with no script looked up: a PATH without it (the system's alone) starts the ranks; a Python that has no Horovod
    is one line before any work."""
    launcher = stages.horovodrun(1)
    assert launcher[:2] == [sys.executable, "-c"] and launcher[3:] == ["--gloo", "-np", "1", "-H", "localhost:1",
                                                                       "--cycle-time-ms", str(stages.CYCLE_MS)]
    ran = subprocess.run([*launcher, sys.executable, "-c", "print('rank ran')"], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", **PYTHONPATH})
    assert ran.returncode == 0 and "rank ran" in ran.stdout, ran.stdout + ran.stderr
    # no Horovod: the module made unimportable, as Python documents it (sys.modules[name] = None)
    nowhere = f"import sys; sys.modules['horovod'] = None; sys.argv[1:] = ['--work', {str(tmp_path / 'work')!r}]; " \
              "from rn50_mx.errors import run_cli; from rn50_mx.rehearse import main; run_cli(main, 'rn50_mx.rehearse')"
    script = f"set -euo pipefail; source config/NF5688M6.sh; exec {sys.executable} -c \"$0\""
    result = subprocess.run(["bash", "-c", script, nowhere], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": ENV_PATH, "HOME": "/tmp", **PYTHONPATH})
    assert_one_line_naming(result, f"rn50_mx.rehearse: error: Horovod is not installed for {sys.executable}; ")
    assert not (tmp_path / "work").exists()

# Issue 42 item 5: configs `check` passes that the shrink broke (7c8846a): the batch schedule's epochs left where they
# were, the val crop scaled below 32 px, 4 classes generated whatever NUM_CLASSES. Open levers, NF5688M6 in float32
# (NVIDIA's NHWC float16 BatchNorm cannot add steps up: check refuses a batch schedule there).
WORKING = {"RN50_BATCH_SCHEDULE": "20:2", "RN50_VAL_CROP": "96", "NUM_CLASSES": "3"}


def nf5688m6(**env):
    return config.load([], environ=sourced(os.path.join(ROOT, "config", "NF5688M6.sh"), DTYPE="float32",
                                           SUBMISSION_DIVISION="open", **env))


@pytest.mark.parametrize("name", ["RN50_BATCH_SCHEDULE", "RN50_VAL_CROP"])
def test_a_config_check_passes_is_shrunk_to_settings_that_pass_it_too(name):
    s = nf5688m6(**{name: WORKING[name]})
    shrunk = s.replace(**plan.shrink(s, 2, {"train": "t.rec", "val": "v.rec"}).flags)
    config.validate(shrunk)  # 7c8846a: "epoch 20 is past the run's last epoch", "--val-crop=27: must be 0 or 32 ..."
    assert (shrunk.batch_schedule, shrunk.val_crop) == ("1:2" if s.batch_schedule else "", 32 if s.val_crop else 0)


def test_the_generated_records_hold_the_config_s_classes(tmp_path):
    """NUM_CLASSES=3: labels 0..2 only (7c8846a made 4 classes, and the run failed on "label 3")."""
    from rn50_mx import prep_rec
    data = plan.generated_records(str(tmp_path), num_classes=3)
    for split, images in (("train", plan.TRAIN_IMAGES), ("val", plan.VAL_IMAGES)):
        summary = prep_rec.verify(data[split][:-4], num_classes=3)
        assert summary.problems == () and summary.classes == 3 and summary.images >= images, summary


def test_a_shrink_the_plan_cannot_make_is_said_as_its_limit(monkeypatch):
    """A shrunk side the progressive ramp's 16 px step does not divide (a plan of 40 px): the plan's limit, in one
    line, not a stage failing as if the config did (7c8846a handed the settings to the run unchecked)."""
    monkeypatch.setattr(plan, "SIDE", 40)
    s = nf5688m6(RN50_PROG_START_SIDE="128", RN50_PROG_END_EPOCH="10")
    with pytest.raises(plan.Limit, match=r"^the rehearsal cannot shrink this config \(--prog-step=16: must divide .*"
                                         r"\): a limit of its plan \(rn50_mx/rehearse/plan\.py\), not a fault"):
        plan.shrink(s, 2, {"train": "t.rec", "val": "v.rec"})


def test_generated_images_on_a_full_disk_are_one_line(tmp_path):
    """Issue 42 item 11: 7c8846a gave an OSError traceback."""
    with mounted(tmp_path / "full", "size=16k") as full:
        result = rehearse("NF5688M6", "--quick", "--work", full + "/work", timeout=120)
    assert_one_line_naming(result, f"{full}/work/data/jpegs: cannot write the rehearsal's generated images (No space "
                                   "left on device)")


def test_a_cpu_config_is_refused_before_its_work_folder_is_made(tmp_path):
    assert_one_line_naming(rehearse("CPU", "--quick", "--work", str(tmp_path / "work"), timeout=120), "DEVICE=cpu")
    assert not (tmp_path / "work").exists()  # 7c8846a made it first


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """--data-train and --data-val of records generated once for the rehearsals below (plan.generated_records: 4
    classes, as a rehearsal generates them for itself)."""
    data = plan.generated_records(str(tmp_path_factory.mktemp("records")))
    return ["--data-train", data["train"], "--data-val", data["val"]]


def quick(tmp_path, records, env):
    """NF5688M6 rehearsed --quick on one rank, on the shared records, with `env` exported after the config: the train
    stage alone, the cheapest rehearsal that runs a config's path."""
    return rehearse("NF5688M6", "--quick", "--ranks", "1", *records, "--work", str(tmp_path / "_".join(env.values())),
                    env=env)


@pytest.mark.slow
def test_a_volta_rehearses_to_one_line_naming_rn50_normconv_0_and_passes_with_it_set(records, tmp_path):
    """GPU review 6, F1: NF5688M6 as SM 70 (a V100), whose NormConv kernels refuse the 1x1 stride-2 projection
    shortcut (sneaxiy/NVIDIA-MxNet@ce30b18 cudnn_normalized_convolution-inl.h:449-452): the train stage fails at the
    build's probe with the run's one line naming RN50_NORMCONV=0, no traceback; with RN50_NORMCONV=0 the run passes.
    On f3422b2 the rehearsal as SM 70 passed (the probe ran a stride-1 unit, the stand-in took the stride 2), and a
    V100 would have died at the warm-up's first forward with MXNet's traceback."""
    refused = quick(tmp_path, records, {"RN50_STANDIN_SM": "70"})
    status, detail = rows(refused.stdout)["train"]
    assert refused.returncode == 1 and status == "FAIL", refused.stdout[-3000:] + refused.stderr[-2000:]
    assert detail == ("exit 1: rn50_mx.train: error: NVIDIA's NormConv kernels do not run on this GPU (Only "
                      "cudnn-based NormalizedConvolution supported.): set RN50_NORMCONV=0"), detail
    assert "Traceback" not in refused.stdout + refused.stderr
    passed = quick(tmp_path, records, {"RN50_STANDIN_SM": "70", "RN50_NORMCONV": "0"})
    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-2000:]
    assert rows(passed.stdout)["train"][0] == "ok"


@pytest.mark.slow
def test_nvidias_mainloop_wiring_rehearses(records, tmp_path):
    """Issue 47 item 5: NF5688M6 with NVIDIA's 24.04 NormConv wiring (RN50_NORMCONV_WIRING=mainloop-fl) rehearses as
    an H100: the run's build and probe, warm-up, training with NormConvolution applying the statistics, evals,
    run_stop, the model saved. As an A100 too: a run's stand-in reads the compute capability only to refuse Volta's
    stride-2 NormConv and the GPUs NORMCONV_SM does not list (rn50_mx/standin/ngc.py), so sm 80 runs what sm 90 does
    (test_an_a100_and_an_h100_take_the_same_stand_in_decisions pins it); the A100's own rehearsal was dropped for
    make test's time (issue 50)."""
    result = quick(tmp_path, records, {"RN50_STANDIN_SM": "90", "RN50_NORMCONV_WIRING": "mainloop-fl"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    table = rows(result.stdout)
    assert table["train"][0] == "ok" and "NormConv mainloop-fl; stand-in GPU sm_90" in table["config"][1], table


def test_an_a100_and_an_h100_take_the_same_stand_in_decisions():
    """What lets the H100 rehearsal above stand for the A100's: every place a run's stand-in reads the compute
    capability treats 80 and 90 alike (both in NORMCONV_SM, neither Volta's 70), and the network's build reads it
    only as "a GPU is stood in for"."""
    from rn50_mx.standin import ngc
    reads = [line.strip() for line in inspect.getsource(ngc).splitlines() if 'GPU["sm"]' in line]
    assert {80, 90} <= set(ngc.NORMCONV_SM) and reads == [
        'kernels = ((3, 3),) if GPU["sm"] == 70 and p["stride"] != (1, 1) else ((3, 3), (1, 1))',
        'and p["num_filter"] % 32 == 0 and x.dtype == np.float16 and GPU["sm"] in NORMCONV_SM)',
        'or GPU["sm"] not in NORMCONV_SM):', 'GPU["sm"] = sm'], reads


def test_the_resume_check_compares_bits_so_a_nan_both_runs_reached_is_the_same(tmp_path):
    """A shrunk run can overflow (at 32 px the open configs' BatchNorm running variances reached inf and their weight
    EMA NaN, in the uninterrupted and the resumed run alike): np.array_equal called those runs different and the
    stage failed on a resume that was exact. Bits decide: the same NaN is the same, 0.0 against -0.0 is not, and a
    dtype or a value apart is named."""
    import mxnet as mx
    import numpy as np

    def saved(name, **arrays):
        mx.nd.save(str(tmp_path / f"{name}-0000.params"), {k: mx.nd.array(v, dtype=v.dtype) for k, v in arrays.items()})
        return str(tmp_path / name)

    var, w = np.array([np.nan, np.inf, 1.5], np.float32), np.array([0.0, 2.0], np.float32)
    reference = saved("ref", **{"aux:bn_running_var": var, "arg:w": w})
    assert stages.different_params(saved("same", **{"aux:bn_running_var": var.copy(), "arg:w": w}), reference) is None
    for name, changed in (("signed", {"arg:w": np.array([-0.0, 2.0], np.float32)}),
                          ("value", {"arg:w": np.array([0.0, 2.5], np.float32)}),
                          ("dtype", {"arg:w": w.astype(np.float16)})):
        assert stages.different_params(saved(name, **{"aux:bn_running_var": var, **changed}), reference) == "arg:w"
    assert stages.different_params(saved("fewer", **{"arg:w": w}), reference) == "parameter list"
