"""The launchers' trials: run_with_docker.sh and run.sub hand the container the reference's flags, distinct seeds and
the settings exported by hand (recorded: a GPU config's flags cannot run here; tests/test_container.py runs the
CPU config's trials in real containers); a missing data file stops a launch before any trial; two ranks start through
horovodrun; SIGTERM stops every rank. The trial-outcome contract: two launches with one DATESTAMP, a LOGDIR that
fills, a resumable stop (exit 75) and the next launch's resume, a resume state read as data, a rank hanging at exit,
an outcome's exit code without its MLPerf line, a stalled trial (named, and requeued under run.sub), SIGTERM with a
checkpoint folder, Slurm's SIGUSR1. Each signal at each stage of a launch is in tests/test_launch_hostile.py."""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from tests.support.bad_values import shown
from tests.support.bfloat16 import HOROVOD_FALLBACK
from tests.support.mllog import mllog
from tests.support.procs import (ENV_PATH, PYTHONPATH, ROOT, assert_all_end, assert_one_line_naming, descendants,
                                 files_in, launcher, mounted, run, sigterm_to, sourced)
from tests.support.settings import HOROVOD, TINY, TINY_KEEP_CACHES


# What the fakes answer: the image's ID to `docker image inspect`, and a trial's run_stop success line.
IMAGE_ID = "sha256:" + "5e" * 32
RUN_STOP = (':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "INTERVAL_END", "key": "run_stop", "value": null, '
            '"metadata": {"status": "success"}}')


def recording_tools(tmp_path, *names, run=False):
    """A PATH with fake `names` that append their command line (and SEED, CACHE_CLEARED) to tmp_path/calls.
    `--env-names` is answered by the installed rn50_mx, as the image would, `docker image inspect` with IMAGE_ID, and
    a trial with its run_stop success line. With `run`, a fake also runs its command here, after its leading
    --options (srun without a container)."""
    bin_dir = tmp_path / "fakes"
    bin_dir.mkdir()
    env_names = "python -m rn50_mx.check --env-names"
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $* SEED=$SEED CACHE_CLEARED=$CACHE_CLEARED" >> "{tmp_path}/calls"\n'
                        f'case "$*" in *" {env_names}") exec {env_names};; "image inspect "*) echo {IMAGE_ID};;\n'
                        + ('esac\nwhile [ "$1" != "${1#--}" ]; do shift; done\nexec "$@"\n' if run else
                           f"*run_and_time.sh) echo '{RUN_STOP}';; esac\n"))
        tool.chmod(0o755)
    return str(bin_dir) + os.pathsep + ENV_PATH


def calls(tmp_path):
    """The recorded command lines (an argument may span lines), but the launcher's look at the engine and the image
    (`docker version`, `docker image inspect`) and the watcher's look for containers left (`docker ps`)."""
    lines = re.split(r"\n(?=docker |srun )", (tmp_path / "calls").read_text().strip())
    return [line for line in lines if not line.startswith(("docker version ", "docker image inspect ", "docker ps "))]


def empty_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (data / name).touch()
    return str(data)


def test_container_trials_get_the_reference_docker_flags_and_distinct_seeds(tmp_path):
    data, logs = empty_data(tmp_path), tmp_path / "logs"
    env = {"CONT": "rn50-mx", "DATADIR": data, "LOGDIR": str(logs), "NEXP": "2", "DATESTAMP": "s",
           "CLEAR_CACHES": "0", "PATH": recording_tools(tmp_path, "docker")}
    result = sourced("NF5688M6", "./run_with_docker.sh", env)
    assert result.returncode == 0, result.stderr
    # every container carries the launch's label (the launch's watcher finds them by it) and the user's other groups
    [label] = {re.search(r" --label rn50-mx\.launch=rn50-mx-\d+-\d+ ", call).group(0) for call in calls(tmp_path)}
    groups = "".join(f" --group-add {gid}" for gid in os.getgroups() if gid != os.getgid())
    names, check, trial1, trial2, summary = [call.replace(label, " ").replace(groups, "") for call in calls(tmp_path)]
    docker_run = f"docker run --rm --init --pull never --user {os.getuid()}:{os.getgid()} --env HOME=/tmp --gpus all --net=host " \
                 "--uts=host --ipc=host "
    assert names.startswith(f"{docker_run}--security-opt seccomp=unconfined --ulimit stack=67108864 "
                            f"--ulimit memlock=-1 -v {data}:/data -v {logs}:/results {IMAGE_ID} python -m "
                            "rn50_mx.check --env-names ")
    assert "no --gpus all" not in result.stdout
    for call in (check, trial1, trial2, summary):
        assert call.startswith(docker_run)
        for part in (f"-v {data}:/data", f"-v {logs}:/results", "--env BATCHSIZE", "--env DALI_THREADS",
                     "--env NCCL_BUFFSIZE", "--env SEED", "--env CACHE_CLEARED", "--env DATADIR=/data"):
            assert f" {part} " in call
    # every container runs the image CONT named when the launch began, by its ID, and never pulls one
    assert f" {IMAGE_ID} python -m rn50_mx.check --data-train /data/train.rec --data-val /data/val.rec " in check
    assert f" {IMAGE_ID} ./run_and_time.sh " in trial1 and " CACHE_CLEARED=0" in trial1
    assert trial1.split("SEED=")[1] != trial2.split("SEED=")[1]
    assert f" {IMAGE_ID} python -m rn50_mx.timing /results/s_1.log /results/s_2.log " in summary
    assert (logs / "s_2.log").read_text().startswith(f"Beginning trial 2 of 2\nImage: {IMAGE_ID} (CONT=rn50-mx)\n"
                                                     "Not clearing the page cache")


