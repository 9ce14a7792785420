"""Checkpoints and exact resumes, on real runs of `python -m rn50_mx.train` (1 process, and 2 Gloo ranks under
horovodrun) with real signals: a run SIGKILLed at a random step after a checkpoint and a run SIGTERMed mid-epoch,
both resumed, end with parameters bit-identical to the uninterrupted run's, with the same losses and evals from the
resume point on. Then every refusal: other settings, partial and corrupt checkpoints, a second run on the folder, a
full disk, bad values; and `python -m rn50_mx.evaluate` on the saved model and on a checkpoint.

Every run and evaluate puts each rank's model on cpu(1 + local rank) with mixed contexts refused
(tests.support.devices), as each rank has its own GPU on a GPU node.

Tiny on purpose (24 images of 32x32 in batches of 4: 6 steps an epoch, 2 epochs); the uninterrupted run of each world
size is shared by the tests.
"""
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from rn50_mx import checkpoint, config, files, model, optim, timing
from rn50_mx.config import Settings
from rn50_mx.rehearse.stages import same_bits
from tests.support.bfloat16 import needs_bfloat16, round_bf16, to_np
from tests.support.mllog import events, values
from tests.support.procs import assert_one_line_naming, clean_environ, gloo_ranks, run_train, wait_for
from tests.support.runs import (FLAGS, STEPS, argv, assert_same_params, epoch_lines, evaluate, finish, run,
                                signal_held, start)
from tests.support.settings import STOPPED_RUN
from tests.support.timing import edited_fixture, report_of

# The compliance checker on a resumed run's log (docs/checkpoints.md): FAILED, first for the second init_start.
RESUMED_LOG_VERDICT = re.compile(r"^CHECK for 'init_start' failed in line \d+: failed test: not s\['run_started'\] ")


@pytest.fixture(scope="module")
def recs(three_classes):
    """(train .rec, val .rec): 3 Fashion-MNIST classes x 8 photographs; val: 4 of each with their labels."""
    return os.path.join(three_classes, "train.rec"), os.path.join(three_classes, "val.rec")


_uninterrupted = {}


@pytest.fixture(params=[1, 2], ids=["1 rank", "2 ranks"])
def uninterrupted(request, recs, tmp_path_factory):
    """(ranks, stdout, model prefix, MLPerf log) of the run nothing stops, without checkpoints: one per world size."""
    return uninterrupted_run(request.param, recs, tmp_path_factory)


def uninterrupted_run(ranks, recs, tmp_path_factory):
    if ranks not in _uninterrupted:
        folder = tmp_path_factory.mktemp(f"uninterrupted{ranks}")
        log, prefix = str(folder / "mlperf.log"), str(folder / "model")
        text = run(recs, ranks, folder / "out.txt", mllog_file=log, save_model=prefix)
        _uninterrupted[ranks] = ranks, text, prefix, log
    return _uninterrupted[ranks]


def resume_and_compare(recs, uninterrupted, tmp_path, folder, resumed_epoch, log):
    """Resume from `folder`, its MLPerf lines appended to `log`, the stopped run's; the final parameters, and the
    epoch lines from `resumed_epoch` on, equal the uninterrupted run's."""
    ranks, reference, prefix, _ = uninterrupted
    text = run(recs, ranks, tmp_path / "resumed.txt", checkpoint_dir=folder, mllog_file=log,
               save_model=tmp_path / "resumed")
    assert_same_params(str(tmp_path / "resumed"), prefix)
    ours, theirs = epoch_lines(text), epoch_lines(reference)
    assert sorted(ours) == list(range(resumed_epoch, FLAGS["num_epochs"] + 1)), text[-3000:]
    assert all(ours[e] == theirs[e] for e in ours), (ours, theirs)


def resumed_part(log, stopped):
    """The MLLOG lines the resumed run appended to `log`, which held `stopped` (the stopped run's text) before: the
    file begins with that text, its last line ended if it was cut, and every appended line is an MLLOG line of its
    own, from init_start and resumed_from to run_stop."""
    text = open(log).read()
    first = stopped if stopped.endswith("\n") else stopped + "\n"
    assert text.startswith(first), text[:len(first) + 300]
    added = [json.loads(line[len(":::MLLOG "):]) for line in text[len(first):].splitlines()]
    keys = [e["key"] for e in added]
    assert keys[:2] == ["init_start", "resumed_from"] and keys[-1] == "run_stop" and keys.count("run_start") == 1, keys
    return [(e["key"], e["value"], e["metadata"]) for e in added]


