"""run.sub under a real Slurm (tests/support/slurm.py: munged, slurmctld and slurmd started here, the real sbatch, srun,
squeue and scontrol): 2 ranks meet through MPI over PMIx (`srun --mpi=pmix`, Horovod built with MPI, as in the NGC
image) on one node and across two nodes (network namespaces); tasks that cannot meet stop on the world-size check;
scancel stops every rank. The tiny dataset of conftest's tiny_data, a few seconds of training per job.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rn50_mx import timing
from tests.support import slurm
from tests.support.data import TINY_CLASSES
from tests.support.mllog import CHECKER_ON_A_SHORT_RUN, mllog
from tests.support.procs import ENV_PATH, PYTHONPATH, ROOT, assert_one_line_naming
from tests.support.settings import HOROVOD, TINY
from tests.support.studies import planted_study

IMAGES = len(TINY_CLASSES) * 7
TWO_RANKS = {**TINY, **HOROVOD, "DISP_BATCHES": "1", "NEXP": "1", "SEED": "3", "DATESTAMP": "job"}


@pytest.fixture(scope="session")
def cluster():
    """One Slurm node, this host, for the whole session."""
    reason = slurm.missing_packages()
    if reason:
        pytest.skip(reason)
    c = slurm.Cluster().start()
    yield c
    c.stop()


def submit(cluster, tmp_path, env, *sbatch):
    """`sbatch [SBATCH] run.sub` after `source config/CPU.sh` and `env`, from the repository's root; the job id."""
    exports = "".join(f"export {name}={value!r}; " for name, value in env.items())
    script = f"set -euo pipefail; source config/CPU.sh; {exports}sbatch --parsable -o {tmp_path}/job-%j.out " \
             f"{' '.join(sbatch)} run.sub"
    result = cluster.run(["bash", "-c", script], cwd=ROOT, env={"PATH": ENV_PATH, **PYTHONPATH})
    return int(result.stdout.strip().split(";")[0])


def job_output(tmp_path, job_id):
    with open(tmp_path / f"job-{job_id}.out") as f:
        return f.read()


def assert_one_job_of_two_ranks(cluster, tmp_path, job_id, logs):
    """The job ended well and its one trial log shows one training of world size 2."""
    fields = cluster.wait_job(job_id, timeout=600)
    out = job_output(tmp_path, job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), out[-4000:] + cluster.logs()
    assert_one_training_of_two_ranks(logs / "job_1.log")
    assert "no score: ResNet-50 is scored on exactly 5 runs, got 1" in out  # the trial loop's timing summary
    return out, (logs / "job_1.log").read_text()


def assert_one_training_of_two_ranks(log):
    """A trial log of one training of world size 2 that the timing tool scores and the compliance checker reads."""
    assert len(mllog(log, "init_start")) == 2  # every rank logs init_start; two trainings would log run_start twice
    assert len(mllog(log, "run_start")) == 1 and mllog(log, "global_batch_size") == [2 * int(TINY["BATCHSIZE"])]
    assert mllog(log, "train_samples") == [IMAGES]
    steps = math.ceil(IMAGES / (2 * int(TINY["BATCHSIZE"])))  # each rank reads its half once per epoch
    assert re.findall(r"epoch 1 step (\d+)/(\d+)", log.read_text())[-1] == (str(steps), str(steps))
    assert [e["status"] for e in [event_metadata(log, "run_stop")]] == ["success"]
    assert re.search(r"^RESULT,IMAGE_CLASSIFICATION,,\d+,", log.read_text(), re.M)
    scored = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(log)], capture_output=True, text=True,
                            cwd=ROOT, env={"PATH": ENV_PATH, **PYTHONPATH})
    assert "no score: ResNet-50 is scored on exactly 5 runs, got 1" in scored.stdout, scored.stdout + scored.stderr
    assert timing.check_compliance(str(log), "1.0.0") == CHECKER_ON_A_SHORT_RUN


def event_metadata(path, key):
    with open(path) as f:
        for line in f:
            if line.startswith(":::MLLOG ") and f'"key": "{key}"' in line:
                return json.loads(line[len(":::MLLOG "):])["metadata"]
    raise AssertionError(f"no {key} in {path}")