def test_container_gets_settings_exported_by_hand_that_rn50_mx_reads(tmp_path):
    """config/CPU.sh sets none of END_LR, DALI_FOO and RN50_BAR (names only the owned prefixes DALI_*, RN50_*
    cover): all are handed on, so the container uses or refuses them as this machine would; a variable rn50_mx
    ignores is not, and neither is a path on this machine (the container's data and log paths differ)."""
    env = {"CONT": "rn50-mx", "DATADIR": empty_data(tmp_path), "LOGDIR": str(tmp_path / "logs"), "NEXP": "1",
           "END_LR": "0.001", "DALI_FOO": "1", "RN50_BAR": "1", "UNRELATED": "1", "MLLOG_FILE": "/host/x.log",
           "CLEAR_CACHES": "0", "PATH": recording_tools(tmp_path, "docker")}
    result = sourced("CPU", "./run_with_docker.sh", env)
    assert result.returncode == 0, result.stderr
    _, check, trial, _ = calls(tmp_path)
    for call in (check, trial):
        for name in ("END_LR", "DALI_FOO", "RN50_BAR", "DALI_THREADS", "FMNIST_ARGS"):
            assert f" --env {name} " in call
        for name in ("UNRELATED", "PATH", "HOME", "MLLOG_FILE"):
            assert f"--env {name} " not in call


def test_slurm_job_runs_one_task_per_gpu_in_the_container(tmp_path):
    data, logs = empty_data(tmp_path), tmp_path / "logs"
    env = {"CONT": "rn50-mx", "DATADIR": data, "LOGDIR": str(logs), "NEXP": "1", "DATESTAMP": "s", "SEED": "5",
           "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "8", "SLURM_SUBMIT_DIR": ROOT,
           "PATH": recording_tools(tmp_path, "srun")}
    result = sourced("DGXA100_multi_8x8x204", "bash run.sub", env)
    assert result.returncode == 0, result.stderr
    check, drop, trial, summary = calls(tmp_path)
    image = f"--container-image=rn50-mx --container-name=rn50-mx --container-workdir=/workspace/rn50 " \
            f"--container-mounts={data}:/data,{logs}:/results --export=ALL,DATADIR=/data"
    assert check.startswith(f"srun --nodes=1 --ntasks=1 {image} python -m rn50_mx.check "
                            "--data-train /data/train.rec --data-val /data/val.rec ")
    assert drop.startswith("srun --ntasks-per-node=1 bash -c ")
    assert trial.startswith(f"srun --ntasks-per-node=8 --mpi=pmix {image} bash ./run_and_time.sh SEED=5 ")
    assert summary.startswith(f"srun --nodes=1 --ntasks=1 {image} python -m rn50_mx.timing /results/s_1.log")
    assert (logs / "s_1.log").read_text().startswith("Beginning trial 1 of 1\n")


def test_slurm_job_refuses_a_node_count_other_than_the_configs(tmp_path):
    env = {"DATADIR": str(tmp_path), "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2",
           "PATH": recording_tools(tmp_path, "srun")}
    result = sourced("DGXA100_multi_8x8x204", "bash run.sub", env)
    assert result.returncode == 2 and "DGXNNODES=8" in result.stderr and not (tmp_path / "calls").exists()


@pytest.fixture
def tiny_data_without_val_idx(tiny_data):
    os.remove(os.path.join(tiny_data, "val.idx"))
    return tiny_data


def assert_stopped_on_missing_val_idx(result, data, logs):
    assert_one_line_naming(result, os.path.join(data, "val.idx"))
    assert result.returncode == 2 and "python -m rn50_mx.prep_rec pack" in result.stderr
    assert "Beginning trial" not in result.stdout and not os.listdir(logs)


def test_missing_data_file_stops_run_with_docker_before_any_trial(tiny_data_without_val_idx, tmp_path):
    data, logs = tiny_data_without_val_idx, tmp_path / "logs"
    result = sourced("CPU", "./run_with_docker.sh", {"DATADIR": data, "LOGDIR": str(logs), "CLEAR_CACHES": "0"})
    assert_stopped_on_missing_val_idx(result, data, logs)