def assert_not_scored(log):
    """timing gives a resumed run's log one row that says so, and no time; the compliance checker fails it as
    docs/checkpoints.md says."""
    result = subprocess.run([sys.executable, "-m", "rn50_mx.timing", log], env=clean_environ(), capture_output=True,
                            text=True, timeout=120)
    rows = [line for line in result.stdout.splitlines() if "resumed from a checkpoint" in line]
    assert result.returncode == 0 and len(rows) == 1, result.stdout + result.stderr
    assert timing.read_run(log, "1.0.0").minutes is None
    verdict, reason = timing.check_compliance(log, "1.0.0")
    assert verdict == "FAILED" and RESUMED_LOG_VERDICT.match(reason), reason


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_exactly(recs, uninterrupted, tmp_path):
    """--checkpoint-every 1, SIGKILL to the whole job at a random step of epoch 2 (after epoch 1's checkpoint), its
    log's last line then cut short (as when a writer is killed mid-line): the resumed run continues that log."""
    ranks = uninterrupted[0]
    folder, out, log = str(tmp_path / "ckpt"), tmp_path / "killed.txt", str(tmp_path / "mlperf.log")
    proc = start(recs, ranks, out, checkpoint_dir=folder, checkpoint_every=1, mllog_file=log)
    wait_for(proc, out, rf"epoch 2 step {random.randint(1, STEPS - 1)}/{STEPS}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sorted(os.listdir(folder)) == ["lock", f"step-{STEPS}"]
    stopped = open(log).read()[:-20]  # in epoch 2's epoch_start line, after the checkpoint's mark
    assert len(stopped) > checkpoint.read_meta(os.path.join(folder, f"step-{STEPS}"))["mllog"]["size"]
    with open(log, "r+") as f:
        f.truncate(len(stopped))
    resume_and_compare(recs, uninterrupted, tmp_path, folder, 2, log)
    resumed = resumed_part(log, stopped)
    assert values(resumed, "resumed_from", "epoch_num") == [2]
    if ranks == 1:  # the run has ended: its folder is not resumed again
        train_refused(recs, folder, "the run there has ended (run_stop aborted)")
    assert values(resumed, "eval_accuracy") == values(events(uninterrupted[3]), "eval_accuracy")[1:]
    assert_not_scored(log)


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_mid_epoch_resumes_exactly(recs, uninterrupted, tmp_path):
    """SIGTERM (to rank 0 only: rank 1 stops at the same step) early in epoch 1: the ranks agree at a check 4 to 8
    steps later, mid-epoch 2 (step 8 = epoch 2 step 2), write a checkpoint, log resumable_stop and exit 75. Rank 0
    is held at its third batch while the signal is sent (runs.signal_held), so it lands before its check at step 4 on
    any machine; rank 1's may run up to a check period ahead, where a signal to it would land a period later. The
    resumed run's lines follow resumable_stop in the same log."""
    ranks = uninterrupted[0]
    folder, out, log = str(tmp_path / "ckpt"), tmp_path / "stopped.txt", str(tmp_path / "mlperf.log")
    proc = start(recs, ranks, out, held_at=3, checkpoint_dir=folder, mllog_file=log)
    signal_held(proc, out, signal.SIGTERM, 0 if ranks == 2 else None)
    text = finish(proc, out, code=1 if ranks == 2 else checkpoint.RESUMABLE_EXIT)  # horovodrun exits 1: the log says
    assert "stopped at epoch 2 step 2" in text, text[-3000:]
    stopped = events(log)
    assert values(stopped, "resumable_stop", "step") == [2] and values(stopped, "run_stop") == []
    assert [key for key, _, _ in stopped][-1] == "resumable_stop"
    assert sorted(os.listdir(folder)) == ["lock", f"step-{STEPS + 2}"]
    before = open(log).read()
    resume_and_compare(recs, uninterrupted, tmp_path, folder, 2, log)
    keys = [key for key, _, _ in resumed_part(log, before)]
    assert "epoch_start" not in keys  # epoch 2 was begun
    assert timing.read_run(log, "1.0.0").resumed
    assert_not_scored(log)


# --- refusals -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_checkpoints(recs, tmp_path_factory):
    """A folder with the checkpoints after epoch 1 (step 6) and at step 8 (SIGTERM at step 3, read at the check of
    step 4), 1 process; its MLPerf log is mlperf.log beside it."""
    tmp = tmp_path_factory.mktemp("two")
    folder, out = str(tmp / "ckpt"), tmp / "out.txt"
    proc = start(recs, 1, out, held_at=3, checkpoint_dir=folder, checkpoint_every=1, mllog_file=tmp / "mlperf.log")
    signal_held(proc, out, signal.SIGTERM)
    finish(proc, out, code=checkpoint.RESUMABLE_EXIT)
    assert sorted(os.listdir(folder)) == ["lock", f"step-{STEPS}", f"step-{STEPS + 2}"]
    return folder


def copy_of(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "copy")


def train_refused(recs, folder, name, **changes):
    result = subprocess.run([sys.executable, "-m", "rn50_mx.train", *argv(recs, 1, checkpoint_dir=folder, **changes)],
                            env=clean_environ(), capture_output=True, text=True, timeout=120)
    assert_one_line_naming(result, name)
    return result


@pytest.mark.slow
def test_other_settings_are_refused_naming_each_difference(recs, two_checkpoints, tmp_path):
    result = train_refused(recs, copy_of(two_checkpoints, tmp_path), "written with other settings",
                           batch_size=2, seed=8, dali_initial_fill=16)
    line = result.stderr
    for difference in ("--batch-size 2 (checkpoint: 4)", "--seed 8 (checkpoint: 7)",
                       "--dali-initial-fill 16 (checkpoint: 1024)"):
        assert difference in line, line
    assert "--lr" not in line and "init_start" not in result.stdout  # refused before any work


@pytest.mark.slow
def test_a_corrupt_or_partial_checkpoint_is_refused_and_the_previous_one_used(recs, two_checkpoints, tmp_path,
                                                                              tmp_path_factory):
    reference = uninterrupted_run(1, recs, tmp_path_factory)[2]
    folder = str(copy_of(two_checkpoints, tmp_path))
    newest = os.path.join(folder, f"step-{STEPS + 2}")
    with open(os.path.join(newest, "params"), "r+b") as f:  # one flipped bit
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 1]))
    shutil.copytree(newest, os.path.join(folder, ".tmp-step-10"))  # a writer that stopped
    proc = start(recs, 1, tmp_path / "out.txt", checkpoint_dir=folder, save_model=tmp_path / "model")
    text = finish(proc, tmp_path / "out.txt")
    refusals = [line for line in text.splitlines() if line.startswith("rn50_mx: ")]
    assert len(refusals) == 2, refusals
    assert refusals[0].endswith(".tmp-step-10: a partial checkpoint (its writer stopped): removed")
    assert refusals[1].endswith(f"step-{STEPS + 2}: refused (params is corrupt (CRC-32 differs)); renamed "
                                f"step-{STEPS + 2}.refused; using step-{STEPS}")
    assert_same_params(str(tmp_path / "model"), reference)  # resumed from step 6: still exact


def forge(folder, name, edit):
    """Replace `name` in a checkpoint by edit(its content) and list the new size and CRC-32 in meta.json, so that
    only a load can tell (meta.json itself: edit(its parsed JSON) -> the new JSON)."""
    path, meta_path = os.path.join(folder, name), os.path.join(folder, "meta.json")
    meta = json.load(open(meta_path))
    if name == "meta.json":
        meta = edit(meta)
    else:
        payload = edit(open(path, "rb").read() if os.path.exists(path) else b"")
        with open(path, "wb") as f:
            f.write(payload)
        meta["files"][name] = [len(payload), files.crc32(path)]
    with open(meta_path, "w") as f:
        json.dump(meta, f)


def without(key, *path):
    def edit(data):
        inner = data
        for step in path:
            inner = inner[step]
        del inner[key]
        return data
    return edit


def with_value(value, *path):
    def edit(data):
        inner = data
        for step in path[:-1]:
            inner = inner[step]
        inner[path[-1]] = value
        return data
    return edit


def json_edit(edit):
    return lambda payload: json.dumps(edit(json.loads(payload))).encode()


def arrays_edit(edit):
    """The content of an mx.nd.save file after edit({name: array}) -> {name: array}."""
    def content(payload):
        path = f"/tmp/forge-{os.getpid()}"
        open(path, "wb").write(payload)
        arrays = edit(mx.nd.load(path))
        mx.nd.save(path, arrays)
        out = open(path, "rb").read()
        os.remove(path)
        return out
    return content


