"""rn50_mx.recipe on the RCP files mlperf-logging installs, and the configs it writes run through `python -m rn50_mx.check`."""
import argparse
import json
import os
import re
import shutil

import pytest

from tests.support.procs import ROOT, assert_one_line_naming, bash, run_recipe, sourced
from rn50_mx import config, recipe, train
from rn50_mx.errors import InputError

# Fields of `python -m rn50_mx.check`'s listing that make the recipe and the machine's shape.
RECIPE_FLAGS = ("--batch-size", "--lr", "--end-lr", "--warmup-epochs", "--num-epochs", "--mom", "--wd", "--lars-eta",
                "--lars-eps", "--optimizer", "--eval-period", "--eval-offset", "--kv-store", "--dgxngpu", "--dgxnnodes")


def rcp_json(ruleset):
    """The package's ResNet RCPs by global batch, read without rn50_mx."""
    with open(recipe.rcp_file(ruleset)) as f:
        return {record["BS"]: record for record in json.load(f).values()}


def args(nodes, gpus, max_batch=recipe.DEFAULT_MAX_BATCH, ruleset=recipe.DEFAULT_RULESET):
    return argparse.Namespace(nodes=nodes, gpus_per_node=gpus, max_batch_per_gpu=max_batch, ruleset=ruleset)


def listing(stdout):
    """`python -m rn50_mx.check`'s listing as {flag: value text}, and its last line (the RCP verdict)."""
    lines = stdout.strip().splitlines()
    return {line.split()[0]: line.split()[1] for line in lines[:-1]}, lines[-1]


def check_written(path):
    """`python -m rn50_mx.check` after sourcing a written config, as the launchers source it."""
    result = bash(f"set -euo pipefail; source {path}; python -m rn50_mx.check")
    assert result.returncode == 0, result.stderr
    return listing(result.stdout)


@pytest.mark.parametrize("batch, epochs", [(1632, 35), (3264, 37), (13056, 48)])
def test_decay_steps_in_epochs_and_in_steps_give_one_horizon(batch, epochs):
    # 1.0.0 gives these horizons in epochs (35, 37, 48), 1.1.0 in steps (27476, 14523, 4710)
    old, new = rcp_json("1.0.0")[batch], rcp_json("1.1.0")[batch]
    assert old["Hyperparams"]["opt_learning_rate_decay_steps"] == epochs
    assert new["Hyperparams"]["opt_learning_rate_decay_steps"] > 1000
    assert recipe.whole_epochs(recipe.horizon_epochs(old)) == recipe.whole_epochs(recipe.horizon_epochs(new)) == epochs


@pytest.mark.parametrize("ruleset", recipe.rulesets())
def test_every_horizon_covers_where_its_runs_converged(ruleset):
    # 1.0.0's 65536 says 1133 steps (58 epochs) for runs that converged at 83-86: counted after its 31 warmup epochs;
    # 2.0.0's 67840 repeats those 1133 steps (60 epochs at its batch): 91 for runs at 85-87
    for record in rcp_json(ruleset).values():
        horizon = recipe.whole_epochs(recipe.horizon_epochs(record))
        epochs = record["Epochs to converge"]
        assert recipe.mode_epoch(epochs) <= horizon <= max(epochs) + 4, (record["BS"], horizon, epochs)


def test_four_gpus_land_on_1632_with_its_values():
    r = recipe.choose(args(1, 4))
    hyper = rcp_json("1.0.0")[1632]["Hyperparams"]
    assert (r.kind, r.global_batch, r.batch_per_gpu) == ("RCP", 1632, 408)
    assert (r.lr, r.warmup_epochs, r.momentum, r.wd, r.num_epochs) == (
        hyper["opt_base_learning_rate"], hyper["opt_learning_rate_warmup_epochs"], hyper["opt_momentum"],
        hyper["opt_weight_decay"], hyper["opt_learning_rate_decay_steps"])
    # 3 of its 17 runs converged after the horizon, at the end LR, up to epoch 37: a run trains on to the eval
    # after epoch 39 (the schedule evaluates 3, 7, ..., 35, 39) instead of stopping unjudged
    s = r.settings()
    assert (r.expect[2], s.num_epochs, s.max_epochs, s.epoch_limit) == (37, 35, 39, 39)
    assert train.eval_epochs(s)[-2:] == [34, 38]


