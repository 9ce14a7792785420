"""python -m rn50_mx.tune on a real .rec: its fragment goes through the launchers' sourcing and `python -m rn50_mx.check`,
its candidates change only the throughput knobs, its search stops on the budget, bad data stop it before timing."""
import dataclasses
import os
import shutil

import mxnet as mx
import pytest

from tests.support.procs import ONE_THREAD, ROOT, bash, sourced
from rn50_mx import config
from rn50_mx.tune import output, search, space, workers

# The demo's step, small: the test's .rec has 3 classes of 7 images, decoded at the demo's 32x32 (the settings'
# default, ImageNet's 224x224, made each candidate's window of a few steps cost seconds of CPU).
SMALL = {"BATCHSIZE": "4", "NUM_CLASSES": "3", "SEED": "1", "IMAGE_SHAPE": "3,32,32", **ONE_THREAD}


def small_settings(prefix, **environ):
    return config.load(["--data-train", prefix + ".rec"], {**SMALL, "DALI_THREADS": "2", "OMP_NUM_THREADS": "2",
                                                          **environ})


def check_listing(stdout):
    """`python -m rn50_mx.check`'s listing as {flag: (value, origin)}."""
    rows = [line.split() for line in stdout.splitlines() if line.startswith("--")]
    return {row[0]: (row[1], row[-1]) for row in rows}


def test_fragment_round_trips_through_the_launchers_and_config_check(small_rec, tmp_path):
    """The fragment, sourced as the launchers source it (trials.sh's source_fragments), gives its values to `config
    --check`, except where a variable was exported after the config: that export wins."""
    s = small_settings(small_rec)
    choice = {**space.start(s), "dali_threads": 1, "dali_prefetch_queue": 3, "dali_roi_decode": False}
    os.makedirs(tmp_path / "config")
    shutil.copy(os.path.join(ROOT, "config", "CPU.sh"), tmp_path / "config" / "CPU.sh")
    path = str(tmp_path / "config" / "CPU_tuned.sh")
    output.write_fragment(path, output.fragment(s, space.start(s), choice, (0.9, 0.97), "test"))
    assert sorted(os.listdir(tmp_path / "config")) == ["CPU.sh", "CPU_tuned.sh"]  # no temporary or lock left
    result = bash(f"set -euo pipefail; LAUNCHER=test; source trials.sh; source {tmp_path}/config/CPU.sh; "
                  f"export DALI_PREFETCH_QUEUE=4 BATCHSIZE=4; source_fragments {tmp_path}/config/CPU.sh; "
                  f"python -m rn50_mx.check --data-train {small_rec}.rec", env=SMALL, timeout=300)
    assert result.returncode == 0, result.stderr
    listing = check_listing(result.stdout)
    assert listing["--dali-threads"] == ("1", "DALI_THREADS")
    assert listing["--dali-roi-decode"] == ("False", "DALI_ROI_DECODE")
    assert listing["--dali-prefetch-queue"] == ("4", "DALI_PREFETCH_QUEUE")  # exported after the config
    assert listing["--dali-resize-antialias"][1] == "default"
    assert "test: sourced" in result.stdout and "DALI_THREADS=1" in result.stdout
    assert "DALI_PREFETCH_QUEUE=3" not in result.stdout


def test_candidates_change_only_the_throughput_knobs(small_rec):
    """Every grid point, with and without --allow-augmentation-changes, differs from the config only in the knobs
    allowed; antialiasing is among them only with the flag."""
    s = small_settings(small_rec)
    for allow, allowed in ((False, set(space.KNOBS)), (True, set(space.KNOBS + space.AUGMENTATION))):
        points = space.grid(s, allow)
        assert len(points) == len({space.describe(p) for p in points}) > 1
        for knobs in points:
            tuned = space.apply(s, knobs)
            changed = {f.name for f in dataclasses.fields(s) if getattr(tuned, f.name) != getattr(s, f.name)}
            assert changed <= allowed
        antialias = {p.get("dali_resize_antialias") for p in points}
        assert antialias == ({True, False} if allow else {None})