def array_file(arrays):
    """The content of an mx.nd.save file of `arrays`."""
    path = f"/tmp/forge-{os.getpid()}"
    mx.nd.save(path, arrays)
    out = open(path, "rb").read()
    os.remove(path)
    return out


def first_dropped(arrays):
    return dict(list(arrays.items())[1:])


def first_reshaped(arrays):
    name = next(iter(arrays))
    return {**arrays, name: mx.nd.zeros((arrays[name].size + 1,))}


def cast_all(arrays):
    return {name: a.astype("float16") for name, a in arrays.items()}


FORGED = [  # issue 28 item 5: (name, file, edit, what the refusal says)
    ("meta without epoch", "meta.json", without("epoch"), "meta.json has no 'epoch'"),
    ("meta step as a string", "meta.json", with_value("8", "step"), "meta.json: step is str, not int"),
    ("meta world 0", "meta.json", with_value(0, "world"), "meta.json: world is 0, below 1"),
    ("meta seed above int32", "meta.json", with_value(2**40, "seed"), "meta.json: seed is 1099511627776, above"),
    ("meta a list", "meta.json", lambda meta: [meta], "meta.json holds a list, not an object"),
    ("meta settings a string", "meta.json", with_value("x", "settings"), "meta.json: settings is str, not dict"),
    ("meta files entry cut", "meta.json", with_value([1], "files", "params"), "files['params'] is not [size, CRC-32]"),
    ("meta files outside", "meta.json", with_value([1, 1], "files", "../x"), "files lists '../x', not a name"),
    ("meta mllog without crc", "meta.json", without("crc", "mllog"), "meta.json's mllog has no 'crc'"),
    ("meta settings of another version", "meta.json", with_value(1, "settings", "no_such_setting"),
     "its settings are not this version's"),
    ("meta settings out of range", "meta.json", with_value(0, "settings", "batch_size"),
     "its settings are not this version's (--batch-size=0: must be >= 1)"),
    ("params garbage", "params", lambda payload: b"\0" * len(payload), "params does not load"),
    ("params without a tensor", "params", arrays_edit(first_dropped), "params has no "),
    ("params of another shape", "params", arrays_edit(first_reshaped), "the model's"),
    ("aux in float16", "rank0.aux", arrays_edit(cast_all), "float16, the model's"),
    ("aux garbage", "rank0.aux", lambda payload: payload[:40], "rank0.aux does not load"),
    ("trainer counts empty", "trainer.json", json_edit(lambda plain: {}), "trainer.json has no 'num_update'"),
    ("trainer counts of a parameter the model has not", "trainer.json", json_edit(with_value(1, "parts", "99999")),
     "parts names parameter '99999'"),
    ("trainer state missing", "trainer", arrays_edit(first_dropped), "trainer: has no state"),
    ("trainer none names a saved part", "trainer.json", json_edit(with_value({"0": [0]}, "none")),
     "trainer: holds an unlisted state '0.0'"),
    ("trainer none past the state's parts", "trainer.json", json_edit(with_value({"0": [1]}, "none")),
     "trainer.json: none['0'] is not a list of parts of a state it lists"),
    ("rank state a list", "rank0.json", json_edit(lambda state: []), "rank0.json has no 'position'"),
    ("rank position without step", "rank0.json", json_edit(without("step", "position")),
     "rank0.json's position has no 'step'"),
    ("rank without the train iterator", "rank0.json", json_edit(without("train", "iters")),
     "rank0.json's iters has no 'train'"),
    ("rank numpy state cut", "rank0.json", json_edit(with_value(["MT19937", [1]], "numpy_random")),
     "numpy_random is not NumPy's generator state"),
    ("rank state not JSON", "rank0.json", lambda payload: b"{" + payload, "rank0.json does not load"),
    # issue 33 items 11 and 19: fields unbounded or unread
    ("meta world 10^9", "meta.json", with_value(10**9, "world"), "meta.json: world is 1000000000, but its files are "
     "those of ranks [0]"),
    ("meta epoch past the run", "meta.json", with_value(10**6, "epoch"), "meta.json: epoch 1000000 is past the run's "
     "last epoch"),
    ("meta image shape not C,H,W", "meta.json", with_value("3,x,32", "settings", "image_shape"),
     "its settings are not this version's (--image-shape='3,x,32': expected C,H,W"),
    ("rank position epoch not meta's", "rank0.json", json_edit(with_value(10**6, "position", "epoch")),
     "rank0.json: position epoch 1000000 step 2 is not meta.json's epoch 1 step 2"),
    ("rank position first past its epoch", "rank0.json", json_edit(with_value(5, "position", "first")),
     "rank0.json: position first 5 is past its epoch, 1"),
    ("rank position with an unknown field", "rank0.json", json_edit(with_value(1, "position", "extra")),
     "rank0.json's position holds 'extra', an unknown field"),
    ("rank position images past its steps", "rank0.json", json_edit(with_value(10**9, "position", "images")),
     "rank0.json: position images 1000000000 above step 2 x batch"),
    ("rank position loss past float32", "rank0.json", json_edit(with_value(1e300, "position", "loss")),
     "rank0.json: position loss 1e+300 is past float32's range"),
    ("rank train iterator past the step", "rank0.json", json_edit(with_value(10**6, "iters", "train", "position")),
     "rank0.json's train iterator: position 1000000 is not the step, 2"),
    ("rank skipped records not keys", "rank0.json", json_edit(with_value(["x"], "iters", "train", "skipped")),
     "rank0.json's train iterator: skipped is not a list of record keys"),
    ("rank python state out of range", "rank0.json", json_edit(with_value([3, [2**40] * 625, None], "python_random")),
     "python_random is not Python's generator state"),
    ("rank numpy position past its words", "rank0.json",
     json_edit(with_value(["MT19937", [1] * 624, 10**6, 0, 0.0], "numpy_random")),
     "numpy_random is not NumPy's generator state"),
    ("a listed EMA of another model", "rank0.ema", lambda _: array_file({"x": mx.nd.zeros((2,))}),
     "rank0.ema holds 'x', which the model has not"),
    # issue 42 item 14: the checkpoint of a run with a weight EMA, its rank0.ema removed and unlisted
    ("an EMA run without its EMA", "meta.json", with_value(0.6, "settings", "ema_decay"),
     "meta.json lists no rank0.ema, the weight EMA of a run with --ema-decay 0.6"),
]