@pytest.mark.slow
def test_one_node_two_tasks_make_one_job_and_scancel_stops_every_rank(cluster, tiny_data, tmp_path):
    """Trial 1 of 3 trains as one job of world size 2; scancel during trial 2 (the same SIGTERM, then SIGKILL
    KillWait = 5 s later, as Slurm's time limit) stops both of its ranks, leaves no run_stop, and
    the trial loop reports it and starts no trial 3. One job for both: each job costs a training's start-up."""
    logs = tmp_path / "logs"
    env = {**TWO_RANKS, "DGXNGPU": "2", "DATADIR": tiny_data, "LOGDIR": str(logs), "CLEAR_CACHES": "0", "NEXP": "3"}
    job_id = submit(cluster, tmp_path, env, "-N", "1", "-t", "10")
    deadline = time.time() + 600
    while not (logs / "job_2.log").exists() or len(ranks_of(cluster, job_id)) < 2:
        assert cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING"), job_output(tmp_path, job_id)[-3000:]
        assert time.time() < deadline
        time.sleep(0.5)
    ranks = ranks_of(cluster, job_id)
    cluster.run(["scancel", str(job_id)])
    _, alive = psutil.wait_procs(ranks, timeout=60)
    assert not alive, alive
    assert cluster.wait_job(job_id, timeout=60)["JobState"] == "CANCELLED"
    assert_one_training_of_two_ranks(logs / "job_1.log")
    # no run_stop event (the log keeps run_and_time.sh's last line, "training failed (...; run_stop missing)")
    assert mllog(logs / "job_2.log", "run_stop") == [] and not (logs / "job_3.log").exists()
    assert "run.sub: stopped by SIGTERM in trial 2 of 3 (no run_stop); no further trial runs" in \
        job_output(tmp_path, job_id)


@pytest.mark.slow
def test_usr1_stops_at_a_checkpoint_and_the_requeued_job_resumes_in_the_same_log(cluster, tiny_data, tmp_path):
    """SIGUSR1 to the job's steps (what --signal=USR1@300 sends before the time limit: every step, not the batch
    shell) mid-training: both ranks write a checkpoint and exit 75, the trial loop requeues the job (run.sub's
    on_resumable_stop), Slurm starts it again, it resumes from the checkpoint and ends with run_stop success; the
    trial's log, named by the job's id (run.sub's DATESTAMP), holds both attempts in order, and the job's output
    too (--open-mode=append). The old code never ran this under Slurm; its requeued job met its own log and
    stopped ("holds logs of DATESTAMP")."""
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    env = {**TWO_RANKS, "DGXNGPU": "2", "DATADIR": tiny_data, "LOGDIR": str(logs), "CLEAR_CACHES": "0",
           "NUMEPOCHS": "3", "EVAL_PERIOD": "3", "EVAL_OFFSET": "2", "RN50_CHECKPOINT_DIR": str(ckpt)}
    del env["DATESTAMP"]
    job_id = submit(cluster, tmp_path, env, "-N", "1", "-t", "10")
    log = logs / f"{job_id}_1.log"
    steps = math.ceil(IMAGES / (2 * int(TINY["BATCHSIZE"])))
    deadline = time.time() + 600
    while not (log.exists() and f"epoch 1 step 1/{steps}" in log.read_text()):
        assert cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING"), job_output(tmp_path, job_id)[-3000:]
        assert time.time() < deadline
        time.sleep(0.2)
    cluster.run(["scancel", "--signal=USR1", str(job_id)])
    while cluster.job(job_id)["Restarts"] != "1":  # the hook's scontrol requeue
        assert time.time() < deadline, job_output(tmp_path, job_id)[-3000:]
        time.sleep(0.2)
    fields = cluster.wait_job(job_id, timeout=600)  # pending cred_expire + 1 s first (tests/support/slurm.py)
    out, text = job_output(tmp_path, job_id), log.read_text()
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", "1"), \
        out[-4000:] + cluster.logs()
    assert sorted(p.name for p in logs.iterdir()) == [f"{job_id}_1.log"]  # no .resume left, no second log
    # The first attempt: both ranks stopped at one step with a checkpoint, exit 75, and the loop said so.
    stop = re.search(r"^stopped at epoch (\d) step (\d): resume from (\S+)$", text, re.M)
    assert stop, text[-3000:]
    exits = re.findall(r"^srun: error: \S+: tasks? ([0-9-]+): Exited with exit code 75$", text, re.M)
    assert sorted(exits) in (["0", "1"], ["0-1"]), text[-3000:]
    assert "run.sub: trial 1 of 1: stopped, resumable; no further trial runs" in out and "training failed" not in out
    # The second: the same trial resumed from that checkpoint, its lines after the first's, ending in success.
    order = [text.index(mark) for mark in ("Beginning trial 1 of 1", '"key": "resumable_stop"',
                                           "Resuming trial 1 of 1", '"key": "resumed_from"', '"key": "run_stop"')]
    assert order == sorted(order), order
    assert mllog(log, "resumed_from") == mllog(log, "resumable_stop") == [stop.group(3)]
    assert len(mllog(log, "run_start")) == 2 and [event_metadata(log, "run_stop")["status"]] == ["success"]
    assert re.findall(r"epoch 3 step (\d+)/", text)[-1] == str(steps) and text.count("RESULT,IMAGE_CLASSIFICATION") == 1
    assert out.count("Beginning trial 1 of 1") == 1 and out.count("Resuming trial 1 of 1") == 1
    assert re.search(rf"^{job_id}_1.log +closed +- +resumed from a checkpoint ", out, re.M), out[-2000:]  # timing's row
    assert (ckpt / "finished").read_text() == "run_stop success\n"


