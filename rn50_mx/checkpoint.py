"""Checkpoints: everything a run's future depends on, written so that a stop at any moment leaves a usable one, and
read back so that the resumed run continues exactly as the uninterrupted run would have (tests/test_checkpoint.py).

A checkpoint is a folder DIR/step-N, N the train steps done:
  meta.json            the run (settings, ranks, base seed), where it stands (epoch, step, MLPerf block), every
                       other file's size and CRC-32, and the --mllog-file's path, size and CRC-32 (the resumed run
                       appends to that file); written last: a folder without it is partial
  params               rank 0's parameters (mx.nd.save), BatchNorm running statistics included
  trainer              rank 0's Trainer.save_states: momentum, fp32 master weights, update counts, and the pickled
                       optimizer with its schedule (optim.schedule is a functools.partial: a lambda cannot be pickled)
  rank<R>.aux          rank R's BatchNorm running statistics (each rank's own: BatchNorm is over the local batch)
  rank<R>.json         rank R's iterator positions and skipped records, Python and NumPy RNG states, the epoch's loss
  rank<R>.<split>.dali rank R's DALI pipeline states (Pipeline.checkpoint(): reader position, shuffle buffer and the
                       random operators' generators)
Weights and optimizer states are the same on every rank after each step (the gradients are allreduced): rank 0's stand
for all. MXNet's own generator (mx.random) has no state to save in 1.9.1; nothing draws from it after the model's
initialisation, which the resumed run repeats with the same seed (a test checks both).

Writing: every rank writes its files into DIR/.tmp-step-N, each fsynced; once every rank has, rank 0 adds meta.json,
fsyncs, and renames the folder to step-N: that one rename makes it current. The previous checkpoint stays (a newest one
found corrupt falls back to it); older ones are deleted. DIR/lock keeps a second run off the folder.

Stopping: with a checkpoint folder, SIGTERM and SIGUSR1 (what Slurm's --signal sends before the time limit) only ask
for a stop. Every CHECK_PERIOD steps the ranks sum their requests in a tiny allreduce that is read one period later,
so that no step waits for it; all ranks see the same sum at the same step, write a checkpoint there and exit 75.
Without a folder nothing changes: the default actions end a rank at once (dist.py says why).
"""
import contextlib
import dataclasses
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import sys

import mxnet as mx
import numpy as np

from . import config, dist, files
from .errors import InputError

STEP = re.compile(r"^step-(\d+)$")
META = "meta.json"
CHECK_PERIOD = 4  # steps between the stop-flag allreduces: a stop lands 4 to 8 steps after its signal
RESUMABLE = "resumable"  # fit's status when it stopped after writing a checkpoint
RESUMABLE_EXIT = 75  # the exit status of a resumable stop (EX_TEMPFAIL), which trials.sh reports as such
KEPT = 2  # complete checkpoints kept: the newest and the one before it
FINISHED = "finished"  # written when the run ends with run_stop: its checkpoints are not to be resumed
# Settings that do not change what a run computes; every other one must match the checkpoint's. The world size is
# compared instead of the node and GPU counts.
FREE = {"checkpoint_dir", "checkpoint_every", "save_model", "mllog_file", "disp_batches", "exit_timeout",
        "cache_cleared", "submission_org", "dgxsystem", "dgxnnodes", "dgxngpu", "seed"}


@dataclasses.dataclass
class Position:
    """Where a run stands: `step` steps of the 0-based `epoch` done (all of them: its eval is still to come), the
    first epoch of the MLPerf block in progress, and this rank's summed loss and images of the epoch so far."""
    epoch: int = 0
    step: int = 0
    first: int = 0
    loss: float = 0.0
    images: int = 0


# --- files --------------------------------------------------------------------------------------------------