@pytest.mark.parametrize("name,target,edit,why", FORGED, ids=[f[0] for f in FORGED])
def test_a_checkpoint_that_passes_its_crc_but_does_not_load_is_refused(two_checkpoints, tmp_path, capsys, name,
                                                                       target, edit, why):
    """Files whose sizes and CRC-32s meta.json lists rightly, or a meta.json of the wrong shape, but which do not load
    or do not fit the model: refused in one line like a corrupt one, the previous checkpoint used. The old code took
    them and failed after run_start with a KeyError, TypeError or MXNetError (or took a meta.json it could not use)."""
    folder = str(copy_of(two_checkpoints, tmp_path))
    forge(os.path.join(folder, f"step-{STEPS + 2}"), target, edit)
    chosen = checkpoint.newest_usable(folder, set_aside=False)
    line = capsys.readouterr().err.strip()
    assert chosen == os.path.join(folder, f"step-{STEPS}"), line
    assert line.startswith(f"rn50_mx: {folder}/step-{STEPS + 2}: refused (") and why in line, line
    assert line.endswith(f"; using step-{STEPS}") and "\n" not in line, line


def test_a_checkpoint_whose_loss_is_nan_says_the_run_had_diverged(recs, two_checkpoints, tmp_path):
    """A checkpoint holding a NaN loss (written before training stopped on a diverged loss; issue 43's rehearsal made
    one): the resume stops in one line saying the run had diverged, and at which step; it does not fall back to the
    checkpoint before, which would diverge again. The old code refused it as "position first 1 or loss nan is not a
    run's", and resumed from the one before."""
    folder = str(copy_of(two_checkpoints, tmp_path))
    nan_loss = json_edit(with_value(float("nan"), "position", "loss"))
    forge(os.path.join(folder, f"step-{STEPS + 2}"), "rank0.json", nan_loss)
    train_refused(recs, folder, f"--checkpoint-dir {folder}: step-{STEPS + 2}: rank0.json: the run had diverged (loss "
                  f"nan at step {STEPS + 2}); its checkpoints are not resumed")
    assert sorted(os.listdir(folder)) == ["lock", f"step-{STEPS}", f"step-{STEPS + 2}"]  # none set aside


@pytest.mark.slow
def test_a_checkpoint_that_does_not_load_is_refused_before_the_resumed_run_logs(recs, two_checkpoints, tmp_path,
                                                                                 tmp_path_factory):
    """The newest checkpoint's params replaced by an array file that loads but lacks a tensor, meta.json's CRC made to
    match: the resumed run says so in one line, resumes from the one before, exactly, and its log holds one
    resumed attempt (the old code: KeyError after run_start, the log then holding a second init_start and run_start
    before the traceback)."""
    reference = uninterrupted_run(1, recs, tmp_path_factory)[2]
    folder = str(copy_of(two_checkpoints, tmp_path))
    log = tmp_path / "mlperf.log"
    shutil.copy(os.path.join(os.path.dirname(two_checkpoints), "mlperf.log"), log)
    forge(os.path.join(folder, f"step-{STEPS + 2}"), "params", arrays_edit(first_dropped))
    text = run(recs, 1, tmp_path / "out.txt", checkpoint_dir=folder, save_model=tmp_path / "model", mllog_file=log)
    refusals = [line for line in text.splitlines() if line.startswith("rn50_mx: ")]
    assert len(refusals) == 1 and f"step-{STEPS + 2}: refused (params has no " in refusals[0], refusals
    assert refusals[0].endswith(f"; renamed step-{STEPS + 2}.refused; using step-{STEPS}"), refusals
    assert_same_params(str(tmp_path / "model"), reference)
    keys = [key for key, _, _ in events(log)]
    assert keys.count("init_start") == 2 and keys.count("run_start") == 2 and keys.count("run_stop") == 1, keys


HOLDS_THE_LOG = """
import sys, time
from rn50_mx import files
held = files.lock_file(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_a_resume_appends_to_its_run_s_log_only(recs, two_checkpoints, tmp_path):
    """A resumed run continues the stopped run's --mllog-file and no other: a file with other lines, a shorter one
    and a missing one are refused in one line before any work, and left as they were; so is the right log while
    another process writes it. The old code refused the stopped run's log too (it held a run)."""
    folder = str(copy_of(two_checkpoints, tmp_path))
    stopped = open(os.path.join(os.path.dirname(two_checkpoints), "mlperf.log")).read()
    at_checkpoint = checkpoint.read_meta(os.path.join(folder, f"step-{STEPS + 2}"))["mllog"]["size"]
    for name, text, why in [("other.log", stopped.replace('"seed", "value": 7', '"seed", "value": 8'),
                             f"its first {at_checkpoint} bytes differ"),
                            ("short.log", stopped[:1000], "it has 1000 bytes"),
                            ("missing.log", None, "it does not exist")]:
        if text is not None:
            (tmp_path / name).write_text(text)
        result = train_refused(recs, folder, f"{tmp_path / name}: not the MLPerf log of the run being resumed ({why}; "
                               f"{folder}/step-{STEPS + 2} was written when ", mllog_file=tmp_path / name)
        assert "init_start" not in result.stdout
        assert (tmp_path / name).read_text() == text if text is not None else not (tmp_path / name).exists()
    log = str(tmp_path / "mlperf.log")
    shutil.copy(os.path.join(os.path.dirname(two_checkpoints), "mlperf.log"), log)
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOG, log], stdout=subprocess.PIPE, text=True,
                              env=clean_environ())
    try:
        assert holder.stdout.readline() == "locked\n"
        train_refused(recs, folder, f"{log}: another process is writing this output now", mllog_file=log)
    finally:
        holder.kill()
        holder.wait()
    assert open(log).read() == stopped


