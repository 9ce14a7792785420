"""Where one run of a trial goes, as a user runs training: `local` (python -m rn50_mx.train, under horovodrun for
several processes), `docker` (run_with_docker.sh with NEXP=1: in the image when CONT is set, on this machine
otherwise) or `slurm` (one run.sub job, submitted with sbatch, ended with scancel). A launcher trial gets its
settings as the variables the config exports (every value, FRAGMENTS=0: no config/<SYSTEM>_*.sh fragment may
change them) and writes its trial log, MLPerf lines included, in the trial's folder. Each started run has a record
the study keeps, from which a driver started after a killed one ends what is left of it. A run does nothing until its
record is kept (`go`): a process group waits at a gate that a dead driver's closed pipe shuts, a Slurm job is
submitted held, so that a driver killed in between leaves nothing running."""
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import zlib

from .. import children, config
from ..errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINDS = ("local", "docker", "slurm")
SLURM_TOOLS = ("sbatch", "squeue", "scancel", "scontrol")
DATA_FILES = ("train.rec", "val.rec")  # what the launchers pass as --data-train and --data-val, in DATADIR


class LaunchError(InputError):
    """A run the launcher could not start (no sbatch, Slurm refusing the job, a command missing): the search stops
    with this one line, and the trial, not run, is queued again (it costs no trial of the budget)."""


def check(kind, s):
    """One line when `s` cannot go through launcher `kind`: the launchers read DATADIR/train.rec and val.rec; Slurm
    jobs need its commands."""
    if kind == "local":
        return
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None] if kind == "slurm" else []
    if missing:
        raise InputError(f"--launcher slurm: {', '.join(missing)} not found on PATH")
    folder = os.path.dirname(s.data_train)
    if (os.path.basename(s.data_train), os.path.basename(s.data_val)) != DATA_FILES or \
            os.path.dirname(s.data_val) != folder:
        raise InputError(f"--launcher {kind}: the launchers read DATADIR/train.rec and DATADIR/val.rec, not "
                         f"{s.data_train} and {s.data_val}")


def log_path(kind, folder, seed):
    """The run's MLPerf log: the trial log a launcher writes (LOGDIR/DATESTAMP_1.log), or training's own file."""
    return os.path.join(folder, f"seed{seed}.log" if kind == "local" else f"seed{seed}_1.log")


def train_command(s):
    """The training command of settings `s`: every value as a flag, so the run resolves exactly these."""
    train = [sys.executable, "-m", "rn50_mx.train", *config.as_flags(s)]
    processes = s.world_size
    if processes == 1:
        return train
    launcher = children.horovodrun(processes, "--gloo")
    if not launcher:
        raise LaunchError(f"{processes} processes run under Horovod's horovodrun, and Horovod is not installed for "
                          f"{sys.executable} (pip install horovod)")
    return [*launcher, *train]


def train_env(s):
    """The environment of a local run: this process's, with OMP_NUM_THREADS as `s` has it (unset for 0), which only
    the variable sets (config.as_flags leaves it out): an open search's knob on it reaches the run."""
    env = config.environ_with(OMP_NUM_THREADS=str(s.omp_num_threads))
    if not s.omp_num_threads:
        del env["OMP_NUM_THREADS"]
    return env


def launcher_env(s, folder, seed):
    """The environment of a launcher trial: the settings as the config's variables, one trial with `seed`, its log
    in `folder`, no fragment sourced."""
    return config.environ_with(**{**config.as_env(s), "NEXP": "1", "SEED": str(seed), "LOGDIR": folder,
                                  "DATESTAMP": f"seed{seed}", "FRAGMENTS": "0", "DATADIR": os.path.dirname(s.data_train)})


# The gate a run's process group waits at: "go" on its stdin (a pipe only the driver writes) runs the command; the
# pipe closed without it (the driver died before keeping the record) ends the group having run nothing.
GATE = 'read -r go && [ "$go" = go ] && exec "$@" </dev/null; ' \
       'echo "not started: the search driver that launched it ended before keeping its record" >&2; exit 125'


