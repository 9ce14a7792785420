"""Launch overhead: a 2-rank trial through `sbatch run.sub` (Slurm, srun --mpi=pmix, MPI over PMIx) against the same
trial through run_with_docker.sh on the bare machine (run_and_time.sh -> horovodrun -> mpirun), side by side.

    PATH=$VENV/bin:$PATH python -m bench.slurm [--rounds 3]

The tiny dataset of the launch tests (5 classes x 7 Fashion-MNIST photographs), config/CPU.sh with 4 images per
rank, one epoch; a one-node Slurm started here as in the tests (tests/support/slurm.py), CLEAR_CACHES=0 for both. Each
round runs both launchers in turn. Figures, medians over the rounds:
  to run_start   from the submit (sbatch) or the launcher's start to the run_start line's time_ms
  wall           from the submit or the start until the job left the queue or the launcher exited
and the ratio Slurm / horovodrun of each.

Measured (2 rounds, 2 CPUs shared with four other jobs, load average 13-18): to run_start 120.6 s under Slurm
against 94.6 s (1.28x), wall 282.6 s against 186.9 s (1.51x); rounds swung by 1.7x (docs/multinode.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tests.support import slurm
from tests.support.data import packed_train_val
from tests.support.procs import ENV_PATH, ROOT
from tests.support.settings import TINY

SETTINGS = {**TINY, "KVSTORE": "horovod", "DGXNGPU": "2", "NEXP": "1", "SEED": "3", "CLEAR_CACHES": "0"}


def run_start_ms(log):
    with open(log) as f:
        for line in f:
            if line.startswith(":::MLLOG ") and '"key": "run_start"' in line:
                return json.loads(line[len(":::MLLOG "):])["time_ms"]
    sys.exit(f"bench/slurm.py: no run_start in {log}")


def script(env, command):
    exports = "".join(f"export {name}={value!r}; " for name, value in env.items())
    return ["bash", "-c", f"set -euo pipefail; source config/CPU.sh; {exports}{command}"]


def under_slurm(cluster, data, out):
    """(seconds to run_start, wall seconds) of one sbatch run.sub."""
    env = {**SETTINGS, "DATADIR": data, "LOGDIR": out, "DATESTAMP": "slurm"}
    tic = time.time()
    job = cluster.run(script(env, f"sbatch --parsable -o {out}/job.out run.sub"), cwd=ROOT,
                      env={"PATH": ENV_PATH}).stdout.strip()
    fields = cluster.wait_job(job, timeout=1200)
    wall = time.time() - tic
    if fields["JobState"] != "COMPLETED":
        sys.exit(f"bench/slurm.py: job {job} {fields['JobState']}: see {out}/job.out")
    return run_start_ms(f"{out}/slurm_1.log") / 1000 - tic, wall


def under_horovodrun(data, out):
    env = {**SETTINGS, "DATADIR": data, "LOGDIR": out, "DATESTAMP": "hvd"}
    tic = time.time()
    subprocess.run(script(env, "./run_with_docker.sh"), cwd=ROOT, env={"PATH": ENV_PATH}, check=True,
                   capture_output=True)
    wall = time.time() - tic
    return run_start_ms(f"{out}/hvd_1.log") / 1000 - tic, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = slurm.missing_packages()
    if reason:
        sys.exit(f"bench/slurm.py: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        _, data = packed_train_val(tmp)
        cluster = slurm.Cluster().start()
        results = {"slurm": [], "horovodrun": []}
        try:
            for r in range(args.rounds):
                for name, run in (("slurm", lambda out: under_slurm(cluster, data, out)),
                                  ("horovodrun", lambda out: under_horovodrun(data, out))):
                    out = os.path.join(tmp, f"{name}{r}")
                    os.makedirs(out)
                    results[name].append(run(out))
                    print(f"round {r + 1} {name:10s} to run_start {results[name][-1][0]:6.1f} s  "
                          f"wall {results[name][-1][1]:6.1f} s", flush=True)
        finally:
            cluster.stop()
    medians = {name: [statistics.median(v[i] for v in runs) for i in (0, 1)] for name, runs in results.items()}
    print(f"{'launcher':12s} {'to run_start':>13s} {'wall':>8s}")
    for name, (start, wall) in medians.items():
        print(f"{name:12s} {start:11.1f} s {wall:6.1f} s")
    s, h = medians["slurm"], medians["horovodrun"]
    print(f"slurm/horovodrun: to run_start {s[0] / h[0]:.2f}x, wall {s[1] / h[1]:.2f}x ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