def test_missing_data_file_stops_the_slurm_job_before_any_trial(tiny_data_without_val_idx, tmp_path):
    """No CONT: the fake srun runs the check on this machine, as on a node."""
    data, logs = tiny_data_without_val_idx, tmp_path / "logs"
    env = {"DATADIR": data, "LOGDIR": str(logs), "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "8",
           "SLURM_SUBMIT_DIR": ROOT, "PATH": recording_tools(tmp_path, "srun", run=True)}
    result = sourced("DGXA100_multi_8x8x204", "bash run.sub", env)
    assert_stopped_on_missing_val_idx(result, data, logs)
    [check] = calls(tmp_path)
    assert check.startswith(f"srun --nodes=1 --ntasks=1 python -m rn50_mx.check "
                            f"--data-train {data}/train.rec --data-val {data}/val.rec ")


CPU_WITHOUT_BFLOAT16 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n\n"


@pytest.mark.slow
def test_make_demos_config_trains_in_float32_on_a_cpu_without_bfloat16_saying_so(tiny_data, tmp_path):
    """config/CPU.sh asks for bfloat16; on a CPU without the instructions (here a /proc/cpuinfo without them,
    bind-mounted in a mount namespace of its own) its trial runs in float32 and its log says why in one line."""
    cpuinfo, logs = tmp_path / "cpuinfo", tmp_path / "logs"
    cpuinfo.write_text(CPU_WITHOUT_BFLOAT16)
    if run(["unshare", "-m", "true"], {}).returncode:
        pytest.skip("needs root to bind-mount a /proc/cpuinfo in a mount namespace")
    env = {**TINY_KEEP_CACHES, "DATADIR": tiny_data, "LOGDIR": str(logs), "NEXP": "1", "SEED": "7", "DATESTAMP": "t"}
    exports = "".join(f"export {name}={value!r}; " for name, value in env.items())
    script = f"mount --bind {cpuinfo} /proc/cpuinfo && set -euo pipefail; source config/CPU.sh; {exports}" \
             "exec ./run_with_docker.sh"
    result = run(["unshare", "-m", "--propagation", "private", "bash", "-c", script], {}, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    says = "DTYPE=bfloat16: this CPU has neither avx512_bf16 nor amx_bf16 (/proc/cpuinfo): training in float32 " \
           "(RN50_BFLOAT16_FALLBACK=1)"
    assert result.stderr.splitlines() == [says]  # the launcher's check, before the trial
    text = (logs / "t_1.log").read_text()
    assert re.search(r"^--dtype +float32 +RN50_BFLOAT16_FALLBACK$", text, re.M)  # the trial's settings listing
    assert text.count(says) == 2  # its check and its training process each said it
    assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", text, re.M)


@pytest.mark.slow
def test_two_ranks_start_through_horovodrun_and_log_parseable_lines(tiny_data, tmp_path):
    env = {**TINY, "DGXNGPU": "2", **HOROVOD, "DATADIR": tiny_data, "CLEAR_CACHES": "0"}
    result = sourced("CPU", "./run_and_time.sh", env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = tmp_path / "run.log"
    log.write_text(result.stdout)
    assert len(mllog(log, "init_start")) == 2  # every rank logs init_start, as the reference
    assert mllog(log, "global_batch_size") == [8]
    assert len(mllog(log, "run_stop")) == 1
    assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", result.stdout, re.M)
    # config/CPU.sh's bfloat16 falls back to float32 under Horovod, which allreduces no bfloat16: each process says so
    assert re.search(r"^--dtype +float32 +RN50_BFLOAT16_FALLBACK$", result.stdout, re.M)
    assert (result.stdout + result.stderr).count(HOROVOD_FALLBACK) == 3, result.stderr[-3000:]  # the check, 2 ranks


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_sigterm_on_run_and_time_stops_every_rank(tiny_data, tmp_path, ranks):
    """A `kill` of the launcher script reaches training (through horovodrun with 2 ranks): nothing is left."""
    env = {**TINY, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DGXNGPU": str(ranks), **HOROVOD, "DATADIR": tiny_data}
    exports = "".join(f"export {name}={value!r}; " for name, value in env.items())
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        proc = subprocess.Popen(["bash", "-c", f"source config/CPU.sh; {exports}exec ./run_and_time.sh"],
                                env={"PATH": ENV_PATH, "HOME": os.environ.get("HOME", "/tmp")}, cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT)
    procs = []
    try:
        deadline = time.time() + 300
        while '"key": "epoch_start"' not in out.read_text():  # training has started
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            time.sleep(0.5)
        procs = descendants(proc.pid)
        assert sum("rn50_mx.train" in " ".join(command) for command in procs.values()) >= ranks, procs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        assert_all_end(procs, timeout=60)
        assert "RESULT," not in out.read_text()
    finally:  # whatever the outcome, nothing this test started keeps running
        for p in [*procs, psutil.Process(proc.pid)] if proc.poll() is None else procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def test_two_launches_with_one_datestamp_and_an_existing_log(shared, tmp_path):
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path), "DATESTAMP": "same"}
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
        env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": logs, "NEXP": "2", "DATESTAMP": "t"}
        result = run(*launcher("./run_with_docker.sh", env), timeout=300)
        assert result.returncode == 1, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-2:] == [
            f"run_with_docker.sh: trial 1 of 2: its log is incomplete (tee: {logs}/t_1.log: No space left on device)",
            "run_with_docker.sh: no further trial runs: its log would be lost too"], result.stderr[-2000:]
        assert "Beginning trial 2" not in result.stdout and "RESULT," in result.stdout  # trial 1 ran to its end


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

