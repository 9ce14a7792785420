"""The processes a tool starts end with it. Each child runs in a session of its own (horovodrun and its ranks, a
tuner's worker, a search trial), so that a stop of the tool (SIGTERM, Ctrl-C: run_cli) can end each child's whole
group, and say so, instead of leaving it running under init. A tool that can be SIGKILLed with nothing left to end
its children (the rehearsal) ties them to its life (start_tied) and has its temporary folder removed after its end
(remove_after); a search's runs outlive a killed driver on purpose, and the next driver ends them from the study's
records, only when they are provably the run's (stop_recorded_group)."""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

_running = []  # the children started by this process and not yet waited for


def start(command, **kwargs):
    """subprocess.Popen of `command` in a new session, remembered until it has been waited for."""
    proc = subprocess.Popen(command, start_new_session=True, **kwargs)
    _running.append(proc)
    return proc


# What horovodrun's own script runs (horovod 0.28.1, the `horovodrun` that pip writes), after `import rn50_mx`.
HOROVODRUN = ("import sys, rn50_mx\n"
              "from horovod.runner import launch\n"
              "from rn50_mx.children import answer_build_questions\n"
              "answer_build_questions(launch)\n"
              "sys.argv[0] = 'horovodrun'\n"
              "sys.exit(launch.run_commandline())\n")


def answer_build_questions(launch):
    """Before it starts the ranks, horovodrun asks whether Horovod was built with Gloo or MPI (gloo_built, mpi_built:
    horovod/runner/launch.py:741-780) in a fork per framework, each importing horovod.tensorflow, horovod.torch, then
    horovod.mxnet and so MXNet's Python (horovod/common/util.py:64-104, 136-155): half a CPU-second a launch. The
    answer is the MXNet extension's own, its library's horovod_gloo_built and horovod_mpi_built read through
    Horovod's HorovodBasics as horovod.mxnet reads them (horovod/mxnet/mpi_ops.py:34, common/basics.py:307-332),
    the library loaded here without MXNet's Python: a 2-rank launch 0.35 CPU-seconds against 0.87. Where it does not
    load (no MXNet extension, or one that does not link), horovodrun asks as it does."""
    try:
        from horovod.common.basics import HorovodBasics

        folder = os.path.dirname(importlib.util.find_spec("horovod.mxnet").origin)
        library = HorovodBasics(os.path.join(folder, "mpi_ops.py"), "mpi_lib")
    except (AttributeError, ImportError, OSError, TypeError):
        return
    launch.gloo_built = lambda verbose=False: library.gloo_built()
    launch.mpi_built = lambda verbose=False: library.mpi_built()


def horovodrun(ranks, *options):
    """The command that starts `ranks` processes on this machine under Horovod's launcher, horovodrun, with its
    `options` (--gloo, ...), run by this Python: its script's own lines (horovod.runner.launch.run_commandline),
    after `import rn50_mx`, its questions on how Horovod was built answered without MXNet (answer_build_questions),
    and each rank's middleman, a fresh Python (multiprocessing's spawn,
    horovod/runner/common/util/safe_shell_exec.py:206), has no script to run again. A 2-rank launch took 0.87
    CPU-seconds against the script's 1.97, before answer_build_questions. The ranks import this Python's Horovod
    too, wherever its scripts went (a venv's bin, /usr/local/bin, ~/.local/bin). None when this Python has no
    Horovod."""
    if importlib.util.find_spec("horovod") is None:
        return None
    return [sys.executable, "-c", HOROVODRUN, *options, "-np", str(ranks), "-H", f"localhost:{ranks}"]


# The child of start_tied: a small Python that asks the kernel for SIGTERM when its parent ends (prctl
# PR_SET_PDEATHSIG = 1, linux/prctl.h; kept across exec), checks that the parent is still the one that started it,
# and execs the command in its place. A preexec_fn would do the same in a fork of a process that may hold MXNet's
# threads, which subprocess's documentation calls unsafe.
TIED = ("import ctypes, os, signal, sys\n"
        "if ctypes.CDLL(None).prctl(1, signal.SIGTERM) or os.getppid() != int(sys.argv[1]):\n"
        "    sys.exit('not started: the process that started it has ended')\n"
        "os.execvp(sys.argv[2], sys.argv[2:])\n")