@pytest.mark.parametrize("nodes, gpus, max_batch", [(1, 8, 408), (1, 4, 408), (8, 8, 204), (1, 1, 408)])
def test_the_last_eval_judges_the_slowest_reference_run(nodes, gpus, max_batch):
    r = recipe.choose(args(nodes, gpus, max_batch=max_batch))
    last = train.eval_epochs(r.settings())[-1] + 1
    assert r.expect[2] <= last == r.last_eval < r.expect[2] + 4


def test_sixteen_gpus_skip_the_rcp_the_closed_rules_reject():
    # 1.0.0's 4096 (16 x 256) has weight decay 0.002, not 1e-4 x 2^N: the next RCP down, 16 x 204 = 3264, is taken
    r = recipe.choose(args(2, 8, max_batch=256))
    assert (r.kind, r.global_batch, r.batch_per_gpu, r.lr) == ("RCP", 3264, 204, 10.5)
    assert "skipped resnet_ref_4096" in r.notes[0] and "lars_opt_weight_decay=0.002" in r.notes[0]
    # 1.1.0 corrected it to 2e-4, so there 4096 is taken
    assert recipe.choose(args(2, 8, max_batch=256, ruleset="1.1.0")).global_batch == 4096


def test_closed_rule_failures_come_from_the_compliance_checker():
    s = config.Settings(dgxngpu=8, kv_store="horovod")  # the global batch of 8 x 408: 3264
    assert s.global_batch == 3264
    assert recipe.closed_rule_failures(s, "1.0.0") == []
    failures = recipe.closed_rule_failures(s.replace(wd=3e-5, end_lr=1e-3), "1.0.0")
    assert len(failures) == 2
    assert any(f.startswith("lars_opt_weight_decay=3e-05") for f in failures)
    assert any(f.startswith("lars_opt_end_learning_rate=0.001") for f in failures)


def test_a_batch_between_rcps_is_interpolated_with_the_checkers_epochs():
    r = recipe.choose(args(1, 7))  # 7 x 408 = 2856, between the pruned RCPs 1632 and 3264
    table = recipe.load_checker("1.0.0").rcp_data
    low, high = (next(rec for rec in table.values() if rec["BS"] == bs) for bs in (1632, 3264))
    expected = low["RCP Mean"] + (high["RCP Mean"] - low["RCP Mean"]) * (2856 - 1632) / (3264 - 1632)
    assert (r.kind, r.global_batch) == ("interpolated", 2856)
    assert r.expect[0] == pytest.approx(expected)
    assert "not validated by an RCP" in r.basis
    assert 7.4 < r.lr < 10.5 and r.lr == pytest.approx((7.4 ** 2 + (10.5 ** 2 - 7.4 ** 2) * 0.75) ** 0.5, abs=0.01)
    assert "no RCP of ruleset 1.0.0 is a multiple of 7 GPUs" in r.notes[0]


def test_one_or_two_gpus_start_from_published_runs():
    one, two = recipe.choose(args(1, 1)), recipe.choose(args(1, 2))
    assert (one.kind, one.global_batch, one.lr, one.num_epochs) == ("published", 408, 3.0, 37)
    assert (two.kind, two.global_batch, two.lr) == ("published", 816, 5.3)
    assert "below the smallest RCP (1632)" in one.notes[0]
    assert "2xa30_ngc22.04_mxnet" in one.basis


def test_a_machine_that_reaches_nothing_says_so(config_dir):
    result = run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "1", "--max-batch-per-gpu", "100")
    assert_one_line_naming(result, "--max-batch-per-gpu 100")
    assert "global batch 100 is outside every RCP and published run" in result.stderr
    assert os.listdir(config_dir) == ["gpu_common.sh"]


