"""The checkpoint folder of a run: the lock, choosing the checkpoint to resume from, writing one and reading it
back, and which settings a resumed run must share with its checkpoint's run (those that decide the data order and
the numerics)."""
import dataclasses
import json
import os
import random
import re
import shutil
import sys

import mxnet as mx
import numpy as np

from .. import config, dist, ema, files, mlperf_log, watchdog
from ..errors import InputError
from . import trainer_file
from .contents import Diverged, dali_problem
from .disk import META, first_line, fsync_path, problem, read_json, read_meta, summary, write_bytes

STEP = re.compile(r"^step-(\d+)$")
KEPT = 2  # complete checkpoints kept: the newest and the one before it
FINISHED = "finished"  # written when the run ends with run_stop: its checkpoints are not to be resumed

# Settings that do not change what a run computes (--standin: where it runs; --bfloat16-fallback: how the dtype was
# chosen, the resolved dtype being compared); every other one must match the checkpoint's. The world size is compared
# instead of the node and GPU counts.
FREE = {"checkpoint_dir", "checkpoint_every", "save_model", "mllog_file", "disp_batches", "exit_timeout",
        "stall_seconds", "cache_cleared", "submission_org", "dgxsystem", "dgxnnodes", "dgxngpu", "seed", "standin",
        "standin_sm", "bfloat16_fallback"}


def differences(saved, s, world):
    """'--flag VALUE (checkpoint: OLD)' for each setting that decides the data order or the numerics and differs
    from the checkpoint's (the seed only when given: a run without one takes the checkpoint's). A setting the
    checkpoint does not record is older than it and was at its default (RN50_NORMCONV_WIRING: stats-fl)."""
    now = {**{f: getattr(s, f) for f in config.FIELDS if f not in FREE}, "ranks": world}
    was = {**{f: config.FIELDS[f].default for f in now if f in config.FIELDS}, **saved["settings"],
           "ranks": saved["world"]}
    if s.seed is not None:
        now["seed"], was["seed"] = s.seed, saved["seed"]
    return [f"{config.flag_name(k) if k != 'ranks' else 'ranks'} {now[k]} (checkpoint: {was.get(k)})"
            for k in now if now[k] != was.get(k)]


@dataclasses.dataclass
class Position:
    """Where a run stands: `step` steps of the 0-based `epoch` done (all of them: its eval is still to come), the
    first epoch of the MLPerf block in progress, and this rank's summed loss and images of the epoch so far."""
    epoch: int = 0
    step: int = 0
    first: int = 0
    loss: float = 0.0
    images: int = 0