HOLDS_THE_LOCK = """
import sys, time
from rn50_mx import checkpoint
held = checkpoint.lock(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_the_folder_is_refused(recs, tmp_path):
    """The lock a run takes (checkpoint.lock), held by another process: the second run stops in one line."""
    folder = str(tmp_path / "ckpt")
    holder = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOCK, folder], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        train_refused(recs, folder, f"in use by another run (process {holder.pid} on ")
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_of_nothing_usable_is_refused(recs, tmp_path):
    folder = tmp_path / "ckpt"
    os.makedirs(folder / "step-4")
    (folder / "step-4" / "meta.json").write_text("{not json")
    train_refused(recs, str(folder), "no usable checkpoint")


def test_an_unwritable_checkpoint_dir_is_one_line(recs, tmp_path):
    (tmp_path / "file").write_text("")
    train_refused(recs, str(tmp_path / "file" / "ckpt"), "cannot write there")


def limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # a disk that is full after 1 MiB a file


@pytest.mark.slow
def test_a_full_disk_at_the_stop_is_one_line_and_no_checkpoint(recs, tmp_path):
    folder, out = str(tmp_path / "ckpt"), tmp_path / "out.txt"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "rn50_mx.train", *argv(recs, 1, checkpoint_dir=folder)],
                                stdout=f, stderr=subprocess.STDOUT, env=clean_environ(), start_new_session=True,
                                preexec_fn=limit_file_size)
    wait_for(proc, out, rf"epoch 1 step 1/{STEPS}")
    proc.send_signal(signal.SIGTERM)
    text = finish(proc, out, code=2)
    assert re.search(r"^rn50_mx.train: error: .*ckpt: cannot write a checkpoint \(rank 0: .*\); there is no "
                     r"checkpoint: a resume would start the run anew$", text, re.M) and "Traceback" not in text, \
        text[-3000:]  # issue 49: it said "the previous one stays current", where there was none
    assert os.listdir(folder) == ["lock"]  # the partial one was under its temporary name, then removed


@pytest.mark.parametrize("flags,env,name", [
    (["--checkpoint-every=-1", "--checkpoint-dir=x"], {}, "--checkpoint-every=-1: must be >= 0"),
    ([], {"RN50_CHECKPOINT_EVERY": "abc"}, "RN50_CHECKPOINT_EVERY='abc': expected int"),
    (["--checkpoint-every=2"], {}, "--checkpoint-every=2: needs --checkpoint-dir"),
])
def test_bad_checkpoint_settings_are_refused(flags, env, name):
    with pytest.raises(config.SettingsError, match=re.escape(name)):
        config.load(flags, env)


# --- what a checkpoint relies on ------------------------------------------------------------------------------

def test_the_optimizer_pickles_without_its_device_arrays():
    """Our checkpoints hold no pickle (checkpoint/trainer_file.py), but a user's Trainer.save_states pickles the
    optimizer with its lr_scheduler (a lambda would fail there) and LARS's per-group arrays, which unpickle onto the
    device they were saved from (GPU review 3, F1): the groups are derived data, left out and rebuilt on the weights'
    device at the next update."""
    s = Settings(warmup_epochs=1, num_epochs=3)
    made = optim.make_optimizer(s, 10)
    weight = mx.nd.ones((4, 3, 1, 1), ctx=mx.cpu(1))
    made.group([0], [weight])
    opt = pickle.loads(pickle.dumps(made))
    assert opt.lr_scheduler(15) == optim.schedule(s, 10)(15) and opt.aggregate_num == s.optimizer_aggregation_size
    assert made.groups and opt.groups == {}


def test_nothing_draws_from_mxnet_s_generator_after_the_model_is_built():
    """mx.random has no state to save in 1.9.1: a resumed run relies on training steps drawing nothing from it."""
    s = Settings(num_classes=3, image_shape="3,32,32", batch_size=2, warmup_epochs=0, num_epochs=1)

    def draw_after(steps):
        mx.random.seed(3)
        net = model.build_model(s, mx.cpu())
        trainer = optim.make_trainer(net, s, 1)
        loss_fn = optim.make_loss(s)
        for _ in range(steps):
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.ones((2, 3, 32, 32))), mx.nd.array([0, 1]))
            loss.backward()
            trainer.step(2)
        return mx.nd.random.uniform(shape=4).asnumpy()

    assert np.array_equal(draw_after(0), draw_after(2))


def test_save_model_to_an_unwritable_path_is_one_line(tmp_path):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(2))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((1, 3)))
    (tmp_path / "file").write_text("")
    with pytest.raises(checkpoint.InputError, match="--save-model .*file/model: cannot write"):
        checkpoint.save_model(net, str(tmp_path / "file" / "model"), Settings())
    assert checkpoint.save_model(net, str(tmp_path / "model"), Settings())[0].endswith("model-0000.params")
    assert sorted(os.listdir(tmp_path)) == ["file", "model-0000.params", "model-settings.json", "model-symbol.json"]


def test_save_model_is_checked_and_owned_before_the_run(tmp_path):
    """An unwritable --save-model was found out after the whole training; an existing model was replaced."""
    flags = ["--synthetic", "1", "--num-examples", "8", "--batch-size", "4", "--num-epochs", "1", "--warmup-epochs",
             "0", "--eval-offset", "0", "--image-shape", "3,32,32", "--num-classes", "3"]

    def train(model):
        return subprocess.run([sys.executable, "-m", "rn50_mx.train", *flags, "--save-model", str(model)],
                              env=clean_environ(), capture_output=True, text=True, timeout=240)

    (tmp_path / "file").write_text("")
    result = train(tmp_path / "file" / "model")
    assert_one_line_naming(result, f"{tmp_path}/file/model: cannot write")
    assert "run_start" not in result.stdout + result.stderr
    (tmp_path / "model-0000.params").write_bytes(b"old")
    result = train(tmp_path / "model")
    assert_one_line_naming(result, f"{tmp_path}/model-0000.params exists; the model there is kept")
    assert (tmp_path / "model-0000.params").read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["file", "model-0000.params"]


# --- evaluate --------------------------------------------------------------------------------------------------

def assert_evaluates_to(result, top1):
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"top-1 {re.escape(repr(top1))}, top-5 [0-9.]+ \(12 images\)", result.stdout), \
        (result.stdout, top1)


@pytest.mark.slow
def test_evaluate_gives_the_run_s_figures(recs, two_checkpoints, tmp_path_factory):
    """The saved model gives the last eval's top-1 exactly, and the checkpoint after epoch 1 the first eval's. A
    2-rank run's, evaluated on 2 ranks (and 1): test_a_multi_rank_run_has_one_model_the_one_its_evals_judged."""
    _, _, prefix, log = uninterrupted_run(1, recs, tmp_path_factory)
    logged = values(events(log), "eval_accuracy")
    assert_evaluates_to(evaluate(recs, 1, "--model", prefix), logged[-1])
    folder = two_checkpoints + "-after-epoch-1"
    shutil.copytree(two_checkpoints, folder, ignore=shutil.ignore_patterns(f"step-{STEPS + 2}", "lock"))
    assert_evaluates_to(evaluate(recs, 1, checkpoint_dir=folder), logged[0])