# A training whose output holds a stray `diverged` line (another process's, on the same stream) and then run_stop
# success: run_stop is the verdict.
STRAY_DIVERGED = """import sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    import os
    for key, meta in (("run_start", "{}"), ("diverged", '{"epoch_num": 1, "step": "x"}'),
                      ("run_stop", '{"status": "success"}')):
        print(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "%s", "value": "stray", '
              '"metadata": %s}' % (key, meta), flush=True)
    os._exit(0)
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


def test_a_stray_diverged_line_before_run_stop_success_is_a_success(shared, tmp_path):
    """run_and_time.sh reads the run's outcome from its output: a `diverged` line there that training did not end
    with run_stop aborted does not make a run that stopped with success exit 78. The old code exited 78 saying
    "the loss diverged (\"stray\") ... (run_stop aborted)"."""
    command, _ = launcher("./run_and_time.sh", {**TINY_KEEP_CACHES, "DATADIR": shared["data"]})
    result = run(command, site(tmp_path, STRAY_DIVERGED))
    assert result.returncode == 0 and "RESULT," in result.stdout, (result.stdout[-1500:], result.stderr[-1500:])
    assert "diverged" not in result.stderr, result.stderr[-1500:]


# A training that exits with an outcome's code without its line (a stand-in, planted through PYTHONPATH, for a training
# that fails on its way out with that code: the outcome-reading part alone is under test).
EXITS_WITHOUT_ITS_LINE = """import sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    import os
    print(f"seed {{os.environ.get('SEED')}}", flush=True)
    os._exit({code})
"""

# The progress watchdog's side of the stall contract (issue 48; rn50_mx/exit_codes.sh STALLED_EXIT), as a stand-in
# planted through PYTHONPATH: the log gets `stalled` then run_stop aborted, and training exits 79.
STALLS = """import sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    import os
    print(f"seed {os.environ['SEED']}")
    for key, value, meta in (("run_start", "null", "{}"), ("stalled", '"rank 0 made no progress for 60 s"', "{}"),
                             ("run_stop", "null", '{"status": "aborted"}')):
        print(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "%s", "value": %s, '
              '"metadata": %s}' % (key, value, meta), flush=True)
    os._exit(79)