@pytest.mark.parametrize("system, nodes, gpus", [("NF5688M6", 1, 8), ("DGXA100_multi_8x8x204", 8, 8)])
def test_written_config_reproduces_ours_and_reaches_training(config_dir, system, nodes, gpus):
    result = run_recipe(config_dir, "--nodes", str(nodes), "--gpus-per-node", str(gpus), "--system", "MINE")
    assert result.returncode == 0, result.stderr
    assert f"wrote {config_dir}/MINE.sh" in result.stdout
    written, verdict = check_written(config_dir / "MINE.sh")
    ours = sourced(system, "python -m rn50_mx.check")
    assert ours.returncode == 0, ours.stderr
    reference, reference_verdict = listing(ours.stdout)
    assert {f: written[f] for f in RECIPE_FLAGS} == {f: reference[f] for f in RECIPE_FLAGS}
    assert written["--dgxsystem"] == "MINE"
    assert verdict == reference_verdict and "matches the RCP resnet_ref_" in verdict


def memory_line(result):
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("memory: "))


def test_the_memory_a_config_needs_is_stated_against_the_gpus(config_dir):
    """The written config's need (rn50_mx.memory) next to the GPU it plans for: 408 a GPU fits an A100-80GB (the
    submission's), 3264 on one GPU does not, nor does 408 on a 16 GiB card."""
    fits = memory_line(run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "8", "--system", "EIGHT"))
    assert re.fullmatch(r"memory: [\d.]+ GiB per process: input 1\.22, weights, gradients and optimizer states 0\.29, "
                        r"activations [\d.]+ \(estimate\) of the A100-80GB's 80\.0 GiB: \d+% of it", fits), fits
    one = memory_line(run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "1", "--max-batch-per-gpu", "3264",
                                 "--system", "ONE"))
    assert one.endswith("of the A100-80GB's 80.0 GiB: does not fit, lower the batch (--max-batch-per-gpu)"), one
    small = memory_line(run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "8", "--gpu-memory", "16",
                                   "--system", "SMALL"))
    assert small.endswith("of the 16 GiB GPU's 16.0 GiB: does not fit, lower the batch (--max-batch-per-gpu)")


@pytest.mark.parametrize("value", ["0", "-40", "nan", "inf", "forty"])
def test_a_bad_gpu_memory_is_one_line_naming_it(config_dir, value):
    result = run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "8", f"--gpu-memory={value}")
    assert_one_line_naming(result, "--gpu-memory")
    assert os.listdir(config_dir) == ["gpu_common.sh"]


def test_config_is_not_overwritten_unless_forced(config_dir):
    flags = ("--nodes", "1", "--gpus-per-node", "4", "--system", "FOUR")
    assert run_recipe(config_dir, *flags).returncode == 0
    again = run_recipe(config_dir, *flags)
    assert_one_line_naming(again, "FOUR.sh: exists; the config there is kept (give --force")
    assert run_recipe(config_dir, *flags, "--force").returncode == 0
    assert sorted(os.listdir(config_dir)) == ["FOUR.sh", "gpu_common.sh"]
    written, verdict = check_written(config_dir / "FOUR.sh")
    assert (written["--batch-size"], written["--lr"], written["--dgxngpu"]) == ("408", "7.4", "4")
    assert verdict == "RCP (1.0.0): global batch 1632: matches the RCP resnet_ref_1632"


def test_check_says_the_cpu_demo_is_off_the_table_and_runs_it():
    result = sourced("CPU", "python -m rn50_mx.check")
    assert result.returncode == 0, result.stderr
    assert listing(result.stdout)[1] == ("RCP (1.0.0): off the table: the ResNet RCPs are LARS runs on ImageNet's "
                                         "1000 classes; these settings train 10 classes")


def test_check_names_the_hyperparameters_that_leave_the_rcp():
    s = config.load(environ={"BATCHSIZE": "408", "DGXNGPU": "8", "KVSTORE": "horovod", "LR": "9"})
    assert recipe.verdict(s) == ("RCP (1.0.0): global batch 3264: the batch of resnet_ref_3264, but not its "
                                 "hyperparameters: LR 9.0 (its 10.5); not validated")
    s = s.replace(lr=10.5, batch_size=357)  # 8 x 357 = 2856
    assert recipe.verdict(s).startswith("RCP (1.0.0): global batch 2856: interpolated: the checker uses its "
                                        "interpolation between RCPs 1632 and 3264")