class Checkpoints:
    """The checkpoint folder of a run (--checkpoint-dir), as one rank sees it. Rank 0 locks it, picks the checkpoint
    to resume from and writes meta.json; every rank writes and reads its own files."""

    def __init__(self, s, d):
        self.s, self.d, self.dir = s, d, s.checkpoint_dir
        self.lock = lock(self.dir) if d.rank == 0 else None
        if d.rank == 0:
            refuse_ended(self.dir)
        # the folder of the newest usable checkpoint, or None
        self.resume = agree(d, self.dir, lambda path: resume_problem(path, s, d))
        self.meta = read_meta(self.resume) if self.resume else None
        if self.meta:
            wrong = differences(self.meta, s, d.size)
            if wrong:
                raise InputError(f"{self.resume}: written with other settings, which would change the run: "
                                 + "; ".join(wrong))
        self.parts = None
        self.current = self.resume  # the checkpoint a resume would use now: the one resumed, then each written

    def resumes(self):
        """(checkpoint folder, log_mark of the MLPerf log then) when resuming a run that wrote an --mllog-file: the
        resumed run continues that file (mlperf_log.configure)."""
        mark = self.meta and self.meta.get("mllog")
        return (self.resume, mark) if mark else None

    def attach(self, net, trainer, iters, steps_per_epoch, base_seed, average=ema.Off()):
        """What a checkpoint saves: the model, its trainer, the iterators by split, the run's numbers and its weight
        EMA (ema.EMA or ema.Off)."""
        self.parts = (net, trainer, {k: it for k, it in iters.items() if it is not None}, steps_per_epoch, base_seed,
                      average)

    def check_fits(self, steps):
        """Before run_start: the checkpoint's position and update count within a run of `steps` steps per epoch (its
        data decide them: contents.py checks what needs no data). A forged num_update resumed at the end learning
        rate."""
        if not self.meta:
            return
        epoch, step = self.meta["epoch"], self.meta["step"]
        updates = read_json(os.path.join(self.resume, trainer_file.COUNTS))["num_update"]
        read = read_json(os.path.join(self.resume, f"rank{self.d.rank}.json"))["iters"]["train"]["position"]
        if step > steps or read > steps or updates > epoch * steps + step:
            raise InputError(f"{self.resume}: position epoch {epoch} step {step} (its reader at {read}) with {updates} "
                             "updates does not fit "
                             f"this run's {steps} steps per epoch; give the run's data (or another --checkpoint-dir)")

    def periodic(self, epoch):
        """Whether --checkpoint-every asks for a checkpoint after 0-based `epoch`."""
        return self.s.checkpoint_every > 0 and (epoch + 1) % self.s.checkpoint_every == 0

    def restore(self):
        """The Position of the checkpoint being resumed (a new one without), after putting back every state."""
        if self.resume is None:
            return Position()
        net, trainer, iters, _, _, average = self.parts
        folder, rank = self.resume, self.d.rank
        params, aux = mx.nd.load(os.path.join(folder, "params")), mx.nd.load(os.path.join(folder, f"rank{rank}.aux"))
        # saved from the host (write_rank_files): loading allocates nothing on a device; set_data copies onto ours
        for name, p in net.collect_params().items():
            p.set_data(aux.get(name, params[name]))
        trainer_file.restore(trainer, folder)
        if average.state() is not None:
            saved = os.path.join(folder, f"rank{rank}.ema")
            average.restore(mx.nd.load(saved), saved)
        with open(os.path.join(folder, f"rank{rank}.json")) as f:
            state = json.load(f)
        for split, it in iters.items():  # a .dali file meta.json does not list (and CRC-check) is not the run's
            dali = f"rank{rank}.{split}.dali"
            it.restore(state["iters"][split],
                       open(os.path.join(folder, dali), "rb").read() if dali in self.meta["files"] else None)
        version, internal, gauss = state["python_random"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy_random"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        mx.nd.waitall()
        return Position(**state["position"])

    def save(self, pos):
        """Write a checkpoint of `pos` (every rank calls it at the same step); returns its folder. A rank that cannot
        write makes every rank raise the same InputError, which names the checkpoint that stays current (or says
        that there is none)."""
        net, trainer, iters, steps, base_seed, average = self.parts
        name = f"step-{pos.epoch * steps + pos.step}"
        tmp, final = os.path.join(self.dir, ".tmp-" + name), os.path.join(self.dir, name)
        watchdog.mark(watchdog.CHECKPOINT)
        mx.nd.waitall()  # the last update's arrays are read below
        failure = self.attempt(lambda: self.d.rank == 0 and fresh_folder(tmp))
        failure = failure or self.attempt(lambda: self.write_rank_files(tmp, pos, net, trainer, iters, average))
        failure = failure or self.attempt(lambda: self.d.rank == 0 and self.commit(tmp, final, pos, base_seed))
        if failure:
            if self.d.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # frees what a full disk took
            kept = (f"{os.path.basename(self.current)} stays current" if self.current else
                    "there is no checkpoint: a resume would start the run anew")
            raise InputError(f"{self.dir}: cannot write a checkpoint ({failure}); {kept}")
        self.current = final
        return final

    def finish(self, status):
        """Rank 0, after run_stop: mark the folder so that no later run resumes a run that has ended."""
        if self.d.rank == 0:  # under a temporary name, renamed: a link planted at the mark's name is replaced
            path = os.path.join(self.dir, FINISHED)
            tmp = files.temp_name(path)
            try:
                write_bytes(tmp, f"run_stop {status}\n".encode())
                os.replace(tmp, path)
            except OSError as err:
                raise files.os_error(path, err, "write") from None
            finally:
                files.remove_quietly(tmp)

    def attempt(self, action):
        """Run `action` on this rank; the first rank's failure, as text, on every rank (None when all succeeded)."""
        error = ""
        try:
            action()
        except (OSError, mx.base.MXNetError) as err:  # mx.nd.save reports a failed write as an MXNetError
            error = f"rank {self.d.rank}: {first_line(err)}"
        failed = self.d.host_sum([bool(error)]).asscalar()
        return (error or "on another rank") if failed else None

    def write_rank_files(self, tmp, pos, net, trainer, iters, average):
        """This rank's files. Arrays are saved as host copies: mx.nd.load puts an array back on the device it was
        saved from, so a device array would make every rank's restore allocate (and open a CUDA context) on GPU 0,
        and fail where a task sees one GPU."""
        rank = self.d.rank
        params = {name: p.data().as_in_context(dist.HOST) for name, p in net.collect_params().items()}
        if rank == 0:
            mx.nd.save(os.path.join(tmp, "params"), params)
            trainer_file.save(trainer, tmp)
        aux = {name: p.data().as_in_context(dist.HOST) for name, p in net.collect_params().items()
               if p.grad_req == "null"}
        mx.nd.save(os.path.join(tmp, f"rank{rank}.aux"), aux)
        if average.state() is not None:  # each rank's own, as its BatchNorm statistics are
            mx.nd.save(os.path.join(tmp, f"rank{rank}.ema"),
                       {name: a.as_in_context(dist.HOST) for name, a in average.state().items()})
        states = {}
        for split, it in iters.items():
            states[split], dali = it.state()
            if dali is not None:
                write_bytes(os.path.join(tmp, f"rank{rank}.{split}.dali"), dali)
        np_state = np.random.get_state()
        state = {"position": dataclasses.asdict(pos), "iters": states, "python_random": random.getstate(),
                 "numpy_random": [np_state[0], np_state[1].tolist(), *np_state[2:]]}
        write_bytes(os.path.join(tmp, f"rank{rank}.json"), json.dumps(state).encode())
        for name in ("params", trainer_file.STATES, trainer_file.COUNTS, f"rank{rank}.aux", f"rank{rank}.ema"):
            if os.path.exists(os.path.join(tmp, name)):
                fsync_path(os.path.join(tmp, name))

    def commit(self, tmp, final, pos, base_seed):
        """Rank 0, once every rank has written: meta.json, then the one rename that makes the checkpoint current."""
        meta = {"settings": {f: getattr(self.s, f) for f in config.FIELDS if f not in FREE},
                "world": self.d.size, "seed": base_seed, "epoch": pos.epoch, "step": pos.step,
                "files": summary(tmp)}
        if self.s.mllog_file:  # what the log holds now: the resumed run appends to this very file
            meta["mllog"] = mlperf_log.log_mark(self.s.mllog_file)
        write_bytes(os.path.join(tmp, META), json.dumps(meta, indent=1).encode())
        fsync_path(tmp)
        if os.path.exists(final):  # a step written before by a run whose later checkpoints were refused
            os.rename(final, final + ".replaced")
        os.rename(tmp, final)
        fsync_path(self.dir)
        for old in complete(self.dir)[:-KEPT]:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(final + ".replaced", ignore_errors=True)


def fresh_folder(path):
    remove_partial(path)
    os.makedirs(path)


def complete(folder):
    """The step-N folders in `folder`, oldest first."""
    steps = sorted((int(m.group(1)), name) for name in listed(folder) for m in [STEP.match(name)] if m)
    return [os.path.join(folder, name) for _, name in steps]


def listed(folder):
    """The names in the checkpoint folder, or one line saying why it cannot be listed."""
    try:
        return os.listdir(folder)
    except OSError as err:
        raise InputError(f"--checkpoint-dir {folder}: cannot read ({err.strerror})") from None


def lock(folder):
    """Create `folder` if needed and hold its lock (files.noted_lock) for the life of the process, saying who holds it;
    one line when another run holds it or the folder cannot be written."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise InputError(f"--checkpoint-dir {folder}: cannot write there ({err.strerror})") from None
    return files.noted_lock(os.path.join(folder, "lock"),
                            lambda note: f"--checkpoint-dir {folder}: in use by another run ({note})")


def model_arrays(folder):
    """{name: host array} of the model the checkpoint in `folder` holds: its parameters with its ranks' BatchNorm
    statistics averaged, the one model a multi-rank run's eval judges (train.one_model); for a run with a weight EMA
    (rank<R>.ema), the averages its evals judged instead: the weights' (the same on every rank) with the ranks'
    statistics averaged."""
    meta = read_meta(folder)
    averaged = "rank0.ema" in meta["files"]  # listed and CRC-checked: a file merely there decides nothing
    ranks = [mx.nd.load(os.path.join(folder, f"rank{r}.{'ema' if averaged else 'aux'}")) for r in range(meta["world"])]
    params = ranks[0] if averaged else mx.nd.load(os.path.join(folder, "params"))
    stats = set(mx.nd.load(os.path.join(folder, "rank0.aux")))
    return {name: mean([arrays[name] for arrays in ranks]) if name in stats else array
            for name, array in params.items()}


def set_params(net, arrays, where):
    """`net`'s parameters from host `arrays` (model_arrays'). An EMA's averages are float32 where the weights are
    float16: set_data moves an array to the device in its own type, then casts it there (NDArray._prepare_value_nd),
    since a CUDA build copies between devices only within one type (ndarray_function.cu, Copy<cpu, gpu>)."""
    for name, p in net.collect_params().items():
        if name not in arrays or arrays[name].shape != p.shape:
            raise InputError(f"{where}: written for another model ({name}); give its settings")
        p.set_data(arrays[name])


def mean(arrays):
    """The ranks' mean of one statistic; the array itself when they agree (after an eval: exact, whatever the
    number of ranks)."""
    if all((a == arrays[0]).min().asscalar() for a in arrays[1:]):
        return arrays[0]
    return mx.nd.add_n(*arrays) / len(arrays)


def refuse_ended(folder):
    """One line for a folder whose run ended with run_stop: its checkpoints are not resumed. The mark is read as
    files.read_text reads (a FIFO planted there hung the resume, a folder or an unreadable file was a traceback), and
    anything at its name but a mark is refused as well: the run there may have ended."""
    path = os.path.join(folder, FINISHED)
    if not os.path.lexists(path):
        return
    try:
        said = files.read_text(path, 200).strip()
    except InputError as err:
        raise InputError(f"--checkpoint-dir {folder}: {err}, where a run marks its end; give another folder (or "
                         "remove it)") from None
    said = said or f"an empty {FINISHED} mark"
    raise InputError(f"--checkpoint-dir {folder}: the run there has ended ({said}); give another folder (python -m "
                     "rn50_mx.evaluate --checkpoint-dir reads it)")


def resume_problem(folder, s, d):
    """What only a resume reads of the checkpoint in `folder` (disk.problem passed), for the run of settings `s`, on
    this rank of `d`: its own DALI states, restored by DALI into the pipelines of the checkpoint's settings on its
    own device (contents.dali_problem), or None. A rank the checkpoint has none for has nothing to check (a run on
    another world size is refused once the ranks agree, naming it: differences)."""
    meta = read_meta(folder)
    if d.rank >= meta["world"]:
        return None
    recorded = config.Settings(**{**{f: getattr(s, f) for f in FREE}, **meta["settings"]})
    ctx = dist.context(s, d.local_rank)
    return dali_problem(folder, meta, recorded, d.rank, ctx.device_id if ctx.device_type == "gpu" else None)


def newest_usable(folder, set_aside=True, deeper=lambda path: None):
    """The newest complete checkpoint that passes its checks (disk.problem, then deeper(its folder): a problem or
    None), or None. Each one refused is one line on stderr; with set_aside (the run that holds the lock), renamed
    out of the way, and a partial one left by a writer that stopped is removed."""
    for name in listed(folder) if set_aside else ():
        if name.startswith(".tmp-"):
            print(f"rn50_mx: {os.path.join(folder, name)}: {remove_partial(os.path.join(folder, name))}",
                  file=sys.stderr)
    found, refused = complete(folder), []
    for path in reversed(found):
        try:
            why = problem(path) or deeper(path)
        except Diverged as err:
            raise InputError(f"--checkpoint-dir {folder}: {os.path.basename(path)}: {err}; its checkpoints are not "
                             "resumed (an older one would diverge again): give other settings and another folder")
        if why is None:
            for bad, reason in refused:
                moved = f"; renamed {os.path.basename(set_apart(bad, folder))}" if set_aside else ""
                print(f"rn50_mx: {bad}: refused ({reason}){moved}; using {os.path.basename(path)}", file=sys.stderr)
            return path
        refused.append((path, why))
    if refused:
        raise InputError(f"--checkpoint-dir {folder}: no usable checkpoint: " +
                         "; ".join(f"{os.path.basename(p)} ({why})" for p, why in refused))
    return None


def remove_partial(path):
    """Remove what a stopped writer left at `path` (.tmp-step-N); what was done, in words. A folder is removed with
    its files; anything else there (a link planted in its place, a file) is unlinked itself, never followed."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        return "a partial checkpoint (its writer stopped): removed"
    files.remove_quietly(path)
    return "not a folder (a link or a file in a partial checkpoint's place): the entry removed, nothing it points to"