"""


@pytest.mark.parametrize("code, line", [(75, "resumable_stop"), (78, "diverged"), (79, "stalled")])
def test_an_outcomes_exit_code_without_its_line_is_a_failed_run(shared, tmp_path, code, line):
    """run_and_time.sh passed a training's 75, 78 or 79 on when its log held no resumable_stop, diverged or stalled
    line, and the trial loop took it for that outcome (75: a .resume state written and, under run.sub, the job
    requeued). Now it is a failed run, exit 1, saying the code and that no run_stop came."""
    command, _ = launcher("./run_and_time.sh", {**TINY_KEEP_CACHES, "DATADIR": shared["data"]})
    result = run(command, site(tmp_path, EXITS_WITHOUT_ITS_LINE.format(code=code)))
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"run_and_time.sh: training failed (exit code {code}; run_stop missing)"), result.stderr[-2000:]
    assert "RESULT," not in result.stdout


@pytest.mark.parametrize("code, prints, says", [
    (75, "", "exit status 75, but its log ({log}) has no resumable_stop line: a failed trial"),
    (0, "Usage:  docker [OPTIONS] COMMAND", "exit status 0, but its log ({log}) has no run_stop success line: a "
                                            "failed trial"),
])
def test_a_trials_exit_status_is_its_outcome_only_with_its_line(tmp_path, code, prints, says):
    """What a trial's command exits with is read with the trial's log: a container that exits 75 without a
    resumable_stop line left a .resume state (a requeue under run.sub); one that printed docker's usage text and exited
    0 (the old CONT=--help) was a success. Each is a failed trial now, with one line, and no state is left."""
    data, logs = empty_data(tmp_path), tmp_path / "logs"
    path = recording_tools(tmp_path, "docker")
    fake = tmp_path / "fakes" / "docker"
    fake.write_text(fake.read_text().replace(f"echo '{RUN_STOP}'", f"echo '{prints}'; exit {code}"))
    env = {"CONT": "rn50-mx", "DATADIR": data, "LOGDIR": str(logs), "NEXP": "1", "DATESTAMP": "s",
           "CLEAR_CACHES": "0", "PATH": path}
    result = sourced("CPU", "./run_with_docker.sh", env)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        "run_with_docker.sh: trial 1 of 1: " + says.format(log=logs / "s_1.log"),
        "run_with_docker.sh: trial(s) 1 of 1 failed"]
    assert files_in(logs) == ["s_1.log"]


def test_a_stalled_trial_is_named_in_the_summary(shared, tmp_path):
    """A training that stalled (exit 79 with its `stalled` line) ends run_and_time.sh with 79 and a line saying so;
    the trial loop counts it failed and its summary names it stalled; the next trial runs."""
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "2",
           "DATESTAMP": "t"}
    result = run(launcher("./run_with_docker.sh", env)[0], site(tmp_path, STALLS))
    assert result.returncode == 1, result.stderr[-2000:]
    assert ('run_and_time.sh: training stalled ("rank 0 made no progress for 60 s"): a rank made no progress; '
            "training stopped there (run_stop aborted)") in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "run_with_docker.sh: trial(s) 1 2 of 2 failed; 1 2 stalled (each log says which rank made no progress, and "
        "since when)")
    assert files_in(tmp_path / "logs") == ["t_1.log", "t_2.log"]


def test_a_stalled_trial_with_a_checkpoint_is_requeued_by_the_slurm_job(shared, stopped_checkpoints, tmp_path):
    """run.sub requeues a stalled trial as it requeues a resumable stop when its checkpoint folder holds a checkpoint
    (python -m rn50_mx.check --resume says so): DATESTAMP.resume is left, `scontrol requeue` called, exit 75. The
    fake srun runs each command here (no CONT); the training is the stand-in STALLS."""
    logs = tmp_path / "logs"
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(logs), "NEXP": "1", "DATESTAMP": "j",
           "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": ROOT,
           "RN50_CHECKPOINT_DIR": str(shutil.copytree(stopped_checkpoints, tmp_path / "ckpt")),
           "PATH": recording_tools(tmp_path, "srun", run=True)}
    scontrol = tmp_path / "fakes" / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "scontrol $*" >> "{tmp_path}/calls"\n')
    scontrol.chmod(0o755)
    result = run(launcher("bash run.sub", env)[0], site(tmp_path, STALLS), timeout=300)
    assert result.returncode == 75, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-2:] == [
        "run.sub: trial 1 of 1: stalled; its checkpoint folder holds a checkpoint to resume; no further trial runs",
        "run.sub: requeued job 1: it resumes from the checkpoint"]
    assert (tmp_path / "calls").read_text().endswith("\nscontrol requeue 1\n")
    assert files_in(logs) == ["j.resume", "j_1.log"]


def test_a_resumable_stop_ends_the_trials_with_75(shared, tmp_path):
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "3", "DATESTAMP": "r"}
    command, _ = launcher("./run_with_docker.sh", env)
    result = run(command, site(tmp_path, RESUMABLE))
    assert result.returncode == 75, result.stderr[-2000:]
    assert "run_and_time.sh: stopped, resumable (checkpoint \"/ckpt/epoch_1\")" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "run_with_docker.sh: trial 1 of 3: stopped, resumable; no further trial runs")
    assert files_in(tmp_path / "logs") == ["r.resume", "r_1.log"]
    assert "RESULT," not in result.stdout


def test_the_next_launch_resumes_the_stopped_trial_in_its_log(shared, stopped_checkpoints, tmp_path):
    """A launch with the DATESTAMP of one whose trial 1 stopped resumable (r.resume: run.sub's requeued job) runs
    trial 1 again with its seed (the checkpoint's), appending to r_1.log on a line of its own though the stopped
    trial's last line was cut, and a launch that stopped before the trial leaves it to resume; the old code refused
    the DATESTAMP (its logs exist)."""
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "1", "DATESTAMP": "r",
           "RN50_CHECKPOINT_DIR": str(shutil.copytree(stopped_checkpoints, tmp_path / "ckpt"))}  # one trial per folder
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
    assert text.startswith(stopped + "\nResuming trial 1 of 1\n"), text[len(stopped) - 200:]
    seeds = re.findall(r"^seed (\d+)$", text, re.M)
    assert len(seeds) == 2 and seeds[0] == seeds[1], seeds


@pytest.mark.parametrize("folder, says", [
    (None, "{logs}/r.resume: its trial resumes from RN50_CHECKPOINT_DIR, which is not set (restore it, or remove "
     "{logs}/r.resume to start the trials anew)"),
    ("empty", "RN50_CHECKPOINT_DIR={tmp}/empty: no checkpoint to resume the trial {logs}/r.resume names"),
    ("missing", "RN50_CHECKPOINT_DIR={tmp}/missing: no checkpoint to resume the trial"),
    ("ended", "--checkpoint-dir {tmp}/ended: the run there has ended (run_stop success)"),
])
def test_a_launch_resumes_only_with_the_checkpoint_there(shared, stopped_checkpoints, tmp_path, folder, says):
    """Issue 28 item 3: a relaunch without the checkpoint folder said "Resuming trial 1", ran a fresh training appended
    to the stopped trial's log and deleted the state, so the real checkpoint was never resumed. Now one line before
    any trial; the state and the log are kept."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "r.resume").write_text("resume_trial=1\nresume_seed=7\nused_seeds=7\nfailed=\n")
    (logs / "r_1.log").write_text("the stopped trial\n")
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(logs), "NEXP": "1", "DATESTAMP": "r"}
    if folder == "empty":
        (tmp_path / folder).mkdir()
    elif folder == "ended":
        shutil.copytree(stopped_checkpoints, tmp_path / folder)
        (tmp_path / folder / "finished").write_text("run_stop success\n")
    if folder:
        env["RN50_CHECKPOINT_DIR"] = str(tmp_path / folder)
    command, _ = launcher("./run_with_docker.sh", env)
    result = run(command, site(tmp_path, RESUMABLE))
    assert result.returncode == 2, result.stderr[-2000:]
    assert_one_line_naming(result, says.format(logs=logs, tmp=tmp_path))
    assert "Resuming" not in result.stdout and "Beginning" not in result.stdout
    assert files_in(logs) == ["r.resume", "r_1.log"] and (logs / "r_1.log").read_text() == "the stopped trial\n"


@pytest.mark.parametrize("state, says", [
    ("resume_trial=1\nresume_seed=7\ntouch {marker}\n", "line 3 is not the launcher's state (touch\\ "),
    ("resume_trial=$(touch {marker})\n", "line 1 is not the launcher's state (resume_trial=\\$\\(touch\\ "),
    ("resume_trial=1\nresume_seed=7\nused_seeds=7; touch {marker}\nfailed=\n", "line 3 is not the launcher's state"),
    ("resume_trial=9\nresume_seed=7\nused_seeds=7\nfailed=\n", "resumes trial 9, not one of NEXP=3"),
    ("resume_trial=1\r\nresume_seed=7\r\n", "line 1 is not the launcher's state ($'resume_trial=1\\r'); remove"),
])
def test_the_resume_state_is_read_as_data_never_run(shared, tmp_path, state, says):
    """LOGDIR/DATESTAMP.resume (a results folder, often shared and mounted into the container) was `source`d by the
    launcher: text planted in it ran on the host. It is read as the four lines of numbers the launcher writes; any
    other line, or a trial above NEXP, is one line and no trial runs."""
    marker = tmp_path / "ran"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "r.resume").write_text(state.format(marker=marker))
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "3", "DATESTAMP": "r"}
    command, _ = launcher("./run_with_docker.sh", env)
    result = run(command, site(tmp_path, RESUMABLE))
    assert result.returncode == 2 and not marker.exists()
    assert_one_line_naming(result, f"run_with_docker.sh: {tmp_path}/logs/r.resume: {says}")
    assert files_in(tmp_path / "logs") == ["r.resume"]


