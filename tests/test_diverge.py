"""A run whose loss diverges stops itself within a few steps and says so (issue 43): one line naming where and the
settings that set the step size, MLPerf `diverged` then run_stop aborted, exit 78 (rn50_mx/exit_codes.sh); every rank
at the same step; no checkpoint of the diverged state; the launchers name the trial diverged.

The runs are rn50_mx.train itself or this file as a worker (`python tests/test_diverge.py OUT FLAGS...`), which runs
rn50_mx.train's main after wrapping its train_step to write each step's mean loss to OUT.rank<R>: the steps each rank
ran and where its loss first went wrong, read from outside the package's code."""
import math
import os
import re
import subprocess
import sys

from tests.support.mllog import events
from tests.support.procs import PYTHONPATH, ROOT, clean_environ, gloo_ranks, sourced
from tests.support.settings import SHRUNK_LAYERS, TINY
from rn50_mx import checkpoint, timing

THIS = os.path.abspath(__file__)
WARM_UP_STEPS = 1  # train.warm_up's steps on zeros on the CPU (one training size, train.warm_up_runs), recorded first
# A synthetic run of 16 steps an epoch (2 epochs, 3 classes, 32x32), plain SGD without momentum.
SYNTHETIC = ["--synthetic", "1", "--num-examples", "64", "--batch-size", "4", "--num-epochs", "2", "--warmup-epochs",
             "0", "--eval-offset", "0", "--image-shape", "3,32,32", "--num-classes", "3", "--optimizer", "sgd", "--mom",
             "0", "--seed", "7", "--disp-batches", "4", "--dali-threads", "1", "--num-layers", str(SHRUNK_LAYERS)]