@pytest.mark.parametrize("gpu, decoder, threads, prefetch", [("A100", "0.7", "8", "2"), ("H100", "0.99", "8", "3")])
def test_written_config_starts_the_input_pipeline_for_the_gpu_generation(config_dir, gpu, decoder, threads, prefetch):
    """The written config sets the hardware decoder share of that generation's MLPerf configs, DALI threads from
    the cores per GPU and the resize buffer for the batch, and says to run the tuner next."""
    result = run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", "--gpu", gpu, "--cores-per-node", "56",
                        "--system", "FOUR")
    assert result.returncode == 0, result.stderr
    assert "next: tune its input pipeline" in result.stdout and "python -m rn50_mx.tune" in result.stdout
    written, _ = check_written(config_dir / "FOUR.sh")
    assert (written["--dali-hw-decoder-load"], written["--dali-threads"], written["--dali-prefetch-queue"]) == \
        (decoder, threads, prefetch)
    assert written["--dali-tmp-buffer-hint"] == str(871491 * 408)
    few_cores = run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", "--cores-per-node", "8",
                           "--system", "SMALL")
    assert few_cores.returncode == 0 and check_written(config_dir / "SMALL.sh")[0]["--dali-threads"] == "2"
    assert_one_line_naming(run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", "--cores-per-node", "0"),
                           "--cores-per-node=0")
    assert_one_line_naming(run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", "--gpu", "B200"),
                           "--gpu: invalid choice: 'B200'")


def test_walltime_covers_every_trial_of_the_job(config_dir):
    """run.sub runs NEXP trials (default 5) in one job: the written WALLTIME (minutes, as sbatch -t takes them)
    grows with NEXP."""
    assert run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", "--system", "FOUR").returncode == 0
    walltime = {nexp: bash(f"set -eu; {nexp} source {config_dir}/FOUR.sh; echo $WALLTIME").stdout.strip()
                for nexp in ("", "NEXP=1;", "NEXP=2;")}
    one, two = int(walltime["NEXP=1;"]), int(walltime["NEXP=2;"])
    assert int(walltime[""]) == one + 4 * (two - one) and two - one >= 55  # 35+ epochs at 4 x 3,431 img/s


def test_check_says_whether_it_checked_the_data(tmp_path):
    result = sourced("CPU", "python -m rn50_mx.check")
    assert "data: not checked: no --data-train/--data-val" in result.stdout
    missing = tmp_path / "train.rec"
    assert_one_line_naming(sourced("CPU", f"python -m rn50_mx.check --data-train {missing}"), str(missing))


@pytest.mark.parametrize("system", ["NF5688M6", "DGXA100_multi_8x8x204"])
def test_shipped_configs_walltime_covers_every_trial(system):
    walltime = [int(bash(f"set -eu; NEXP={nexp}; source config/{system}.sh; echo $WALLTIME").stdout)
                for nexp in ("1", "5")]
    assert walltime[1] - walltime[0] == 4 * (walltime[0] - 10) and walltime[0] >= 50


@pytest.mark.parametrize("system", ["x\ntouch {marker}", "../escaped", "a b", "-x", ""])
def test_a_config_name_that_is_not_a_name_is_one_line(config_dir, tmp_path, system):
    """--system names config/<NAME>.sh, which the launchers source: a newline became a shell line in it, ../ wrote
    outside --config-dir."""
    marker = tmp_path / "ran"
    result = run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", f"--system={system.format(marker=marker)}")
    assert_one_line_naming(result, "--system")
    assert os.listdir(config_dir) == ["gpu_common.sh"] and not os.path.exists(tmp_path.parent / "escaped.sh")