def fsync_path(path):
    """Flush a file's or a folder's entry to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path, payload):
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def summary(folder):
    """{file: [size, CRC-32]} of every file in `folder` but meta.json."""
    return {name: [os.path.getsize(os.path.join(folder, name)), files.crc32(os.path.join(folder, name))]
            for name in sorted(os.listdir(folder)) if name != META}


def problem(folder):
    """Why the checkpoint in `folder` cannot be used (partial, corrupt), or None."""
    try:
        with open(os.path.join(folder, META)) as f:
            meta = json.load(f)
        listed = meta["files"]
    except FileNotFoundError:
        return f"no {META}: its writer stopped before the end"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{META} unreadable ({err})"
    wanted = {"params", "trainer"} | {f"rank{r}.json" for r in range(meta.get("world", 0))}
    missing = sorted(wanted - set(listed))
    if missing:
        return f"{META} lists no {missing[0]}"
    for name, (size, value) in listed.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        if os.path.getsize(path) != size:
            return f"{name} has {os.path.getsize(path)} bytes, not {size}"
        if files.crc32(path) != value:
            return f"{name} is corrupt (CRC-32 differs)"
    return None


def read_meta(folder):
    with open(os.path.join(folder, META)) as f:
        return json.load(f)


# --- settings -----------------------------------------------------------------------------------------------

def differences(saved, s, world):
    """'--flag VALUE (checkpoint: OLD)' for each setting that decides the data order or the numerics and differs
    from the checkpoint's (the seed only when given: a run without one takes the checkpoint's)."""
    now = {**{f: getattr(s, f) for f in config.FIELDS if f not in FREE}, "ranks": world}
    was = {**saved["settings"], "ranks": saved["world"]}
    if s.seed is not None:
        now["seed"], was["seed"] = s.seed, saved["seed"]
    return [f"{config.flag_name(k) if k != 'ranks' else 'ranks'} {now[k]} (checkpoint: {was.get(k)})"
            for k in now if now[k] != was.get(k)]


# --- the folder ---------------------------------------------------------------------------------------------

class Checkpoints:
    """The checkpoint folder of a run (--checkpoint-dir), as one rank sees it. Rank 0 locks it, picks the checkpoint
    to resume from and writes meta.json; every rank writes and reads its own files."""

    def __init__(self, s, d):
        self.s, self.d, self.dir = s, d, s.checkpoint_dir
        self.lock = lock(self.dir) if d.rank == 0 else None
        if d.rank == 0 and os.path.exists(os.path.join(self.dir, FINISHED)):
            with open(os.path.join(self.dir, FINISHED)) as f:
                raise InputError(f"--checkpoint-dir {self.dir}: the run there has ended ({f.read().strip()}); give "
                                 "another folder (python -m rn50_mx.evaluate --checkpoint-dir reads it)")
        self.resume = agree(d, self.dir)  # the folder of the newest usable checkpoint, or None
        self.meta = read_meta(self.resume) if self.resume else None
        if self.meta:
            wrong = differences(self.meta, s, d.size)
            if wrong:
                raise InputError(f"{self.resume}: written with other settings, which would change the run: "
                                 + "; ".join(wrong))
        self.parts = None

    def resumes(self):
        """(checkpoint folder, log_mark of the MLPerf log then) when resuming a run that wrote an --mllog-file: the
        resumed run continues that file (mlperf_log.configure)."""
        mark = self.meta and self.meta.get("mllog")
        return (self.resume, mark) if mark else None

    def attach(self, net, trainer, iters, steps_per_epoch, base_seed):
        """What a checkpoint saves: the model, its trainer, the iterators by split, and the run's numbers."""
        self.parts = (net, trainer, {k: it for k, it in iters.items() if it is not None}, steps_per_epoch, base_seed)

    def periodic(self, epoch):
        """Whether --checkpoint-every asks for a checkpoint after 0-based `epoch`."""
        return self.s.checkpoint_every > 0 and (epoch + 1) % self.s.checkpoint_every == 0

    def restore(self):
        """The Position of the checkpoint being resumed (a new one without), after putting back every state."""
        if self.resume is None:
            return Position()
        net, trainer, iters, _, _ = self.parts
        folder, rank = self.resume, self.d.rank
        params, aux = mx.nd.load(os.path.join(folder, "params")), mx.nd.load(os.path.join(folder, f"rank{rank}.aux"))
        for name, p in net.collect_params().items():
            p.set_data(aux.get(name, params[name]))
        trainer.load_states(os.path.join(folder, "trainer"))
        with open(os.path.join(folder, f"rank{rank}.json")) as f:
            state = json.load(f)
        for split, it in iters.items():
            dali = os.path.join(folder, f"rank{rank}.{split}.dali")
            it.restore(state["iters"][split], open(dali, "rb").read() if os.path.exists(dali) else None)
        version, internal, gauss = state["python_random"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy_random"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        mx.nd.waitall()
        return Position(**state["position"])

    def save(self, pos):
        """Write a checkpoint of `pos` (every rank calls it at the same step); returns its folder. A rank that cannot
        write makes every rank raise the same InputError; the previous checkpoint stays current."""
        net, trainer, iters, steps, base_seed = self.parts
        name = f"step-{pos.epoch * steps + pos.step}"
        tmp, final = os.path.join(self.dir, ".tmp-" + name), os.path.join(self.dir, name)
        mx.nd.waitall()  # the last update's arrays are read below
        failure = self.attempt(lambda: self.d.rank == 0 and fresh_folder(tmp))
        failure = failure or self.attempt(lambda: self.write_rank_files(tmp, pos, net, trainer, iters))
        failure = failure or self.attempt(lambda: self.d.rank == 0 and self.commit(tmp, final, pos, base_seed))
        if failure:
            if self.d.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # frees what a full disk took
            raise InputError(f"{self.dir}: cannot write a checkpoint ({failure}); the previous one stays current")
        return final

    def finish(self, status):
        """Rank 0, after run_stop: mark the folder so that no later run resumes a run that has ended."""
        if self.d.rank == 0:
            write_bytes(os.path.join(self.dir, FINISHED), f"run_stop {status}\n".encode())

    def attempt(self, action):
        """Run `action` on this rank; the first rank's failure, as text, on every rank (None when all succeeded)."""
        error = ""
        try:
            action()
        except (OSError, mx.base.MXNetError) as err:  # mx.nd.save reports a failed write as an MXNetError
            error = f"rank {self.d.rank}: {first_line(err)}"
        failed = self.d.allreduce_sum(mx.nd.array([bool(error)], ctx=dist.HOST, dtype="int32")).asscalar()
        return (error or "on another rank") if failed else None

    def write_rank_files(self, tmp, pos, net, trainer, iters):
        rank = self.d.rank
        params = {name: p.data() for name, p in net.collect_params().items()}
        if rank == 0:
            mx.nd.save(os.path.join(tmp, "params"), params)
            trainer.save_states(os.path.join(tmp, "trainer"))
        aux = {name: p.data() for name, p in net.collect_params().items() if p.grad_req == "null"}
        mx.nd.save(os.path.join(tmp, f"rank{rank}.aux"), aux)
        states = {}
        for split, it in iters.items():
            states[split], dali = it.state()
            if dali is not None:
                write_bytes(os.path.join(tmp, f"rank{rank}.{split}.dali"), dali)
        np_state = np.random.get_state()
        state = {"position": dataclasses.asdict(pos), "iters": states, "python_random": random.getstate(),
                 "numpy_random": [np_state[0], np_state[1].tolist(), *np_state[2:]]}
        write_bytes(os.path.join(tmp, f"rank{rank}.json"), json.dumps(state).encode())
        for name in ("params", "trainer", f"rank{rank}.aux"):
            if os.path.exists(os.path.join(tmp, name)):
                fsync_path(os.path.join(tmp, name))

    def commit(self, tmp, final, pos, base_seed):
        """Rank 0, once every rank has written: meta.json, then the one rename that makes the checkpoint current."""
        meta = {"settings": {f: getattr(self.s, f) for f in config.FIELDS if f not in FREE},
                "world": self.d.size, "seed": base_seed, "epoch": pos.epoch, "step": pos.step,
                "files": summary(tmp)}
        if self.s.mllog_file:  # what the log holds now: the resumed run appends to this very file
            meta["mllog"] = files.log_mark(self.s.mllog_file)
        write_bytes(os.path.join(tmp, META), json.dumps(meta, indent=1).encode())
        fsync_path(tmp)
        if os.path.exists(final):  # a step written before by a run whose later checkpoints were refused
            os.rename(final, final + ".replaced")
        os.rename(tmp, final)
        fsync_path(self.dir)
        for old in complete(self.dir)[:-KEPT]:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(final + ".replaced", ignore_errors=True)


def first_line(err):
    """An OSError's reason, or the last line of an MXNetError (its first lines are a C++ stack)."""
    return getattr(err, "strerror", None) or str(err).strip().splitlines()[-1].replace("MXNetError: ", "")


def fresh_folder(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def complete(folder):
    """The step-N folders in `folder`, oldest first."""
    steps = sorted((int(m.group(1)), name) for name in os.listdir(folder) for m in [STEP.match(name)] if m)
    return [os.path.join(folder, name) for _, name in steps]


def lock(folder):
    """Create `folder` if needed and hold its lock for the life of the process; one line when another run holds it
    or the folder cannot be written."""
    try:
        os.makedirs(folder, exist_ok=True)
        f = open(os.path.join(folder, "lock"), "a+")
    except OSError as err:
        raise InputError(f"--checkpoint-dir {folder}: cannot write there ({err.strerror})") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        raise InputError(f"--checkpoint-dir {folder}: in use by another run ({f.read().strip() or 'unknown'})"
                         ) from None
    f.truncate(0)
    f.write(f"process {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f


def newest_usable(folder, set_aside=True):
    """The newest complete checkpoint that passes its checks, or None. Each one refused is one line on stderr; with
    set_aside (the run that holds the lock), renamed out of the way, and a partial one left by a writer that
    stopped is removed."""
    for name in os.listdir(folder) if set_aside else ():
        if name.startswith(".tmp-"):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            print(f"rn50_mx: {os.path.join(folder, name)}: a partial checkpoint (its writer stopped): removed",
                  file=sys.stderr)
    found, refused = complete(folder), []
    for path in reversed(found):
        why = problem(path)
        if why is None:
            for bad, reason in refused:
                if set_aside:
                    os.rename(bad, bad + ".refused")
                print(f"rn50_mx: {bad}: refused ({reason}){'; renamed *.refused' if set_aside else ''}; using "
                      f"{os.path.basename(path)}", file=sys.stderr)
            return path
        refused.append((path, why))
    if refused:
        raise InputError(f"--checkpoint-dir {folder}: no usable checkpoint: " +
                         "; ".join(f"{os.path.basename(p)} ({why})" for p, why in refused))
    return None


def agree(d, folder):
    """The checkpoint every rank resumes from: rank 0's choice (its step, summed over ranks)."""
    chosen = newest_usable(folder) if d.rank == 0 else None
    step = int(STEP.match(os.path.basename(chosen)).group(1)) + 1 if chosen else 0
    step = int(d.allreduce_sum(mx.nd.array([step], ctx=dist.HOST, dtype="int32")).asscalar())
    return os.path.join(folder, f"step-{step - 1}") if step else None


# --- stopping -----------------------------------------------------------------------------------------------

class Stops:
    """SIGTERM and SIGUSR1 ask for a stop; `agreed(step)` says, on every rank alike, when the ranks have agreed to
    stop. A second signal ends the process at once, as without a checkpoint folder."""

    def __init__(self, d):
        self.d, self.asked, self.pending = d, False, None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self.ask)

    def ask(self, signum, frame):
        if self.asked:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.asked = True

    def agreed(self, step):
        """After global step `step`: whether any rank had asked when the last check period began."""
        if step % CHECK_PERIOD:
            return False
        pending = self.pending
        self.pending = self.d.allreduce_sum(mx.nd.array([self.asked], ctx=dist.HOST, dtype="int32"))
        return pending is not None and pending.asscalar() > 0


def default_signals():
    """After training: SIGTERM and SIGUSR1 end the process at once again (its teardown has nothing to save)."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


class NoStops:
    """Without a checkpoint folder: the signals keep their default actions and no step checks anything."""

    def agreed(self, step):
        return False


# --- the saved model --------------------------------------------------------------------------------------

MODEL_FILES = ("-0000.params", "-symbol.json")


def model_output(s, d):
    """What --save-model will write, checked and owned from the start of the run (rank 0 writes it): an existing model
    is kept, an unwritable folder or a second run saving there is one line now, not after the training."""
    if not s.save_model or d.rank != 0:
        return contextlib.nullcontext()
    for suffix in MODEL_FILES:
        if os.path.exists(s.save_model + suffix):
            raise InputError(f"--save-model {s.save_model}: {s.save_model + suffix} exists; the model there is kept "
                             "(give another path)")
    return files.owned(s.save_model)


def save_model(net, path):
    """PATH-symbol.json and PATH-0000.params (HybridBlock.export), each written under a temporary name first."""
    tmp = files.temp_name(path)
    try:
        net.export(tmp)
        for suffix in MODEL_FILES:
            fsync_path(tmp + suffix)
            os.replace(tmp + suffix, path + suffix)
    except (OSError, mx.base.MXNetError) as err:
        raise InputError(f"--save-model {path}: cannot write ({first_line(err)})") from None
    finally:
        files.remove_quietly(*(tmp + suffix for suffix in MODEL_FILES))
    return tuple(path + suffix for suffix in MODEL_FILES)