@pytest.mark.slow
def test_a_multi_rank_run_has_one_model_the_one_its_evals_judged(recs, tmp_path):
    """Issue 28 item 7. Each rank's BatchNorm statistics see only its shard; the run's eval judged each shard with
    its own rank's while the saved model held rank 0's, so `evaluate` gave another figure than the log (here, on the
    code before: 2/12 logged at epoch 1 against 5/12, 0/12 at epoch 2 against 4/12, the same in every run, with a
    waitall before the eval or not, quiet or loaded). Now the ranks average their statistics before each eval: the
    checkpoint written after an eval holds that one model on every rank, and the saved model and the checkpoint
    evaluate, on 1 rank and on 2, to the figures logged. 4 images a rank a step (2 would leave BatchNorm 2 values a
    channel in the last stage, where the network only diverges and every figure is a third)."""
    folder, prefix, log = str(tmp_path / "ckpt"), str(tmp_path / "model"), tmp_path / "mlperf.log"
    run(recs, 2, tmp_path / "out.txt", batch_size=4, checkpoint_dir=folder, checkpoint_every=1, save_model=prefix,
        mllog_file=log)
    logged = values(events(log), "eval_accuracy")
    for ranks in (1, 2):
        assert_evaluates_to(evaluate(recs, ranks, "--model", prefix, batch_size=4), logged[-1])
    assert_evaluates_to(evaluate(recs, 2, checkpoint_dir=folder, batch_size=4), logged[0])
    after_eval_1 = os.path.join(folder, "step-3")
    params = mx.nd.load(os.path.join(after_eval_1, "params"))
    for rank in (0, 1):
        for name, value in mx.nd.load(os.path.join(after_eval_1, f"rank{rank}.aux")).items():
            assert same_bits(value.asnumpy(), params[name].asnumpy()), (rank, name)


@pytest.mark.parametrize("source,changes,why", [
    ("model", {"image_shape": "3,64,64"}, "--image-shape=3,64,64: the model was trained with 3,32,32 (its "),
    ("model", {"num_classes": 4}, "--num-classes=4: the model was trained with 3 (its -settings.json)"),
    ("checkpoint", {"image_shape": "3,48,48"}, "--image-shape=3,48,48: the model was trained with 3,32,32 ("),
    ("checkpoint", {"num_classes": 5}, "--num-classes=5: the model was trained with 3 ("),
    ("model", {"num_layers": 50}, f"--num-layers=50: the model was trained with {FLAGS['num_layers']} (its "),
    ("checkpoint", {"num_layers": 26}, f"--num-layers=26: the model was trained with {FLAGS['num_layers']} ("),
])
def test_evaluate_refuses_settings_the_model_was_not_trained_with(recs, two_checkpoints, tmp_path_factory, source,
                                                                   changes, why):
    """Issue 28 item 5: another image side gave another top-1 in silence, other classes or channels a traceback.
    The saved model's -settings.json and the checkpoint's meta.json say what it was built for."""
    prefix = uninterrupted_run(1, recs, tmp_path_factory)[2]
    where = ["--model", prefix] if source == "model" else []
    result = evaluate(recs, 1, *where, **changes, **({} if where else {"checkpoint_dir": two_checkpoints}))
    assert_one_line_naming(result, why)


@pytest.mark.parametrize("content,why", [
    (None, "model-settings.json (python -m rn50_mx.train --save-model"),
    ("[1]", "not a settings object"),
    ("{", "model-settings.json: cannot read ("),
    ("{}", "--image-shape: the model's settings do not record it"),  # issue 33 item 20: the check was skipped
])
def test_evaluate_refuses_a_model_without_its_settings(recs, tmp_path_factory, tmp_path, content, why):
    prefix = str(tmp_path / "model")
    for suffix in ("-symbol.json", "-0000.params"):
        shutil.copy(uninterrupted_run(1, recs, tmp_path_factory)[2] + suffix, prefix + suffix)
    if content is not None:
        (tmp_path / "model-settings.json").write_text(content)
    assert_one_line_naming(evaluate(recs, 1, "--model", prefix), why)


def write_model_settings(prefix):
    """PREFIX-settings.json as --save-model writes it for a network of FLAGS (checkpoint.MODEL_FIELDS)."""
    recorded = {name: FLAGS.get(name, getattr(Settings(), name)) for name in checkpoint.model_file.MODEL_FIELDS}
    with open(prefix + "-settings.json", "w") as f:
        json.dump(recorded, f)


def test_evaluate_of_a_graph_that_fails_on_the_data_is_one_line(recs, tmp_path):
    """Issue 33 item 20: SymbolBlock.imports only parses a saved symbol; its graph first runs on the first val batch,
    where MXNet's shape inference fails (here a 64x64 kernel on the 32x32 images)."""
    prefix = str(tmp_path / "model")
    mx.sym.flatten(mx.sym.Convolution(mx.sym.var("data"), kernel=(64, 64), num_filter=3, name="conv")).save(
        prefix + "-symbol.json")
    mx.nd.save(prefix + "-0000.params", {"arg:conv_weight": mx.nd.zeros((3, 3, 64, 64)),
                                         "arg:conv_bias": mx.nd.zeros(3)})
    write_model_settings(prefix)
    assert_one_line_naming(evaluate(recs, 1, "--model", prefix), f"--model {prefix}: the model fails on this data (")


def test_evaluate_of_a_symbol_that_is_not_a_network_names_the_file_and_why(recs, tmp_path):
    """Issue 42: a -symbol.json of `{}` read "cannot load ( At Line 0, around ^``)" on 7c8846a (dmlc's JSON reader
    ends its message with where it stopped)."""
    prefix = str(tmp_path / "model")
    (tmp_path / "model-symbol.json").write_text("{}")
    mx.nd.save(prefix + "-0000.params", {"arg:w": mx.nd.zeros(1)})
    write_model_settings(prefix)
    result = evaluate(recs, 1, "--model", prefix)
    assert_one_line_naming(result, f"--model {prefix}: {prefix}-symbol.json is not a network MXNet can load "
                                   '(JSONReader: Missing field "arg_nodes")')


@needs_bfloat16
def test_evaluate_refuses_a_checkpoint_in_another_dtype(recs, two_checkpoints):
    """Issue 42: the float32 checkpoint evaluated under bfloat16 was rounded into a bfloat16 network without a word
    (7c8846a: rc 0 and a top-1 of another model than the run's)."""
    result = evaluate(recs, 1, checkpoint_dir=two_checkpoints, dtype="bfloat16")
    assert_one_line_naming(result, f"--checkpoint-dir {two_checkpoints}: --dtype=bfloat16: the model was trained "
                                   "with float32")