def start_tied(command, **kwargs):
    """start(`command`), tied to this process's life: the kernel sends it SIGTERM when this process ends, however it
    ends (SIGKILL too), and horovodrun passes that on to its ranks. For a tool whose children are worth nothing
    without it (a search's runs are not: a later driver ends them from the study's records)."""
    return start([sys.executable, "-c", TIED, str(os.getpid()), *command], **kwargs)


_keepers = []  # the removers of remove_after, never waited for: they outlive this process


def remove_after(folder):
    """Remove `folder` once this process has ended, however it ends (SIGKILL too), and no process names it any more
    (its children's, which may still be writing there: up to KEEP_PATIENCE seconds). A process of its own does it,
    in a session of its own, reading a pipe only this process holds: the kernel closes it at this process's end."""
    read, write = os.pipe()
    try:
        _keepers.append((write, subprocess.Popen(
            [sys.executable, "-c", "import sys; from rn50_mx import children; children.keep(sys.argv[1])", folder],
            stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)))
    finally:
        os.close(read)


KEEP_PATIENCE = 120.0


def keep(folder):
    """remove_after's process: waits for the end of its stdin, then for the processes naming `folder` to end, then
    removes it."""
    sys.stdin.buffer.read()
    deadline = time.time() + KEEP_PATIENCE
    while time.time() < deadline and any(names(int(pid), folder) for pid in os.listdir("/proc")
                                         if pid.isdigit() and int(pid) != os.getpid()):
        time.sleep(0.5)
    shutil.rmtree(folder, ignore_errors=True)


def run(command, timeout, **kwargs):
    """subprocess.run's CompletedProcess (text, output captured) of a started child; a timeout ends its group."""
    proc = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    forget(proc)  # a stop (KeyboardInterrupt) leaves it remembered: run_cli's stop_all ends it
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def forget(proc):
    if proc in _running:
        _running.remove(proc)


def stop(proc, grace=10.0):
    """End `proc`'s process group: SIGTERM (horovodrun passes it to its ranks), SIGKILL after `grace` seconds."""
    stop_group(proc.pid, grace, proc.poll)
    proc.wait()
    forget(proc)


def stop_group(pgid, grace=10.0, reap=None):
    """SIGTERM to a process group, SIGKILL after `grace` seconds; returns once none of it is left. `reap` (a child's
    Popen.poll) collects a leader that is our child: until then its exit leaves a zombie that keeps the group."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        if reap:
            reap()
        if not alive(pgid):
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def started_at(pid):
    """The start time of process `pid` (clock ticks after boot: /proc/PID/stat field 22, proc(5)), or None when there
    is none: with the pid, what tells the process from a later one given the same pid (pid_max is often 32768)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    return int(fields[19])


def stop_recorded_group(pgid, started, folder):
    """stop_group for a group recorded earlier (by a driver since killed), only when one of its processes provably
    belongs to the run: its command line or environment names the run's `folder` (every run's does: its log is
    there), and its leader, if still there, is the recorded process (the same start time). A leaderless group is not
    enough: after the run's group is gone its pid can lead any other group, and a daemon's double fork leaves exactly
    such a group. False when the group is another's, which is left alone; True when the run's group was ended or is
    gone."""
    now = started_at(pgid)
    if now is not None and now != started:
        return False
    members = group_members(pgid)
    if not members:
        return True
    if not any(names(pid, folder) for pid in members):
        return False
    stop_group(pgid)
    return True


def group_members(pgid):
    """The pids of process group `pgid` now (/proc/PID/stat field 5, proc(5))."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue  # ended meanwhile
    return found


def names(pid, folder):
    """Whether process `pid`'s command line or environment names `folder`: an argument, or the value after an '=' (a
    variable, a --flag=value), that is the folder or a path in it. What ties a process to the run whose files are
    there."""
    if not os.path.isabs(folder):
        return False
    folders = {os.fsencode(folder.rstrip("/")), os.fsencode(os.path.realpath(folder))}
    for part in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for entry in entries:
            for value in {entry, entry.partition(b"=")[2]}:
                if value in folders or any(value.startswith(f + b"/") for f in folders):
                    return True
    return False


def alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_all():
    """End every child still running; returns how many there were."""
    running = [proc for proc in list(_running) if proc.poll() is None]
    for proc in running:
        stop(proc)
    _running.clear()
    return len(running)


def stop_on_sigterm():
    """SIGTERM (kill, Slurm, a launcher) ends the tool as Ctrl-C does: run_cli then ends its children."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
