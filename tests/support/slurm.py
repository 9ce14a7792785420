"""A real Slurm on this machine for the launch tests: munged, slurmctld and one slurmd per node, started by hand
from a generated slurm.conf and stopped by pid. Nodes are either this host (one node) or network namespaces
plugged by veth pairs into a bridge with private addresses (10.218.0.0/24: the host 10.218.0.1, node N
10.218.0.N+1) that the cluster creates and removes; slurmctld, the namespaces' slurmd and the ranks talk over
those addresses only. The tests use the real sbatch, srun, squeue and scontrol with SLURM_CONF pointing at the
generated file.
"""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psutil

from tests.support.procs import ROOT

# What the cluster runs, and the Makefile targets (SYSTEM_PACKAGES) whose rule installs them with apt-get.
BINARIES = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/lib/x86_64-linux-gnu/libpmix.so")
MAKE_TARGETS = ("/usr/sbin/slurmctld", "/usr/sbin/munged", "/usr/lib/x86_64-linux-gnu/libpmix.so")
NET = "10.218.0"  # the bridge's private addresses
BRIDGE = "rn50br"


def missing_packages():
    """Installs the Slurm packages through the Makefile when apt-get is here; the reason to skip when it is not
    (None when everything is installed)."""
    if all(os.path.exists(b) for b in BINARIES):
        return None
    if shutil.which("apt-get") is None:
        return "no apt-get to install slurm-wlm, munge and libpmix-dev (the Makefile's Debian packages)"
    subprocess.run(["make", "-C", ROOT, *MAKE_TARGETS], check=True, capture_output=True)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`nodes` = 0: one node, this host. `nodes` >= 2: that many nodes n1..nN, each a network namespace."""

    def __init__(self, nodes=0):
        self.dir = tempfile.mkdtemp(prefix="rn50-slurm-")
        os.chmod(self.dir, 0o755)  # munged requires its socket's folder to be searchable by all
        self.namespaces = [f"rn50n{i}" for i in range(1, nodes + 1)]
        self.daemons = []  # (name, Popen), stopped in reverse order
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf}

    # --- start -----------------------------------------------------------------------------------------------

    def start(self):
        try:
            self._make_namespaces()
            self._write_conf()
            self._start_munged()
            self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
            for name, netns in self.node_names():
                for folder in (f"spool-{name}", f"tmp-{name}", "nodetmp"):
                    os.makedirs(os.path.join(self.dir, folder), exist_ok=True)
                self._start(f"slurmd {name}", [*netns, "slurmd", "-D", "-f", self.conf, "-N", name])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def node_names(self):
        """(node name, command prefix that runs a command on that node)."""
        if not self.namespaces:
            return [(socket.gethostname(), [])]
        # nsenter enters the network namespace only: `ip netns exec` would also remount /sys, without the cgroup
        # tree slurmd reads at start.
        # Each node also gets its own TmpFS (where srun --mpi=pmix puts its per-step folders, named the same on
        # every node): the node's folder bind-mounted there in a mount namespace of its own.
        bind = f'mount --bind "$0" {self.dir}/nodetmp && exec "$@"'
        return [(f"n{i}", ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--propagation", "private",
                           "sh", "-c", bind, f"{self.dir}/tmp-n{i}"]) for i, ns in enumerate(self.namespaces, 1)]

    def _make_namespaces(self):
        if not self.namespaces:
            return
        commands = [f"ip link add {BRIDGE} type bridge", f"ip addr add {NET}.1/24 dev {BRIDGE}",
                    f"ip link set {BRIDGE} up"]
        for i, ns in enumerate(self.namespaces, 1):
            host_if, node_if = f"rn50h{i}", f"rn50v{i}"
            commands += [f"ip netns add {ns}", f"ip link add {host_if} type veth peer name {node_if}",
                         f"ip link set {host_if} master {BRIDGE}", f"ip link set {host_if} up",
                         f"ip link set {node_if} netns {ns}", f"ip -n {ns} addr add {NET}.{i + 1}/24 dev {node_if}",
                         f"ip -n {ns} link set {node_if} up", f"ip -n {ns} link set lo up"]
        for cmd in commands:
            subprocess.run(cmd.split(), check=True, capture_output=True, text=True)

    def _write_conf(self):
        d = self.dir
        host = socket.gethostname()
        if self.namespaces:  # slurmctld listens on every address; the nodes reach it through their veth peer
            nodes = "".join(f"NodeName=n{i} NodeHostname=n{i} NodeAddr={NET}.{i + 1} CPUs=2 State=UNKNOWN\n"
                            for i in range(1, len(self.namespaces) + 1))
            ctl = f"{host}({NET}.1)"
        else:
            nodes = f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN\n"
            ctl = f"{host}(127.0.0.1)"
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=rn50ci
SlurmctldHost={ctl}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it may start again (120 s by default: slurm.conf(5)), until the
# credentials of its first start have expired; 10 s here (5 is Slurm's minimum, src/common/slurm_cred.c), and the
# backfill scheduler, which starts it once eligible, looks every second (30 s by default).
AuthInfo=socket={d}/munge/munge.sock,cred_expire=10
SchedulerParameters=bf_interval=1
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
TmpFS={d}/nodetmp
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
# No cgroups here (a VM without systemd): Slurm tracks a job's processes by parentage and signals them all.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        os.makedirs(os.path.join(d, "state"))

    def _start_munged(self):
        munge = os.path.join(self.dir, "munge")
        os.makedirs(munge, mode=0o755)
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self._start("munged", ["munged", "-F", f"--socket={munge}/munge.sock", f"--key-file={key}",
                               f"--log-file={self.dir}/munged.log", f"--pid-file={munge}/munged.pid",
                               f"--seed-file={self.dir}/munged.seed"])
        self._wait(lambda: os.path.exists(f"{munge}/munge.sock"), "munged's socket")

    def _start(self, name, command):
        log = open(os.path.join(self.dir, name.replace(" ", "-") + ".out"), "w")
        self.daemons.append((name, subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True)))
        log.close()

    def _wait(self, ready, what, timeout=60):
        deadline = time.time() + timeout
        while not ready():
            for name, proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {self.logs()}")
            if time.time() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout} s: {self.logs()}")
            time.sleep(0.3)

    def _wait_idle(self):
        names = [name for name, _ in self.node_names()]
        self._wait(lambda: self.node_states(names) == ["idle"] * len(names), "the nodes' idle state")

    def node_states(self, names):
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return [states.get(n) for n in names]

    # --- use -------------------------------------------------------------------------------------------------

    def run(self, command, check=True, **kwargs):
        return subprocess.run(command, env={**self.env, **kwargs.pop("env", {})}, capture_output=True, text=True,
                              check=check, **kwargs)

    def job(self, job_id):
        """scontrol's fields of a job: {"JobState": "COMPLETED", "ExitCode": "0:0", ...}."""
        text = self.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def wait_job(self, job_id, timeout):
        """The job's fields once it left the queue (its state no longer pending, running or completing)."""
        deadline = time.time() + timeout
        while True:
            fields = self.job(job_id)
            if fields["JobState"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
                return fields
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} still {fields['JobState']} after {timeout} s")
            time.sleep(0.5)

    def logs(self):
        texts = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    texts.append(f"--- {name}\n{f.read()[-2000:]}")
        return "\n".join(texts)

    def job_processes(self):
        """The processes this cluster's jobs started (slurmstepd and tasks): their environment names its
        slurm.conf."""
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("SLURM_CONF") == self.conf and proc.pid not in self.daemon_pids():
                    found.append(proc)
        return found

    def trainings(self):
        """[(process, its SLURM_JOB_ID)] of the trainings this cluster's jobs run now. A process that ends while it is
        read is none of them: reading its command line raised NoSuchProcess, and a suite run failed on it twice
        (ranks_of's comprehension, then test_a_search_runs_its_trials_as_jobs_and_cancels_them_when_stopped's)."""
        found = []
        for proc in self.job_processes():
            with contextlib.suppress(psutil.Error):
                if "rn50_mx.train" in " ".join(proc.cmdline()):
                    found.append((proc, proc.environ().get("SLURM_JOB_ID")))
        return found

    def daemon_pids(self):
        return {proc.pid for _, proc in self.daemons}

    def _cancel_jobs(self):
        jobs = self.run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.split()
        if jobs:
            self.run(["scancel", "--full", *jobs], timeout=10)
            deadline = time.time() + 20
            while self.run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.split() and time.time() < deadline:
                time.sleep(0.5)

    # --- stop ------------------------------------------------------------------------------------------------

    def stop(self):
        """Every job cancelled, every daemon this cluster started stopped by pid (SIGTERM, then SIGKILL after 10 s),
        then any process a job left (slurmstepd detaches from slurmd), then the namespaces."""
        with contextlib.suppress(Exception):
            self._cancel_jobs()
        for name, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.daemons = []
        for proc in self.job_processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        for ns in self.namespaces:  # deleting a namespace deletes its veth pair
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run(["ip", "netns", "del", ns], check=True, capture_output=True)
        if self.namespaces:
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run(["ip", "link", "del", BRIDGE], check=True, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