@pytest.mark.parametrize("extra,name", [
    ([], "give one of --model PATH and --checkpoint-dir DIR"),
    (["--model", "/nonexistent/m"], "/nonexistent/m-0000.params"),
    (["--model"], "argument --model: expected one argument"),
])
def test_evaluate_refuses_in_one_line(recs, extra, name):
    result = evaluate(recs, 1, *extra)
    assert_one_line_naming(result, name)


# --- timing ---------------------------------------------------------------------------------------------------

def test_timing_does_not_score_a_resumed_run(tmp_path):
    """An official log with a resumed_from line after its init_start (what a resumed run writes) is dropped: the rules
    time one uninterrupted run. The old timing scored it."""
    resumed = (':::MLLOG {"namespace": "", "time_ms": 1623783744125, "event_type": "POINT_IN_TIME", "key": '
               '"resumed_from", "value": "/ckpt/step-6", "metadata": {"epoch_num": 2, "step": 0}}\n')
    folder = edited_fixture(tmp_path, {"result_2.txt": ('\n:::MLLOG {"namespace": "", "time_ms": 1623783744124, '
                                                        '"event_type": "INTERVAL_START", "key": "init_start"',
                                                        '\n' + resumed + ':::MLLOG {"namespace": "", "time_ms": '
                                                        '1623783744124, "event_type": "INTERVAL_START", "key": '
                                                        '"init_start"')})
    report = report_of([folder])
    assert "result_2.txt: resumed from a checkpoint (not one uninterrupted run)" in report["score"]["verdict"]
    assert not report["runs"][1]["counted"]


# --- bfloat16 ----------------------------------------------------------------------------------------------------

def masters_in(folder):
    """{parameter name: its float32 master} in checkpoint `folder`'s optimizer states, for the parameters whose
    state is (momentum, master); the states are numbered in the trainer's order of the parameters."""
    counts = json.load(open(os.path.join(folder, "trainer.json")))["parts"]
    states = mx.nd.load(os.path.join(folder, "trainer"))
    names = list(checkpoint.contents.expected_model(json.dumps(checkpoint.read_meta(folder)["settings"])))
    return {names[int(i)]: states[f"{i}.1"] for i, n in counts.items() if n == 2}


@pytest.mark.slow
@needs_bfloat16
def test_a_bfloat16_run_stopped_mid_epoch_resumes_exactly(recs, tmp_path):
    """DTYPE=bfloat16, with the weight EMA and a batch-size schedule (open levers that keep state of their own):
    SIGTERM in epoch 1; the checkpoint holds the float32 masters of the bfloat16 weights, each weight its master
    rounded; the resumed run's losses, evals and final model equal those of the run nothing stopped, bit for bit.
    evaluate --model scores the saved model (its symbol casts the float32 images) to the run's last eval."""
    lever = dict(dtype="bfloat16", ema_decay=0.6, ema_every=3, batch_schedule="1:2", submission_division="open")
    whole_log = str(tmp_path / "whole.log")
    reference = run(recs, 1, tmp_path / "whole.txt", save_model=tmp_path / "whole", mllog_file=whole_log, **lever)
    result = evaluate(recs, 1, "--model", str(tmp_path / "whole"), **lever)
    assert f"top-1 {values(events(whole_log), 'eval_accuracy')[-1]!r}, " in result.stdout, result.stderr[-2000:]
    folder, out = str(tmp_path / "ckpt"), tmp_path / "stopped.txt"
    proc = start(recs, 1, out, checkpoint_dir=folder, **lever)
    wait_for(proc, out, rf"epoch 1 step 1/{STEPS}")
    proc.send_signal(signal.SIGTERM)
    finish(proc, out, code=checkpoint.RESUMABLE_EXIT)
    (step,) = [name for name in os.listdir(folder) if name.startswith("step-")]
    params = mx.nd.load(os.path.join(folder, step, "params"))
    masters = masters_in(os.path.join(folder, step))
    # 17 conv kernels (the stem's, and 4 in each of the 4 units: 3 and the shortcut's), fc1's weight and bias;
    # BatchNorm's are float32 themselves
    assert len(masters) == 19
    for name, master in masters.items():
        assert master.dtype == np.float32 and params[name].dtype == model.BFLOAT16, name
        np.testing.assert_array_equal(to_np(params[name]), round_bf16(master.asnumpy()), err_msg=name)
    text = run(recs, 1, tmp_path / "resumed.txt", checkpoint_dir=folder, save_model=tmp_path / "resumed", **lever)
    assert_same_params(str(tmp_path / "resumed"), str(tmp_path / "whole"))
    ours, theirs = epoch_lines(text), epoch_lines(reference)
    assert sorted(ours) == [2] and ours[2] == theirs[2] and "top-1" in ours[2], (ours, theirs)


def test_a_weight_ema_meta_json_does_not_list_decides_nothing(two_checkpoints, tmp_path):
    """An unlisted rank0.ema (no size or CRC-32 in meta.json) decided which weights `evaluate --checkpoint-dir`
    judged: model_arrays took any file of that name."""
    folder = os.path.join(str(copy_of(two_checkpoints, tmp_path)), f"step-{STEPS + 2}")
    before = checkpoint.model_arrays(folder)
    mx.nd.save(os.path.join(folder, "rank0.ema"), {name: a.zeros_like() for name, a in before.items()})
    after = checkpoint.model_arrays(folder)
    assert all((after[name] == before[name]).min().asscalar() for name in before)


def test_a_forged_update_count_is_refused_before_run_start(recs, two_checkpoints, tmp_path):
    """trainer.json's num_update 10^30 with its CRC made to match resumed at the end learning rate; now one line
    before run_start (the position's bounds that need the run's data are checked there)."""
    folder = str(copy_of(two_checkpoints, tmp_path))
    for step in (STEPS, STEPS + 2):
        forge(os.path.join(folder, f"step-{step}"), "trainer.json", json_edit(with_value(10**30, "num_update")))
    result = train_refused(recs, folder, f"step-{STEPS + 2}: position epoch 1 step 2 (its reader at 2) with "
                                         f"{10**30} updates does not fit this run's {STEPS} steps per epoch")
    assert "run_start" not in result.stdout


def random_bytes(payload):
    return random.Random(len(payload)).randbytes(len(payload))