def set_apart(path, folder):
    """Rename a refused checkpoint out of the way: PATH.refused, or PATH.refused-K, the first K free (a refused one
    of that step set aside before keeps its name); the new path. One line when it cannot be renamed."""
    for k in range(1, 1000):
        new = f"{path}.refused" + (f"-{k}" if k > 1 else "")
        if os.path.lexists(new):
            continue
        try:
            os.rename(path, new)
        except OSError as err:
            raise InputError(f"--checkpoint-dir {folder}: cannot set {os.path.basename(path)} aside as "
                             f"{os.path.basename(new)} ({err.strerror})") from None
        return new
    raise InputError(f"--checkpoint-dir {folder}: {os.path.basename(path)} refused 1000 times over; clear the "
                     "*.refused folders")


def agree(d, folder, deeper):
    """The checkpoint every rank resumes from: the newest that passes rank 0's checks of its files (newest_usable)
    and every rank's own `deeper` check (each of its own states, on its own device, all ranks at once), or None.
    Rank 0 names each candidate to the others (its step + 1 in a sum over the ranks; 0: none is left), and the ranks
    answer with one sum of their verdicts, a slot each."""
    if d.rank:
        while True:
            step = int(d.host_sum([0]).asscalar())
            if not step:
                return None
            path = os.path.join(folder, f"step-{step - 1}")
            if verdict(d, path, deeper) is None:
                return path

    def announced(path):
        if d.size > 1:
            d.host_sum([int(STEP.match(os.path.basename(path)).group(1)) + 1])
        return verdict(d, path, deeper)

    chosen = newest_usable(folder, deeper=announced)
    if chosen is None and d.size > 1:  # the others wait for a candidate: none
        d.host_sum([0])
    return chosen


def verdict(d, path, deeper):
    """None when `deeper` passes the checkpoint in `path` on every rank, else why (rank 0's own reason, or the ranks
    that refused it, each of which printed its own line)."""
    why = deeper(path)
    if why and d.rank:
        print(f"rn50_mx: {path}: refused on rank {d.rank} ({why})", file=sys.stderr, flush=True)
    refused = d.host_sum([int(bool(why) and r == d.rank) for r in range(d.size)]).asnumpy()
    ranks = [str(r) for r in range(d.size) if refused[r]]
    if not ranks:
        return None
    several = len(ranks) > 1
    return why or (f"rank{'s' * several} {', '.join(ranks)} refused {'their' if several else 'its'} DALI states, "
                   f"saying why in {'their' if several else 'its'} own line{'s' * several}")
