"""The processes a tool starts end with it. Each child runs in a session of its own (horovodrun and its ranks, a
tuner's worker, a search trial), so that a stop of the tool (SIGTERM, Ctrl-C: run_cli) can end each child's whole
group, and say so, instead of leaving it running under init."""
import os
import signal
import subprocess
import time

_running = []  # the children started by this process and not yet waited for


def start(command, **kwargs):
    """subprocess.Popen of `command` in a new session, remembered until it has been waited for."""
    proc = subprocess.Popen(command, start_new_session=True, **kwargs)
    _running.append(proc)
    return proc


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
    stop_group(proc.pid, grace)
    proc.wait()
    forget(proc)


def stop_group(pgid, grace=10.0):
    """SIGTERM to a process group, SIGKILL after `grace` seconds; returns once none of it is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace
    while time.time() < deadline:
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


def stop_recorded_group(pgid, started):
    """stop_group for a group recorded earlier (by a driver since killed): only when its leader is still the recorded
    process (the same start time), or gone while members remain (the kernel reuses no pid while its group lives).
    False when the pid now names another process, which is left alone."""
    now = started_at(pgid)
    if now is not None and now != started:
        return False
    stop_group(pgid)
    return True


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