def dropped_ema(meta):
    """meta.json of an EMA run (the open division's --ema-decay 0.6) whose rank0.ema was removed."""
    meta["settings"].update(ema_decay=0.6, submission_division="open")
    meta["files"].pop("rank0.ema", None)
    return meta


@pytest.mark.parametrize("target, edit, changes, why", [
    ("rank0.train.dali", random_bytes, {}, "rank0.train.dali: DALI cannot restore it (Assert on "),
    ("meta.json", dropped_ema, dict(ema_decay=0.6, submission_division="open"), "meta.json lists no rank0.ema"),
], ids=["DALI state of random bytes", "EMA removed"])
def test_a_checkpoint_file_a_resume_reads_after_run_start_is_refused_before_it(recs, two_checkpoints, tmp_path,
                                                                                target, edit, changes, why):
    """Issue 42 item 14: both checkpoints forged alike, their sizes and CRC-32s rewritten to agree: the resume is one
    line naming the file, and the stopped run's log is left as it was. The old code resumed and failed after
    run_start, the log gaining a second run_start: DALI's "Failed to deserialize checkpoint from protobuf", and
    MXNet's "Check failed: allow_null ... No such file or directory"."""
    folder = str(copy_of(two_checkpoints, tmp_path))
    log = tmp_path / "mlperf.log"
    shutil.copy(os.path.join(os.path.dirname(two_checkpoints), "mlperf.log"), log)
    before = log.read_text()
    for step in (STEPS, STEPS + 2):
        forge(os.path.join(folder, f"step-{step}"), target, edit)
    train_refused(recs, folder, f"no usable checkpoint: step-{STEPS + 2} ({why}", mllog_file=log, **changes)
    assert log.read_text() == before


def test_the_bfloat16_fallback_switch_is_not_compared_on_resume(stopped_checkpoints, tmp_path):
    """Issue 42 item 13: --bfloat16-fallback says how the dtype was chosen; the resolved dtype, compared, says what
    ran. A float32 run resumed with the switch turned (config/CPU.sh's float32 on a CPU without bfloat16, resumed
    with it off: here the other way round) goes ahead (7c8846a: "written with other settings, which would change the
    run: --bfloat16-fallback True (checkpoint: False)")."""
    folder = shutil.copytree(stopped_checkpoints, tmp_path / "ckpt")
    result = run_train([*STOPPED_RUN, "--checkpoint-dir", str(folder), "--bfloat16-fallback", "1"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"key": "resumed_from"' in result.stdout and '"key": "run_stop"' in result.stdout


def test_each_rank_checks_its_own_dali_states_and_the_ranks_agree_at_4_ranks(recs, two_checkpoints, tmp_path):
    """GPU review 6, F2: before INIT_START rank 0 alone built and restored every rank's DALI pipelines, one after
    another (128 builds and ~7 GB read at 8x8 while 63 ranks waited). Now, in a 4-rank resume check (the checkpoints
    of a 4-rank run, each rank's files rank 0's; rank 2's train state forged in the newest), each rank builds its own
    pipelines only, the same count whatever the world size, and the ranks agree: the newest refused on rank 2's word
    (its own line says why, rank 0's names it and sets the checkpoint aside), the one before resumed by all.
    On f3422b2 rank 0 built 11 (every rank's in turn, the newest's up to rank 2's train state), the others none."""
    from rn50_mx.checkpoint.disk import summary

    folder = shutil.copytree(two_checkpoints, tmp_path / "ckpt")
    for step in (STEPS, STEPS + 2):
        path = folder / f"step-{step}"
        for name in os.listdir(path):
            for rank in (1, 2, 3) if name.startswith("rank0.") else ():
                shutil.copy(path / name, path / name.replace("rank0.", f"rank{rank}.", 1))
        meta = json.loads((path / "meta.json").read_text())
        meta["world"], meta["settings"]["kv_store"] = 4, "horovod"
        meta["files"] = summary(str(path))
        (path / "meta.json").write_text(json.dumps(meta))
    forge(str(folder / f"step-{STEPS + 2}"), "rank2.train.dali", random_bytes)
    command = [*gloo_ranks(4), sys.executable, "-m", "tests.support.resume_check",
               *argv(recs, 1, checkpoint_dir=folder, kv_store="horovod", dgxngpu=4), "--standin=devices"]
    result = subprocess.run(command, env=clean_environ(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    reports = re.findall(r"rank (\d): built (\[.*?\]); resumes (\S+)", result.stdout)
    assert sorted(rank for rank, _, _ in reports) == ["0", "1", "2", "3"], result.stdout
    for rank, built, resumed in reports:  # each checkpoint's own two pipelines; rank 2's train state stops its first
        own = f"('train', {rank}), ('val', {rank})"
        assert built == (f"[('train', 2), {own}]" if rank == "2" else f"[{own}, {own}]"), (rank, built)
        assert resumed == str(folder / f"step-{STEPS}"), (rank, resumed)
    newest = folder / f"step-{STEPS + 2}"
    assert re.search(rf"rn50_mx: {newest}: refused on rank 2 \(rank2\.train\.dali: DALI cannot restore it \(",
                     result.stderr), result.stderr
    assert (f"rn50_mx: {newest}: refused (rank 2 refused its DALI states, saying why in its own line); renamed "
            f"step-{STEPS + 2}.refused; using step-{STEPS}") in result.stderr, result.stderr
    assert sorted(os.listdir(folder)) == ["lock", f"step-{STEPS}", f"step-{STEPS + 2}.refused"]


def test_the_normconv_wiring_is_compared_on_resume_and_an_older_checkpoint_ran_the_default():
    """Issue 47: RN50_NORMCONV_WIRING chooses other kernels, as RN50_NORMCONV does, so a resume with the other one is
    refused naming it; a checkpoint written before the setting existed recorded none and ran stats-fl, the default,
    so it resumes with it (f3422b2's comparison took a setting a checkpoint lacks for None: every checkpoint of the
    version before a new setting was refused)."""
    from rn50_mx.checkpoint import folder

    s = Settings()
    saved = {"settings": {f: getattr(s, f) for f in config.FIELDS if f not in folder.FREE}, "world": 1}
    assert folder.differences(saved, s, 1) == []
    assert folder.differences(saved, s.replace(normconv_wiring="mainloop-fl"), 1) == [
        "--normconv-wiring mainloop-fl (checkpoint: stats-fl)"]
    del saved["settings"]["normconv_wiring"]
    assert folder.differences(saved, s, 1) == []