WORLD_ERROR = ("rn50_mx.train: error: rank {rank}: {met} rank(s) met ({local} on this node), but DGXNNODES x "
               "DGXNGPU = {nodes} x {gpus} = {want} ({gpus} per node): start one task per device, and under srun use "
               "--mpi=pmix with Horovod built with MPI")


@pytest.mark.slow
@pytest.mark.parametrize("env,lines", [
    # Horovod's Gloo controller without its rendezvous (what Horovod built without MPI does under srun): each task
    # is a world of one. The old code ran two full trainings.
    ({"DGXNGPU": "2", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"},
     [WORLD_ERROR.format(rank=0, met=1, local=1, nodes=1, gpus=2, want=2)] * 2),
    # Two ranks met, as the config's two nodes would have, but on one node: each would take the node's first device.
    ({"DGXNGPU": "1", "DGXNNODES": "2"},
     [WORLD_ERROR.format(rank=r, met=2, local=2, nodes=2, gpus=1, want=2) for r in (0, 1)]),
], ids=["cannot-meet", "ranks-per-node"])
def test_a_world_other_than_the_configs_stops_every_rank_before_run_start(cluster, tiny_data, env, lines):
    exports = "".join(f"export {name}={value!r}; " for name, value in {**TINY, **HOROVOD, **env}.items())
    script = f"source config/CPU.sh; {exports}srun -n2 --mpi=pmix python -m rn50_mx.train " \
             f"--data-train {tiny_data}/train.rec --data-val {tiny_data}/val.rec"
    result = cluster.run(["bash", "-c", script], check=False, cwd=ROOT, env={"PATH": ENV_PATH, **PYTHONPATH},
                         timeout=300)
    assert result.returncode != 0
    # one line a task: config/CPU.sh's fallback to float32 (Horovod allreduces no bfloat16) is said only by a run
    # that starts
    assert sorted(line for line in result.stderr.splitlines() if not line.startswith("srun: ")) == sorted(lines), \
        result.stderr
    assert "run_start" not in result.stdout and "Traceback" not in result.stderr


def search_environ(cluster, tiny_data, **changes):
    """config/CPU.sh's variables, the tiny settings and the cluster's slurm.conf, as a user's shell before a search."""
    sourced = cluster.run(["bash", "-c", "source config/CPU.sh && env -0"], cwd=ROOT).stdout
    env = dict(item.split("=", 1) for item in sourced.split("\0") if "=" in item)
    return {**env, **TINY, "LR": "0.5", "DATADIR": tiny_data, "CLEAR_CACHES": "0", "PATH": ENV_PATH, **PYTHONPATH,
            **changes}


@pytest.mark.slow
def test_a_search_runs_its_trials_as_jobs_and_cancels_them_when_stopped(cluster, tiny_data, tmp_path):
    """--launcher slurm: a trial's run is one run.sub job through the real sbatch; the study reads its trial log.
    Then a long trial: SIGTERM to the driver cancels its job (scancel), and no task is left."""
    command = [sys.executable, "-m", "rn50_mx.search", "--launcher", "slurm", "--knob", "LR=0.4:0.6", "--trials", "1",
               "--finalists", "0", "--out", str(tmp_path / "cfg")]
    result = subprocess.run([*command, "--results", str(tmp_path / "res")], env=search_environ(cluster, tiny_data),
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr + cluster.logs()
    assert "-> COMPLETE" in result.stdout.splitlines()[0], result.stdout
    log = tmp_path / "res" / "CPU.trials" / "0000" / "seed100000_1.log"
    assert mllog(log, "run_stop") and "Beginning trial 1 of 1" in log.read_text()

    long = search_environ(cluster, tiny_data, NUMEPOCHS="200", ACCURACY_THRESHOLD="1.0")
    out = tmp_path / "driver.out"
    with open(out, "w") as f:
        driver = subprocess.Popen([*command, "--results", str(tmp_path / "long")], env=long, cwd=ROOT, stdout=f,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    trial_log = tmp_path / "long" / "CPU.trials" / "0000" / "seed100000_1.log"
    deadline = time.time() + 300
    while "epoch 1:" not in (trial_log.read_text() if trial_log.exists() else ""):
        assert driver.poll() is None and time.time() < deadline, out.read_text() + cluster.logs()
        time.sleep(1)
    [job_id] = {job for _, job in cluster.trainings()}
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=180) == 143, out.read_text()
    assert cluster.job(job_id)["JobState"] == "CANCELLED"
    assert ranks_of(cluster, job_id) == []


def test_a_search_job_is_held_until_its_record_is_kept_and_the_next_driver_cancels_one_never_recorded(
        cluster, tmp_path, monkeypatch):
    """A search submits its job held (sbatch --hold) and releases it once the study keeps its record; a driver killed
    in between leaves a held job, which never runs and which the next driver, finding it by the study's job name,
    cancels. (The release is what every search job of the test above goes through.)"""
    from rn50_mx.config import Settings
    from rn50_mx.search import launchers
    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    name = launchers.job_name(str(tmp_path), "study")
    job = launchers.Job(Settings(), str(tmp_path / "held.out"), cluster.env, name)
    time.sleep(2)
    fields = cluster.job(job.record[1])
    assert (fields["JobState"], fields["Reason"], fields["JobName"]) == ("PENDING", "JobHeldUser", name), fields
    launchers.end_unrecorded_jobs(name)
    assert cluster.job(job.record[1])["JobState"] == "CANCELLED"
    assert not (tmp_path / "held.out").exists()  # it never ran


def ranks_of(cluster, job_id):
    """The training processes of a job (other trainings may run on this machine)."""
    return [proc for proc, job in cluster.trainings() if job == str(job_id)]


def bridge_bytes():
    """Bytes received plus sent by the nodes' veth ends on the host: what crossed between the namespaces."""
    total = 0
    for i in (1, 2):
        for way in ("rx_bytes", "tx_bytes"):
            with open(f"/sys/class/net/rn50h{i}/statistics/{way}") as f:
                total += int(f.read())
    return total


@pytest.fixture
def two_nodes():
    """Two Slurm nodes n1 and n2, each slurmd in its own network namespace, joined by a bridge."""
    reason = slurm.missing_packages()
    if reason:
        pytest.skip(reason)
    c = slurm.Cluster(nodes=2).start()
    yield c
    c.stop()


@pytest.mark.slow
def test_two_nodes_one_task_each_make_one_job(two_nodes, tiny_data, tmp_path):
    logs = tmp_path / "logs"
    env = {**TWO_RANKS, "DGXNGPU": "1", "DGXNNODES": "2", "DATADIR": tiny_data, "LOGDIR": str(logs),
           "CLEAR_CACHES": "1"}
    before = bridge_bytes()
    job_id = submit(two_nodes, tmp_path, env, "-N", "2", "-t", "10")
    out, log = assert_one_job_of_two_ranks(two_nodes, tmp_path, job_id, logs)
    assert two_nodes.job(job_id)["NodeList"] == "n[1-2]"
    # The per-node steps ran on each node: the cache drop, and local rank 0's binding decision.
    assert log.count("Cleared the page cache on ") == 2 and mllog(logs / "job_1.log", "cache_clear") == [True]
    assert out.count("run_and_time.sh: numactl not found: ranks run without CPU binding") == 2
    # Horovod's allreduces crossed the namespaces: at least the gradients of one step (ResNet-50: 25.6M floats).
    assert bridge_bytes() - before > 25_000_000 * 4


@pytest.mark.slow
def test_the_finals_cancel_their_jobs_on_every_way_out(cluster, tiny_data, tmp_path):
    """Issue 42, item 2: only the trials were ended on the driver's ways out. (1) Two finalists at once, sbatch refusing
    the second (a wrapper around the real sbatch fails its second call, as a per-user job limit would): the first,
    already submitted and released, ran on after the one line. (2) SIGTERM to the driver while a finalist's job
    runs: "interrupted", exit 130, and no scancel. Now both cancel the job."""
    command = [sys.executable, "-m", "rn50_mx.search", "--launcher", "slurm", "--knob", "LR=0.4:0.6", "--trials", "1",
               "--final-seeds", "1", "--out", str(tmp_path / "cfg")]
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nif [ -e {tmp_path}/submitted ]; then\n"
                       "  echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2; exit 1\nfi\n"
                       f"touch {tmp_path}/submitted\nexec {shutil.which('sbatch')} \"$@\"\n")
    wrapper.chmod(0o755)
    planted_study(str(tmp_path / "two"), finished={"LR": 0.45})
    env = search_environ(cluster, tiny_data, NUMEPOCHS="200", ACCURACY_THRESHOLD="1.0",
                         PATH=f"{wrapper.parent}{os.pathsep}{ENV_PATH}")
    result = subprocess.run([*command, "--results", str(tmp_path / "two"), "--parallel", "2"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert_one_line_naming(result, "sbatch: sbatch: error: QOSMaxSubmitJobPerUserLimit")
    [(_, job_id)] = [run["record"] for run in study_attrs(tmp_path / "two")["finals"]]
    assert cluster.job(job_id)["JobState"] == "CANCELLED" and ranks_of(cluster, job_id) == []

    planted_study(str(tmp_path / "one"), finished={"LR": 0.5})  # the sourced values: one set
    out = tmp_path / "driver.out"
    with open(out, "w") as f:
        driver = subprocess.Popen([*command, "--results", str(tmp_path / "one")], env={**env, "PATH": ENV_PATH},
                                  cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline, job_id = time.time() + 300, None
    while not job_id or cluster.job(job_id)["JobState"] != "RUNNING":  # released and started: the finalist runs
        assert driver.poll() is None and time.time() < deadline, out.read_text() + cluster.logs()
        time.sleep(1)
        job_id = next((run["record"][1] for run in study_attrs(tmp_path / "one").get("finals", [])), None)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=180) == 143, out.read_text()
    assert out.read_text().splitlines()[-1] == ("search: stopped; every run's processes ended; the same command "
                                                "continues study 'CPU'")
    assert cluster.job(job_id)["JobState"] == "CANCELLED" and ranks_of(cluster, job_id) == []


def study_attrs(results):
    import optuna

    return optuna.load_study(study_name="CPU", storage=f"sqlite:///{results}/CPU.db").user_attrs