@pytest.mark.slow
def test_run_stop_success_is_success_when_a_rank_hangs_at_exit(shared, tmp_path):
    """Two ranks under horovodrun (MPI, as Horovod is built here and in the image); rank 1 hangs after run_stop and
    its alarm ends it: horovodrun exits non-zero, the trial succeeded."""
    env = {**TINY_KEEP_CACHES, "DGXNGPU": "2", **HOROVOD, "DATADIR": shared["data"], "RN50_EXIT_TIMEOUT": "2"}
    command, _ = launcher("./run_and_time.sh", env)
    result = run(command, site(tmp_path, HANGS_AT_EXIT), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "after run_stop success (a process hung on its way out" in result.stderr
    assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", result.stdout, re.M)


def sigterm_to_run_with_docker(env, out, ready):
    """sigterm_to() on run_with_docker.sh (`env` after config/CPU.sh), which must exit 143; its output."""
    status, text = sigterm_to(launcher("./run_with_docker.sh", env)[0], out, ready)
    assert status == 143, text[-3000:]
    return text


def runs(procs, module):
    return any(module in " ".join(p.cmdline()) for p in procs)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "Ctrl-C in its terminal, under | tee"])
def test_a_stop_with_a_checkpoint_folder_leaves_a_resumable_stop(shared, tmp_path, how):
    """With RN50_CHECKPOINT_DIR, SIGTERM to the bare launcher stops the trial as in a container: the training writes
    its checkpoint, the trial's log keeps its last lines, the launcher exits 75 leaving LOGDIR/t.resume, and the next
    launch resumes the trial to run_stop success with its seed. The old launcher sent SIGTERM to the trial's whole
    group: the training got it twice (from the group and from run_and_time.sh; the second ends it at once) and its
    output filters and tee died (the next progress line raised BrokenPipeError), so no checkpoint was written, and the
    launcher, waiting for the group's leader only, exited 143 with the training still on its way out.
    Ctrl-C with the launcher's output and errors piped to tee (`|&`): SIGINT reaches the user's tee too, which dies at
    once. The trial's own tee then died of SIGPIPE at its next line to the terminal, and with it the trial's log and
    the output filters of run_and_time.sh: the checkpoint's lines never reached the log, the stop was not resumable,
    and the launcher exited 130 with no t.resume; with that mended, the launcher died of SIGPIPE at its first line of
    the stop (exit 141). (The resume itself is the SIGTERM case's.)"""
    logs, folder = tmp_path / "logs", tmp_path / "ckpt"
    env = {**TINY_KEEP_CACHES, "NUMEPOCHS": "3", "EVAL_PERIOD": "3", "EVAL_OFFSET": "2", "DISP_BATCHES": "1",
           "DATADIR": shared["data"], "LOGDIR": str(logs), "NEXP": "1", "DATESTAMP": "t",
           "RN50_CHECKPOINT_DIR": str(folder)}
    terminal = how.startswith("Ctrl-C")
    command, _ = launcher("./run_with_docker.sh", env)
    if terminal:  # both streams to the user's tee, which Ctrl-C ends; the launcher's status kept beside
        piped = f"(./run_with_docker.sh; echo $? >{tmp_path / 'status'}) |& tee {tmp_path / 'tee'}"
        command[-1] = command[-1].replace("set -euo pipefail; ", "set -uo pipefail; ").replace(
            "exec ./run_with_docker.sh", piped)
    status, text = sigterm_to(command, tmp_path / "out.txt", lambda out, procs: "epoch 1 step 1/" in out and
                              runs(procs, "rn50_mx.train"), group=terminal)
    log = (logs / "t_1.log").read_text()
    if terminal:  # the launcher's last words went to the ended tee
        assert (tmp_path / "status").read_text() == "75\n", log[-2000:]
    else:
        assert status == 75, text[-3000:]
        assert text.strip().splitlines()[-1] == (
            "run_with_docker.sh: stopped by SIGTERM in trial 1 of 1: stopped, resumable; no further trial runs")
    steps = [name for name in files_in(folder) if name.startswith("step-")]
    assert len(steps) == 1 and files_in(logs) == ["t.resume", "t_1.log"], (files_in(folder), files_in(logs))
    assert mllog(logs / "t_1.log", "resumable_stop") == [str(folder / steps[0])], log[-2000:]
    assert log.endswith(f'run_and_time.sh: stopped, resumable (checkpoint "{folder / steps[0]}")\n'), log[-2000:]
    if terminal:
        return
    result = run(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert files_in(logs) == ["t_1.log"]
    assert mllog(logs / "t_1.log", "resumed_from") == [str(folder / steps[0])]
    assert (folder / "finished").read_text() == "run_stop success\n"
    seeds = mllog(logs / "t_1.log", "seed")
    assert len(seeds) == 2 and seeds[0] == seeds[1], seeds


IGNORES_SIGTERM = """import signal, sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a rank stuck in a collective, which never runs its handler
"""


@pytest.mark.slow
def test_a_stopped_trial_still_running_after_the_grace_is_killed_training_included(shared, tmp_path):
    """The launcher waits for a stopped trial (its checkpoint is written after the signal), but not for ever: a training
    that ignores SIGTERM is killed STOP_GRACE seconds later with a line, though it runs in a process group of its own
    (run_and_time.sh's). The old launcher waited for ever (run_and_time.sh waits for the training); a kill of the
    trial's group alone left the training running."""
    env = {**TINY_KEEP_CACHES, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DATADIR": shared["data"],
           "LOGDIR": str(tmp_path / "logs"), "NEXP": "1", "DATESTAMP": "t", "STOP_GRACE": "3",
           **site(tmp_path, IGNORES_SIGTERM)}
    text = sigterm_to_run_with_docker(env, tmp_path / "out.txt",
                                      lambda out, procs: '"key": "epoch_start"' in out and runs(procs, "rn50_mx.train"))
    assert "run_with_docker.sh: stopped by SIGTERM: what it started still ran 3 s later; killed" in text, text[-3000:]
    assert text.strip().splitlines()[-1] == (
        "run_with_docker.sh: stopped by SIGTERM in trial 1 of 1 (no run_stop); no further trial runs")


@pytest.mark.parametrize("grace", ["0", "-1", "2.5", "1e3", "1234567"])
def test_a_bad_stop_grace_is_one_line_before_any_trial(shared, tmp_path, grace):
    logs = tmp_path / "logs"
    command, _ = launcher("./run_with_docker.sh", {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(logs),
                                                   "STOP_GRACE": grace})
    assert_one_line_naming(run(command), f"STOP_GRACE={grace}: expected whole seconds")
    assert files_in(logs) == []


def signal_each(proc, signum):
    """Send `signum` to `proc` and each of its descendants."""
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = psutil.Process(proc.pid)
        for p in [tree, *tree.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signum)


@pytest.mark.slow
def test_slurms_sigusr1_to_every_process_of_a_trial_stops_it_resumable(shared, tmp_path):
    """Slurm's --signal=USR1 (run.sub) reaches every process of the step: run_and_time.sh died of it (bash's default
    action) while the rank wrote its checkpoint, so the trial was a failure and the job was not requeued."""
    folder = tmp_path / "ckpt"
    env = {**TINY_KEEP_CACHES, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DATADIR": shared["data"],
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
        signal_each(proc, signal.SIGUSR1)  # as Slurm signals a step: each of its processes, whatever their group
        assert proc.wait(timeout=120) == 75, out.read_text()[-3000:]
    finally:
        signal_each(proc, signal.SIGKILL)
    text = out.read_text()
    assert "run_and_time.sh: stopped, resumable (checkpoint " in text and "RESULT," not in text
    assert [name for name in files_in(folder) if name.startswith("step-")]


# --- planted links and glob characters in LOGDIR (issue 33 items 3 and 4) -----------------------------------------

# The trainer's side of a trial that ends at once: run_stop success, exit 0.
FINISHES = """import sys
if sys.orig_argv[1:3] == ["-m", "rn50_mx.train"]:
    import os
    print(f"seed {os.environ['SEED']}", flush=True)
    os._exit(0)
"""


def test_a_link_planted_at_the_resume_states_temporary_name_is_not_followed(shared, tmp_path):
    """The resume state was written to the fixed name DATESTAMP.resume.tmp, through any link planted there: the
    link's target was overwritten with the state."""
    logs, victim = tmp_path / "logs", tmp_path / "victim"
    logs.mkdir()
    victim.write_text("kept\n")
    (logs / "r.resume.tmp").symlink_to(victim)
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(logs), "NEXP": "2", "DATESTAMP": "r"}
    result = run(launcher("./run_with_docker.sh", env)[0], site(tmp_path, RESUMABLE))
    assert result.returncode == 75, result.stderr[-2000:]
    assert victim.read_text() == "kept\n" and (logs / "r.resume").read_text().startswith("resume_trial=1\n")
    assert not (logs / "r.resume").is_symlink()


@pytest.mark.parametrize("planted", ["r_2.log", "r.resume", "r.lock"])
def test_a_link_planted_at_a_name_the_launcher_writes_is_one_line_before_any_trial(shared, tmp_path, planted):
    """A resumed launch (run.sub's requeued job: DATESTAMP is the job id) wrote the logs of the trials after the
    resumed one through links planted at their names, truncating the targets. Any symlink, folder or FIFO at a name
    the launcher writes is one line before any trial; the link's target is kept."""
    logs, victim = tmp_path / "logs", tmp_path / "victim"
    logs.mkdir()
    victim.write_text("kept\n")
    if planted != "r.resume":
        (logs / "r.resume").write_text("resume_trial=1\nresume_seed=7\nused_seeds=7\nfailed=\n")
    (logs / "r_1.log").write_text("the stopped trial\n")
    (logs / planted).symlink_to(victim)
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(logs), "NEXP": "2", "DATESTAMP": "r"}
    result = run(launcher("./run_with_docker.sh", env)[0], site(tmp_path, FINISHES))
    assert_one_line_naming(result, f"run_with_docker.sh: LOGDIR={logs}: {planted} there is a symlink, folder or")
    assert victim.read_text() == "kept\n" and "trial" not in result.stdout