def test_the_command_in_the_config_s_comment_stays_one_line(tmp_path):
    """Every argument lands in the written config's comment, quoted and on one line: an odd --config-dir (with a
    newline) neither breaks the comment nor runs anything when the config is sourced."""
    folder = tmp_path / "cfg\ntouch ran"
    folder.mkdir()
    shutil.copy(os.path.join(ROOT, "config", "gpu_common.sh"), folder)
    result = run_recipe(folder, "--nodes", "1", "--gpus-per-node", "4", "--system", "ODD")
    assert result.returncode == 0, result.stderr
    text = (folder / "ODD.sh").read_text()
    [comment] = [line for line in text.splitlines() if "rn50_mx.recipe" in line and line.startswith("# written by")]
    assert "cfg\\ntouch ran" in comment
    assert bash(f"cd {tmp_path} && source '{folder / 'ODD.sh'}' >/dev/null").returncode == 0
    assert not (tmp_path / "ran").exists()


# --- --division open ---------------------------------------------------------------------------------------------
EIGHT = ("--nodes", "1", "--gpus-per-node", "8")
# What the open block changes beside the closed recipe (RN50_PROG_STEP and VAL_RESIZE keep their defaults, 32 and 256).
OPEN_CHANGES = {"val_crop", "eval_flip", "ema_decay", "ema_every", "prog_start_side", "prog_start_epoch",
                "prog_end_epoch", "image_shape", "normconv", "label_smoothing", "submission_division",
                "dgxsystem"}


def written_settings(path):
    """The settings training resolves after sourcing the config at `path`, as the launchers source it (validated:
    a config the settings refuse fails here)."""
    result = bash(f'set -euo pipefail; source "{path}"; env -0')
    assert result.returncode == 0, result.stderr
    environ = dict(item.split("=", 1) for item in result.stdout.split("\0") if "=" in item)
    return config.load([], environ)


def test_open_config_is_the_closed_recipe_plus_a_marked_block_of_the_published_levers(config_dir, capsys):
    """--division open writes <name>_open: the closed recipe's values, and the open levers at FFCV's and MosaicML's
    values, marked open in the file and in the recipe's words; the settings accept it and log it as open."""
    recipe.main([*EIGHT, "--config-dir", str(config_dir), "--system", "CLOSED"])
    closed_words = capsys.readouterr().out
    recipe.main([*EIGHT, "--config-dir", str(config_dir), "--division", "open"])
    words = capsys.readouterr().out
    path = config_dir / "custom_1x8x408_open.sh"
    text = path.read_text()
    closed, s = written_settings(config_dir / "CLOSED.sh"), written_settings(path)
    differ = {f for f in config.FIELDS if getattr(s, f) != getattr(closed, f)}
    assert differ == OPEN_CHANGES, differ
    assert set(config.open_levers(s)) == {"val_crop", "eval_flip", "ema_decay", "ema_every", "prog_start_side",
                                          "prog_start_epoch", "prog_end_epoch", "prog_step", "label_smoothing"}
    # FFCV: 160 -> 192 px, 192 from 19/24 of the horizon (here 37: epoch 29), eval crop 256 of a 292.6 px resize
    # (ours rounds: 293), flip averaging; MosaicML: EMA every 20 updates at Composer v0.7.0-RC1's half-life of 100
    # batches, label smoothing 0.08
    assert s.num_epochs == 37 and s.image_chw == (4, 192, 192) and s.train_sizes == [(160, 160), (192, 192)]
    assert [s.train_hw(e)[0] for e in (0, 28, 29, 38)] == [160, 160, 192, 192]
    assert (s.eval_chw, s.val_resize_side, s.eval_flip) == ((4, 256, 256), 293, True)
    assert (s.ema_every, s.ema_decay, s.label_smoothing) == (20, 0.8706, 0.08)
    assert 0.5 ** (20 / 100) == pytest.approx(s.ema_decay, abs=5e-5)
    assert (s.normconv, s.submission_division) == (False, "open")
    assert "NOT MLPerf-closed" in text and "# OPEN DIVISION" in text.splitlines()[1]
    block = text[text.index("export SUBMISSION_DIVISION=open"):]
    assert all("  # " in line for line in block.splitlines()[1:] if line.startswith("export "))
    assert all(len(line) <= 120 or "/" in line for line in text.splitlines())
    # the words: the closed recipe's, then that it is open, each lever with its source on one line, the horizon
    assert words.startswith(closed_words.split("\nmemory: ")[0])
    lines = words.splitlines()
    assert any(line.startswith("division: OPEN: open-division starting values, not MLPerf-closed") for line in lines)
    for lever, source in (("progressive resizing", "FFCV"), ("eval resolution", "FFCV"), ("flip averaging", "FFCV"),
                          ("weight EMA", "MosaicML"), ("label smoothing", "MosaicML")):
        [line] = [line for line in lines if line.startswith(f"  {lever}: ")]
        assert f"({source}: " in line
    assert any("costs NormConv (RN50_NORMCONV=0" in line for line in lines)
    assert any("python -m rn50_mx.search --mode open` is how to shorten it" in line for line in lines)