class Group:
    """A run in a process group of its own on this machine (local, docker), held at GATE until go()."""

    def __init__(self, command, out, env=None):
        gate, self.gate = os.pipe()
        try:
            with open(out, "x") as f:  # new: a run's output is its own; its first line, its command, says there is room
                f.write(shlex.join(command) + "\n")
                f.flush()
                self.proc = children.start(["sh", "-c", GATE, "gate", *command], stdin=gate, stdout=f,
                                           stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        except OSError as err:
            os.close(self.gate)
            raise LaunchError(f"{command[0]}: cannot start the run ({err.strerror or err}; output {out})") from None
        finally:
            os.close(gate)
        self.record = ["pgid", self.proc.pid, children.started_at(self.proc.pid)]

    def go(self):
        """Open the gate: the record is kept. A group already ended (stopped) finds it shut, and stays ended."""
        with contextlib.suppress(OSError):
            os.write(self.gate, b"go\n")
        os.close(self.gate)
        self.gate = None

    def done(self):
        return self.proc.poll() is not None

    def stop(self):
        children.stop(self.proc)
        if self.gate is not None:
            os.close(self.gate)
            self.gate = None


def job_name(results, study):
    """The Slurm job name of a study's runs (its results folder and name hashed): what a driver finds the jobs a
    killed one submitted but never recorded by."""
    return f"rn50-search-{zlib.crc32(os.path.abspath(os.path.join(results, study)).encode()):08x}"


class Job:
    """A run as a Slurm job of run.sub, submitted from the repository's root, held until go()."""

    def __init__(self, s, out, env, name):
        try:
            result = subprocess.run(["sbatch", "--parsable", "--hold", "-N", str(s.dgxnnodes), "-J", name, "-o", out,
                                     "run.sub"], cwd=ROOT, env=env, capture_output=True, text=True)
        except OSError as err:
            raise LaunchError(f"sbatch: cannot run it ({err.strerror or err})") from None
        if result.returncode:
            raise LaunchError(f"sbatch: {(result.stderr.strip() or 'failed').splitlines()[-1]}")
        job = result.stdout.strip().split(";")[0]
        if not job.isdecimal():
            raise LaunchError(f"sbatch: no job id in its answer {result.stdout.strip()[:60]!r}")
        self.record = ["job", int(job)]

    def go(self):
        """Release the held job: its record is kept."""
        result = subprocess.run(["scontrol", "release", str(self.record[1])], capture_output=True, text=True)
        if result.returncode:
            end_job(self.record[1])
            raise LaunchError(f"scontrol release {self.record[1]}: "
                              f"{(result.stderr.strip() or 'failed').splitlines()[-1]}")

    def done(self):
        return job_done(self.record[1])

    def stop(self):
        end_job(self.record[1])


SQUEUE_PATIENCE = 600.0  # seconds of failing squeue calls (a controller restarting) before the search gives up
_squeue_failing_since = {}


def job_done(job_id):
    """True once Slurm no longer lists the job (or knows it no more). A failed squeue counts as not done for up to
    SQUEUE_PATIENCE seconds, then is one line (the driver then cancels what it can)."""
    result = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True)
    if result.returncode and "Invalid job id" not in result.stderr:
        since = _squeue_failing_since.setdefault(job_id, time.time())
        if time.time() - since > SQUEUE_PATIENCE:
            raise InputError(f"squeue: {(result.stderr.strip() or 'failed').splitlines()[-1]} (job {job_id}, "
                             f"for {SQUEUE_PATIENCE:.0f} s)")
        return False
    _squeue_failing_since.pop(job_id, None)
    return bool(result.returncode) or not result.stdout.strip()


def end_job(job_id, timeout=120.0):
    """scancel, then wait until the job has left the queue (its tasks ended by Slurm), for `timeout` at most."""
    subprocess.run(["scancel", str(job_id)], capture_output=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(InputError):  # squeue failing for long: nothing more to learn
            if job_done(job_id):
                return
        time.sleep(1.0)


def end_unrecorded_jobs(name):
    """Cancel the jobs named `name` still queued when a driver starts, after the recorded ones were ended: those a
    killed driver submitted (held) but never recorded. One driver runs a study, so no other run goes by that name."""
    result = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True)
    for job in result.stdout.split() if result.returncode == 0 else []:
        if job.isdecimal():
            print(f"search: Slurm job {job} was submitted by the last driver, which stopped before recording it: "
                  "cancelled", flush=True)
            end_job(int(job))


def start(kind, s, folder, seed, out, name):
    """The started run of settings `s` (seed, log and paths already set) through launcher `kind`, a Slurm job named
    `name`; it waits for go()."""
    if kind == "local":
        return Group(train_command(s), out, train_env(s))
    env = launcher_env(s, folder, seed)
    if kind == "docker":
        return Group([os.path.join(ROOT, "run_with_docker.sh")], out, env)
    return Job(s, out, env, name)


def is_count(value, low):
    """An int of at least `low`, read back from JSON (where true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_record(record, where):
    """A run's record as the study holds it, which the next driver acts on: ["pgid", pid, start ticks] or ["job",
    id]. The database may be another's: a pgid of 0 or 1 would signal the driver's own process group or every
    process, and a group without its leader's start time could be anyone's, so anything else is one line naming
    `where`."""
    if not (isinstance(record, list) and (
            len(record) == 3 and record[0] == "pgid" and is_count(record[1], 2) and is_count(record[2], 0)
            or len(record) == 2 and record[0] == "job" and is_count(record[1], 1))):
        raise InputError(f"{where}: the run record {record!r} is not a process group ['pgid', pid > 1, start] or a "
                         "Slurm job ['job', id]; this search did not write it")


def check_ending(records, where):
    """check_record for each of `records` a driver is about to end, and Slurm's commands for a job among them: a
    driver on a machine without Slurm says where the jobs are, before it ends anything."""
    for record in records:
        check_record(record, where)
    jobs = [str(record[1]) for record in records if record[0] == "job"]
    missing = [tool for tool in ("scancel", "squeue") if shutil.which(tool) is None]
    if jobs and missing:
        raise InputError(f"{where}: holds Slurm job(s) {', '.join(jobs)} to end, and there is no "
                         f"{' or '.join(missing)} on PATH here: run the search where Slurm's commands are (or end "
                         f"them there: scancel {' '.join(jobs)})")


def end_recorded(record, where, folder):
    """End what a killed driver's run left, from its record (check_ending's, `where` naming it): a process group (only
    while it is provably the run's, a process of it naming the run's `folder`: children.stop_recorded_group), or a
    Slurm job. What was done, in words for the caller's line: "its processes ended", or that they were left alone
    (a group that is not provably the run's, said in a line here)."""
    check_ending([record], where)
    kind, ident, *started = record
    if kind == "pgid" and not children.stop_recorded_group(ident, started[0], folder):
        print(f"search: process group {ident} is not provably the recorded run's (its leader started at another "
              f"time, or none of its processes names {folder}): left alone", flush=True)
        return "its recorded process group was left alone (above)"
    if kind == "job":
        end_job(ident)
    return "its processes ended"