def test_search_moves_one_knob_at_a_time_and_keeps_antialiasing(small_rec):
    """A search with a target it cannot reach tries the knobs' neighbours, each candidate one knob away from an
    incumbent, antialiasing never among them; an OpenMP candidate is timed in a worker process."""
    s = small_settings(small_rec)
    pool = workers.Workers(s, mx.cpu())
    try:
        knobs = space.searched(s, False)[:2]  # DALI's threads, then MXNet's (in a worker process)
        run = search.Search(pool, space.start(s), knobs, budget_s=1e9, target=100.0, steps=1, rounds=1)
        choice = run.run()
        remote = list(pool.remote)
    finally:
        pool.close()
    assert run.stop == "every knob tried" and run.rows[0].verdict == "start"
    incumbents = [run.rows[0].knobs] + [row.knobs for row in run.rows if row.verdict == "kept"]
    for row in run.rows[1:]:
        assert min(sum(row.knobs[k] != inc[k] for k in row.knobs) for inc in incumbents if inc != row.knobs) == 1
        assert "dali_resize_antialias" not in row.knobs
    assert choice == incumbents[-1]
    assert remote and all(omp != run.rows[0].knobs["omp_num_threads"] for omp in remote)


@pytest.mark.parametrize("target", ["0.98", "0"])
def test_search_stops_on_the_budget(small_rec, tmp_path, target):
    """With a budget spent by the ceiling, the tuner times no candidate and writes the settings it started from;
    a start that reaches the target (always, at 0) is not timed again either: confirming it is over budget too."""
    result = sourced("CPU", f"python -m rn50_mx.tune --budget 0.001 --steps 1 --rounds 1 --out {tmp_path} "
                     f"--target {target} --data-train {small_rec}.rec", SMALL, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "stopped: budget spent" in result.stdout
    table = result.stdout.split("verdict\n", 1)[1].split("stopped:")[0].strip().splitlines()
    assert len(table) == 1 and table[0].endswith("s)") and " start " in table[0]
    fragment = open(tmp_path / "CPU_tuned.sh").read()
    assert "export DALI_THREADS=2\n" in fragment and "ANTIALIAS" not in fragment


def test_missing_data_fails_in_one_line_before_timing(tmp_path):
    for env in ({"DATADIR": str(tmp_path)}, {"DATA_TRAIN": str(tmp_path / "gone.rec")}):
        result = sourced("CPU", "python -m rn50_mx.tune", env, timeout=120)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and ("train.rec" in lines[0] or "gone.rec" in lines[0]), result.stderr
        assert "Traceback" not in result.stderr and "ceiling" not in result.stdout


def test_datadir_names_the_data_and_omp_threads_come_only_from_the_environment(tmp_path):
    s, origins = config.resolve([], {"DATADIR": str(tmp_path), "OMP_NUM_THREADS": "3"})
    assert (s.data_train, s.data_val) == (str(tmp_path / "train.rec"), str(tmp_path / "val.rec"))
    assert origins["data_train"] == "DATADIR" and s.omp_num_threads == 3
    assert config.resolve(["--data-train", "x.rec"], {"DATADIR": str(tmp_path)})[0].data_train == "x.rec"
    result = bash("python -m rn50_mx.check --omp-num-threads 2")
    assert result.returncode == 2 and "set the variable instead" in result.stderr


def test_dry_run_prints_the_plan_without_data():
    result = sourced("CPU", "python -m rn50_mx.tune --dry-run")
    assert result.returncode == 0, result.stderr
    assert "train data not given (the timed run needs DATADIR or --data-train)" in result.stdout
    assert "DALI_THREADS" in result.stdout and "stops at real/synthetic" in result.stdout


def test_the_tuner_times_a_progressive_config_at_image_shape(three_classes):
    """GPU review 4, F2: the tuner's ceiling was `--synthetic`, which progressive resizing refuses (a SettingsError
    before any timing on the recipe's open GPU config); both contenders are now timed without the lever."""
    from tests.support.settings import open_settings

    s = open_settings(three_classes, prog_start_side=16, prog_step=16, prog_end_epoch=2, num_epochs=3)
    local = workers.Local(s, mx.cpu())
    rates = [local.rate(None, 1), local.rate(space.start(s), 1)]  # synthetic batches, then the real pipeline's
    assert all(rate.images_per_s > 0 for rate in rates)