def test_default_division_writes_what_closed_writes(config_dir, capsys):
    """The closed config is unchanged by the open option: the default and --division closed write the same bytes
    (but for the command in the comment) and the same words; neither mentions the open division."""
    flags = [*EIGHT, "--config-dir", str(config_dir), "--system", "SAME", "--force"]
    recipe.main(flags)
    default, default_words = (config_dir / "SAME.sh").read_bytes(), capsys.readouterr().out
    recipe.main(flags + ["--division", "closed"])
    closed, closed_words = (config_dir / "SAME.sh").read_bytes(), capsys.readouterr().out
    assert closed.replace(b" --division closed", b"") == default and closed_words == default_words
    assert b"SUBMISSION_DIVISION" not in default and b"OPEN" not in default and "OPEN" not in default_words


def test_a_bad_division_is_one_line(config_dir):
    assert_one_line_naming(run_recipe(config_dir, *EIGHT, "--division", "bogus"), "--division: invalid choice")
    assert os.listdir(config_dir) == ["gpu_common.sh"]


def test_an_existing_open_config_is_kept_unless_forced(config_dir, capsys):
    flags = [*EIGHT, "--config-dir", str(config_dir), "--division", "open"]
    recipe.main(flags)
    path = config_dir / "custom_1x8x408_open.sh"
    path.write_text(path.read_text() + "# the user's edit\n")
    before = path.read_text()
    with pytest.raises(InputError, match="custom_1x8x408_open.sh: exists; the config there is kept"):
        recipe.main(flags)
    assert path.read_text() == before
    recipe.main(flags + ["--force"])
    assert "the user's edit" not in path.read_text()
    assert sorted(os.listdir(config_dir)) == ["custom_1x8x408_open.sh", "gpu_common.sh"]


@pytest.mark.parametrize("horizon", [35, 37, 48])
def test_the_ramp_scales_with_the_horizon_as_ffcv_s_24_epochs(horizon):
    """FFCV's 24-epoch run trains its last 5 epochs at 192 px (rounding to the nearest 32 between start_ramp 17 and
    end_ramp 20); the open config's ramp keeps that share of the horizon (to an epoch)."""
    exports = {env: value for lever in recipe.open_division.levers(horizon) for env, value, _ in lever.exports}
    start, end = exports["RN50_PROG_START_EPOCH"], exports["RN50_PROG_END_EPOCH"]
    assert start < end < horizon
    assert abs(start / horizon - 17 / 24) <= 0.5 / horizon and abs((horizon - end) / horizon - 5 / 24) <= 0.5 / horizon


def test_check_lists_the_open_config_s_levers(config_dir):
    """`python -m rn50_mx.check` after sourcing the open config (--system's name with _open), as the launchers run
    it: accepted, every lever on."""
    assert run_recipe(config_dir, "--nodes", "1", "--gpus-per-node", "4", "--system", "FOUR", "--division",
                      "open").returncode == 0
    assert sorted(os.listdir(config_dir)) == ["FOUR_open.sh", "gpu_common.sh"]
    result = bash(f"set -euo pipefail; source {config_dir}/FOUR_open.sh; python -m rn50_mx.check")
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("open-division levers: ")]
    assert line == ("open-division levers: --val-crop 256, --eval-flip True, --ema-decay 0.8706, --ema-every 20, "
                    "--prog-start-side 160, --prog-start-epoch 25, --prog-end-epoch 28, --prog-step 32, "
                    "--label-smoothing 0.08")