def run_worker(out, flags, launch=(), timeout=300):
    return subprocess.run([*launch, sys.executable, THIS, str(out), *flags], env={**clean_environ(), **PYTHONPATH},
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def losses(out, rank=0):
    """Each training step's mean loss on `rank`, the warm-up's left out."""
    with open(f"{out}.rank{rank}") as f:
        return [float(line) for line in f][WARM_UP_STEPS:]


def first(values, wrong):
    """The 1-based step of the first value for which wrong(value) holds (None when none does)."""
    return next((i for i, value in enumerate(values, 1) if wrong(value)), None)


def diverged_lines(text):
    return [re.sub(r"^\[\d+\]<stdout>:", "", line) for line in text.splitlines()
            if re.match(r"^(\[\d+\]<stdout>:)?diverged at ", line)]


def test_a_nan_loss_stops_the_run_within_8_steps_with_one_line_and_run_stop_aborted(tmp_path):
    """SGD at LR 1e30: the loss is NaN from the second step. The run stops within 8 steps of it, at a check (every 4
    steps), with one line naming the epoch, the step and OPTIMIZER, LR, WARMUP_EPOCHS and BATCHSIZE; its log ends
    `diverged`, run_stop aborted; it exits 78 and saves no model. The old code trained both epochs (32 steps)."""
    out, log, model = tmp_path / "steps", tmp_path / "mlperf.log", tmp_path / "model"
    result = run_worker(out, [*SYNTHETIC, "--lr", "1e30", "--mllog-file", str(log), "--save-model", str(model)])
    ran = losses(out)
    bad = first(ran, lambda loss: not math.isfinite(loss))
    assert result.returncode == checkpoint.DIVERGED_EXIT, (len(ran), bad, result.stdout[-2000:], result.stderr[-2000:])
    assert bad is not None and bad < len(ran) <= bad + 8 and len(ran) % checkpoint.stops.CHECK_PERIOD == 0, (bad, ran)
    [line] = diverged_lines(result.stdout)
    assert line.startswith(f"diverged at epoch 1 step {len(ran)}: loss nan over the run's steps "), line
    assert "on 1 of 1 rank(s)" in line and "(1000 ln 3 = 1098.6)" in line, line
    assert "OPTIMIZER=sgd LR=1e+30 WARMUP_EPOCHS=0.0 BATCHSIZE=4 x 1 rank(s)" in line, line
    lines = events(log)
    assert [key for key, _, _ in lines[-2:]] == ["diverged", "run_stop"], lines[-3:]
    assert lines[-2][2]["step"] == len(ran) and lines[-1][2]["status"] == "aborted"
    assert not any(name.startswith("model") for name in os.listdir(tmp_path))


def test_a_divergence_after_the_last_check_of_an_epoch_leaves_no_checkpoint(tmp_path):
    """2 steps an epoch, a checkpoint after each: the loss goes NaN at step 2, before any check of the stop agreement
    (every 4 steps). The checkpoint after epoch 1 is not written: the steps since the last check are judged first
    (Stops.settle), and the run stops there, its folder marked ended. The old code wrote step-2 and step-4 with NaN
    weights (epoch lines 'loss nan') and trained on."""
    folder = tmp_path / "ckpt"
    flags = [*SYNTHETIC, "--num-examples", "8", "--num-epochs", "3", "--lr", "1e30", "--checkpoint-dir", str(folder),
             "--checkpoint-every", "1", "--accuracy-threshold", "1.0"]
    result = run_worker(tmp_path / "steps", flags)
    assert result.returncode == checkpoint.DIVERGED_EXIT, result.stdout[-2000:] + result.stderr[-2000:]
    assert diverged_lines(result.stdout)[0].startswith("diverged at epoch 1 step 2: loss nan over the run's steps 1-2")
    assert sorted(os.listdir(folder)) == ["finished", "lock"]
    assert (folder / "finished").read_text() == "run_stop diverged\n"
    assert len(losses(tmp_path / "steps")) == 2


def test_a_checkpoint_of_a_stateless_optimizer_is_usable(tmp_path, capsys):
    """SGD without momentum keeps no optimizer state: its checkpoint's trainer file holds no arrays, which MXNet
    loads back as [] (mx.nd.save of {}). The checkpoint after epoch 1 is the one a resume would use. The old code
    refused every such checkpoint ("trainer holds unnamed arrays"): a run of these settings could not be resumed."""
    folder = tmp_path / "ckpt"
    flags = [*SYNTHETIC, "--num-examples", "8", "--lr", "0.1", "--checkpoint-dir", str(folder), "--checkpoint-every",
             "1", "--accuracy-threshold", "1.0"]
    result = run_worker(tmp_path / "steps", flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    chosen = checkpoint.newest_usable(str(folder), set_aside=False)
    assert chosen == str(folder / "step-2"), (sorted(os.listdir(folder)), capsys.readouterr().err)


def test_a_divergence_in_a_run_s_last_steps_stops_it_as_diverged_with_no_model(tmp_path):
    """One epoch of 4 steps, NaN from step 2: the check issued at step 4 is the run's last, read by no later one. It
    is read when the run ends: exit 78, the one line, run_stop aborted, no model. The old code ended the run as a
    missed target (exit 0, no `diverged`) and saved the NaN model."""
    log, model = tmp_path / "mlperf.log", tmp_path / "model"
    flags = [*SYNTHETIC, "--num-examples", "16", "--num-epochs", "1", "--lr", "1e30", "--mllog-file", str(log),
             "--save-model", str(model)]
    result = run_worker(tmp_path / "steps", flags)
    assert result.returncode == checkpoint.DIVERGED_EXIT, result.stdout[-2000:] + result.stderr[-2000:]
    [line] = diverged_lines(result.stdout)
    assert line.startswith("diverged at epoch 1 step 4: loss nan over the run's steps 1-4 "), line
    assert [key for key, _, _ in events(log)][-2:] == ["diverged", "run_stop"]
    assert len(losses(tmp_path / "steps")) == 4
    assert not any(name.startswith("model") for name in os.listdir(tmp_path))


def test_a_nan_model_is_never_scored_a_success_at_a_target_a_constant_answer_reaches(three_classes, tmp_path):
    """Issue 49, class 2: the tiny set's 6 steps an epoch, NaN from step 2; the check issued at step 4 is read at
    step 8, after the epoch's eval, which judged the NaN weights: their constant answer (a third of the val images
    right) reached a target of 0.2: run_stop success, exit 0, the NaN model saved. The steps since the last check are
    read before an eval now: diverged, no eval, no model."""
    log, model = tmp_path / "mlperf.log", tmp_path / "model"
    flags = [*SYNTHETIC[4:], "--data-train", f"{three_classes}/train.rec", "--data-val", f"{three_classes}/val.rec",
             "--num-epochs", "1", "--lr", "1e30", "--accuracy-threshold", "0.2", "--mllog-file", str(log),
             "--save-model", str(model)]
    result = run_worker(tmp_path / "steps", flags)
    assert result.returncode == checkpoint.DIVERGED_EXIT, result.stdout[-2000:] + result.stderr[-2000:]
    assert diverged_lines(result.stdout)[0].startswith("diverged at epoch 1 step 6: loss nan over the run's steps")
    keys = [key for key, _, _ in events(log)]
    assert "eval_accuracy" not in keys and keys[-2:] == ["diverged", "run_stop"], keys[-4:]
    assert events(log)[-1][2]["status"] == "aborted"
    assert not any(name.startswith("model") for name in os.listdir(tmp_path))


def test_two_ranks_stop_at_the_same_step_when_one_rank_s_loss_goes_past_the_limit_first(tmp_path):
    """Two Gloo ranks launched with different learning rates (a launch whose ranks got different environments: rank 1
    LR 20, rank 0 LR 0): rank 1's loss on its own synthetic batch goes past 1000 ln 3 at its second step while rank 0's
    stays near ln 3 (its update is LR x the summed gradient, nothing at LR 0). Both ranks stop at the same step, the one
    line says 1 of 2 ranks went past, and the ranks' stop barrier met (each rank counted the same checks). The old code
    trained both epochs on both ranks."""
    out, log = tmp_path / "steps", tmp_path / "mlperf.log"
    per_rank_lr = ["sh", "-c", 'exec "$0" "$@" --lr $(( HOROVOD_RANK == 1 ? 20 : 0 ))']
    result = run_worker(out, [*SYNTHETIC, "--kv-store", "horovod", "--dgxngpu", "2", "--mllog-file", str(log)],
                        launch=[*gloo_ranks(2), *per_rank_lr])
    ranks = [losses(out, rank) for rank in (0, 1)]
    limit = checkpoint.loss_limit(3)
    past = [first(steps, lambda loss: not loss <= limit) for steps in ranks]
    assert len(ranks[0]) == len(ranks[1]), (ranks, result.stdout[-3000:])
    assert past[0] is None and past[1] is not None and len(ranks[1]) <= past[1] + 8, (past, ranks)
    [line] = diverged_lines(result.stdout)
    assert line.startswith(f"diverged at epoch 1 step {len(ranks[0])}: loss ") and "on 1 of 2 rank(s)" in line, line
    assert "x 2 rank(s)" in line, line
    assert re.search(r"^Process \d exit with status code 78\.$", result.stdout + result.stderr, re.M)
    assert [key for key, _, _ in events(log)][-2:] == ["diverged", "run_stop"]


def test_config_cpu_at_sgd_lr_1000_stops_and_the_launchers_name_the_trial_diverged(three_classes, tmp_path):
    """config/CPU.sh with OPTIMIZER=sgd LR=1000 DTYPE=float32 (on the demo data its loss was 3.8e24 after epoch 1,
    finite, and it trained all its epochs), shrunk to the tiny set, through run_with_docker.sh: training stops itself
    (the loss past 1000 ln 5, finite), run_and_time.sh says the loss diverged and exits 78, the timing table shows the
    run as diverged and the trial loop's summary names the trial diverged. The old code trained its 3 epochs and
    called the trial a run that did not converge."""
    logs = tmp_path / "logs"
    env = {**TINY, "NUMEPOCHS": "3", "ACCURACY_THRESHOLD": "0.99", "OPTIMIZER": "sgd", "LR": "1000",
           "DTYPE": "float32", "CLEAR_CACHES": "0", "DATADIR": three_classes, "LOGDIR": str(logs), "NEXP": "1",
           "SEED": "7", "DATESTAMP": "d"}
    result = sourced("CPU", "./run_with_docker.sh", env, timeout=600)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    [line] = diverged_lines(result.stdout)
    assert re.match(r"diverged at epoch \d step \d: loss [0-9.e+]+ over the run's steps", line), line
    assert "OPTIMIZER=sgd LR=1000.0 WARMUP_EPOCHS=0.0 BATCHSIZE=4 x 1 rank(s)" in line, line
    assert "run_and_time.sh: the loss diverged (" in result.stdout  # the trial's output, in its log too
    assert result.stderr.strip().splitlines()[-1].startswith(
        "run_with_docker.sh: trial(s) 1 of 1 failed; 1 diverged (each log says at which step and loss)")
    [row] = [row for row in result.stdout.splitlines() if row.startswith("d_1.log ")]
    assert row.split()[3] == "diverged", row
    run = timing.read_run(str(logs / "d_1.log"), "1.0.0")
    assert run.status == "aborted" and run.diverged.startswith("diverged at epoch ")


if __name__ == "__main__":
    from rn50_mx import train
    from rn50_mx.errors import run_cli

    record = open(f"{sys.argv[1]}.rank{os.environ.get('HOROVOD_RANK', '0')}", "w")
    step = train.train_step

    def recording_step(net, loss_fn, trainer, batch, update=None):
        loss = step(net, loss_fn, trainer, batch, update)
        record.write(f"{loss.asscalar() / batch.data[0].shape[0]}\n")
        record.flush()
        return loss

    train.train_step = recording_step
    sys.argv = ["rn50_mx.train", *sys.argv[2:]]
    run_cli(train.main, "rn50_mx.train")