@pytest.mark.parametrize("folder, other", [("run[1]", "run1"), ("logs*", "logsA")])
def test_logdir_is_a_folder_name_never_a_pattern(shared, tmp_path, folder, other):
    """LOGDIR=.../run[1] missed its own r_1.log (the pattern matched run1/) and overwrote it; LOGDIR=.../logs* refused
    for the logs of logsA/. Only the logs' suffix is a pattern."""
    (tmp_path / folder).mkdir()
    (tmp_path / other).mkdir()
    (tmp_path / other / "r_1.log").write_text("another folder's\n")
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / folder), "NEXP": "1",
           "DATESTAMP": "r"}
    command, stub = launcher("./run_with_docker.sh", env)[0], site(tmp_path, RESUMABLE)
    result = run(command, stub)
    assert result.returncode == 75, result.stderr[-2000:]  # logsA/r_1.log is not this LOGDIR's
    (tmp_path / folder / "r.resume").unlink()
    kept = run(command, stub)
    assert_one_line_naming(kept, f"LOGDIR={shown(tmp_path / folder)}: holds logs of DATESTAMP=r already")
    assert (tmp_path / other / "r_1.log").read_text() == "another folder's\n"


def test_several_trials_on_one_checkpoint_folder_are_refused_before_the_first(shared, tmp_path):
    """NEXP > 1 with RN50_CHECKPOINT_DIR ran trial 1, then failed trials 2..N one by one (each found trial 1's ended
    run in the folder)."""
    env = {**TINY_KEEP_CACHES, "DATADIR": shared["data"], "LOGDIR": str(tmp_path / "logs"), "NEXP": "2",
           "RN50_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    result = run(launcher("./run_with_docker.sh", env)[0])
    assert_one_line_naming(result, f"NEXP=2 with RN50_CHECKPOINT_DIR={tmp_path / 'ckpt'}: the trials would share")
    assert "trial" not in result.stdout and files_in(tmp_path / "logs") == []
