"""The launchers' trials: run_with_docker.sh and run.sub hand the container the reference's flags, distinct seeds and
the settings exported by hand; a missing data file stops a launch before any trial; two bare-metal trials of
config/CPU.sh, shrunk to a few images, leave two logs that the timing tool reads; two ranks start through
horovodrun; SIGTERM stops every rank."""
import contextlib
import glob
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from tests.support.mllog import mllog
from tests.support.procs import ENV_PATH, ROOT, assert_one_line_naming, sourced
from tests.support.settings import TINY


def recording_tools(tmp_path, *names, run=False):
    """A PATH with fake `names` that append their command line (and SEED, CACHE_CLEARED) to tmp_path/calls.
    `--env-names` is answered by the installed rn50_mx, as the image would. With `run`, a fake also runs its
    command here, after its leading --options (srun without a container)."""
    bin_dir = tmp_path / "fakes"
    bin_dir.mkdir()
    env_names = "python -m rn50_mx.check --env-names"
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $* SEED=$SEED CACHE_CLEARED=$CACHE_CLEARED" >> "{tmp_path}/calls"\n'
                        f'case "$*" in *" {env_names}") exec {env_names};; esac\n'
                        + ('while [ "$1" != "${1#--}" ]; do shift; done\nexec "$@"\n' if run else ''))
        tool.chmod(0o755)
    return str(bin_dir) + os.pathsep + ENV_PATH


def calls(tmp_path):
    """The recorded command lines (an argument may span lines)."""
    return re.split(r"\n(?=docker |srun )", (tmp_path / "calls").read_text().strip())


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
    names, check, trial1, trial2, summary = calls(tmp_path)
    docker_run = "docker run --rm --init --gpus all --net=host --uts=host --ipc=host "
    assert names.startswith(f"{docker_run}--security-opt seccomp=unconfined --ulimit stack=67108864 "
                            f"--ulimit memlock=-1 -v {data}:/data -v {logs}:/results rn50-mx python -m "
                            "rn50_mx.check --env-names ")
    for call in (check, trial1, trial2, summary):
        assert call.startswith(docker_run)
        for part in (f"-v {data}:/data", f"-v {logs}:/results", "--env BATCHSIZE", "--env DALI_THREADS",
                     "--env NCCL_BUFFSIZE", "--env SEED", "--env CACHE_CLEARED", "--env DATADIR=/data"):
            assert f" {part} " in call
    assert " rn50-mx python -m rn50_mx.check --data-train /data/train.rec --data-val /data/val.rec " in check
    assert " rn50-mx ./run_and_time.sh " in trial1 and " CACHE_CLEARED=0" in trial1
    assert trial1.split("SEED=")[1] != trial2.split("SEED=")[1]
    assert " rn50-mx python -m rn50_mx.timing /results/s_1.log /results/s_2.log " in summary
    assert (logs / "s_2.log").read_text().startswith("Beginning trial 2 of 2\nNot clearing the page cache")


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


@pytest.mark.slow
def test_two_bare_metal_trials_write_two_logs_that_timing_reads(tiny_data, tmp_path):
    logs = tmp_path / "logs"
    env = {**TINY, "DATADIR": tiny_data, "LOGDIR": str(logs), "NEXP": "2", "SEED": "7", "DATESTAMP": "test"}
    result = sourced("CPU", "./run_with_docker.sh", env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    paths = [str(logs / f"test_{i}.log") for i in (1, 2)]
    assert sorted(glob.glob(str(logs / "*.log"))) == paths
    for i, path in enumerate(paths, start=1):
        with open(path) as f:
            text = f.read()
        assert text.startswith(f"Beginning trial {i} of 2\n")
        assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", text, re.M)
        assert mllog(path, "seed") == [6 + i]  # SEED, SEED+1: the seed checker refuses repeated seeds
        assert mllog(path, "cache_clear") == ["Cleared the page cache" in text]
        assert mllog(path, "submission_platform") == ["1xCPU"]
    assert "no score: ResNet-50 is scored on exactly 5 runs, got 2" in result.stdout


@pytest.mark.slow
def test_two_ranks_start_through_horovodrun_and_log_parseable_lines(tiny_data, tmp_path):
    env = {**TINY, "DGXNGPU": "2", "KVSTORE": "horovod", "DATADIR": tiny_data, "CLEAR_CACHES": "0"}
    result = sourced("CPU", "./run_and_time.sh", env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = tmp_path / "run.log"
    log.write_text(result.stdout)
    assert len(mllog(log, "init_start")) == 2  # every rank logs init_start, as the reference
    assert mllog(log, "global_batch_size") == [8]
    assert len(mllog(log, "run_stop")) == 1
    assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", result.stdout, re.M)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_sigterm_on_run_and_time_stops_every_rank(tiny_data, tmp_path, ranks):
    """A `kill` of the launcher script reaches training (through horovodrun with 2 ranks): nothing is left."""
    env = {**TINY, "NUMEPOCHS": "200", "ACCURACY_THRESHOLD": "1.0", "DGXNGPU": str(ranks), "KVSTORE": "horovod", "DATADIR": tiny_data}
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
        procs = psutil.Process(proc.pid).children(recursive=True)
        assert sum("rn50_mx.train" in " ".join(p.cmdline()) for p in procs) >= ranks, procs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        _, alive = psutil.wait_procs(procs, timeout=15)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [p.cmdline() for p in alive]
        assert "RESULT," not in out.read_text()
    finally:  # whatever the outcome, nothing this test started keeps running
        for p in [*procs, psutil.Process(proc.pid)] if proc.poll() is None else procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
