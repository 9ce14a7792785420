"""rn50_mx.timing on the five official Inspur NF5688M6 v1.0 result logs, and on edited copies of them."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import PYTHONPATH, assert_one_line_naming
from tests.support.timing import FIXTURE, edited_fixture, report_of
from rn50_mx import files, timing
from rn50_mx.errors import InputError, run_cli

SHARED = Path(__file__).parents[2] / "shared/fixtures/mlperf-v1.0/Inspur/results/nf5688m6_mxnet/resnet"
NAMES = [f"result_{i}.txt" for i in range(1, 6)]
RUN_MS = [1642539, 1642731, 1642804, 1642704, 1642587]  # run_stop - run_start, fixtures/README.md


@pytest.fixture(scope="module")
def fixture_report():
    return report_of([FIXTURE], with_rcp=True)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/ is not beside the repo")
def test_fixture_copies_are_the_shared_logs():
    for name in NAMES:
        assert (FIXTURE / name).read_bytes() == (SHARED / name).read_bytes()


def test_fixture_times_and_score(fixture_report):
    runs = fixture_report["runs"]
    assert [run["name"] for run in runs] == NAMES
    assert [run["minutes"] for run in runs] == pytest.approx([ms / 60000 for ms in RUN_MS])
    assert round(fixture_report["score"]["minutes"], 3) == 27.378
    assert fixture_report["score"]["verdict"].startswith("valid")


def test_fixture_runs_pass_the_checker_and_converge_at_35(fixture_report):
    runs = fixture_report["runs"]
    assert [run["compliance"] for run in runs] == ["SUCCESS"] * 5
    assert [run["status"] for run in runs] == ["success"] * 5
    assert [run["converged_epoch"] for run in runs] == [35] * 5
    assert runs[0]["seed"] == 13863 and runs[0]["top1"] == 0.75924 and runs[0]["batch_size"] == 3264
    assert runs[0]["evals"][0] == [3, 0.32822]
    assert len(runs[0]["throughput"]) == 35 and runs[0]["throughput"][0] == [1, pytest.approx(26934.1286)]


def test_fixture_rcp(fixture_report):
    rcp = fixture_report["rcp"]
    assert rcp["passed"] is True and rcp["message"] == "RCP found"
    assert rcp["rcp_mean"] == pytest.approx(35.1538, abs=1e-4)
    assert rcp["min_epochs"] == pytest.approx(34.31, abs=1e-2)
    assert rcp["runs_mean"] == 35
    assert rcp["norm_factor"] == pytest.approx(rcp["rcp_mean"] / 35)
    # the v1.0 score was not scaled: normalization to the RCP mean came with the v2.1 round
    assert rcp["normalization_applies"] is False and rcp["normalized_minutes"] is None


def test_fixture_rcp_normalization_from_ruleset_2_1_0():
    report = report_of([FIXTURE], with_rcp=True, ruleset="2.1.0")
    assert report["rcp"]["normalization_applies"] is True
    assert report["rcp"]["normalized_minutes"] == pytest.approx(27.378 * 35.1538 / 35, abs=1e-3)


def test_json_output(capsys):
    timing.main(["--json", str(FIXTURE)])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"ruleset", "runs", "score", "rcp"}
    assert set(report["runs"][0]) >= {"path", "minutes", "status", "converged_epoch", "top1", "seed",
                                      "compliance", "compliance_reason", "counted"}
    assert round(report["score"]["minutes"], 3) == 27.378 and report["rcp"] is None


def test_table_output(capsys):
    timing.main([str(FIXTURE / name) for name in NAMES] + ["--rcp"])
    out = capsys.readouterr().out
    assert "score: 27.378 min" in out
    assert out.count("SUCCESS") == 5 and "13863" in out
    assert "RCP check: PASS (RCP found); RCP mean 35.154 epochs" in out
    assert "no normalization in ruleset 1.0.0" in out


def test_images_per_second_reads_both_shapes():
    assert timing.images_per_second("throughput", 1234.5, {"epoch_num": 7}, 3) == (7, 1234.5)  # our logs
    assert timing.images_per_second("throughput", 1234.5, {}, 3) == (3, 1234.5)  # v1.0: the current epoch
    assert timing.images_per_second("tracked_stats", {"imgs_sec": 99.0}, {"step": 4}, 3) == (4, 99.0)
    assert timing.images_per_second("eval_accuracy", 0.5, {"epoch_num": 3}, 3) == (None, None)


@pytest.mark.parametrize("names", [NAMES[:2], NAMES + ["result_6.txt"]])
def test_no_score_without_exactly_five_runs(tmp_path, names):
    for name in names:
        shutil.copy(FIXTURE / (name if name in NAMES else NAMES[0]), tmp_path / name)
    report = report_of([tmp_path], with_rcp=True)
    assert len(report["runs"]) == len(names)
    assert report["score"]["minutes"] is None
    assert report["score"]["verdict"] == f"no score: ResNet-50 is scored on exactly 5 runs, got {len(names)}"
    assert report["rcp"]["passed"] is None


def test_one_aborted_run_is_dropped_as_the_slowest(tmp_path):
    folder = edited_fixture(tmp_path, {"result_1.txt": ('"status": "success"', '"status": "aborted"')})
    report = report_of([folder])
    assert report["runs"][0]["status"] == "aborted" and report["runs"][0]["converged_epoch"] is None
    # result_1 was the fastest; now the fastest of the other four is dropped too
    assert report["score"]["minutes"] == pytest.approx((1642704 + 1642731 + 1642804) / 3 / 60000)
    assert "result_1.txt: run_stop aborted" in report["score"]["verdict"]


def test_two_dropped_runs_make_the_result_invalid(tmp_path):
    folder = edited_fixture(tmp_path, {"result_2.txt": ('"status": "success"', '"status": "aborted"'),
                                       "result_4.txt": ('"key": "cache_clear"', '"key": "cache_cleared"')})
    report = report_of([folder], with_rcp=True)
    assert report["runs"][3]["compliance"] == "FAILED" and report["runs"][3]["status"] == "success"
    assert report["runs"][3]["compliance_reason"] == "Required AT_LEAST_ONE occurrence of 'cache_clear' but found 0"
    assert report["score"]["minutes"] is None
    assert report["score"]["verdict"] == ("invalid: 2 runs dropped, at most 1 allowed (result_2.txt: run_stop "
                                          "aborted; result_4.txt: failed the compliance check)")
    assert report["rcp"]["passed"] is True  # the RCP checker looks at convergence only: one infinite run is allowed


def test_checker_crash_is_a_failed_run_and_the_next_check_is_clean(tmp_path):
    folder = edited_fixture(tmp_path, {"result_1.txt": ('"value": 0.75924', '"value": null')})
    verdict, reason = timing.check_compliance(str(folder / "result_1.txt"), "1.0.0")
    assert verdict == "FAILED" and reason.startswith("the checker crashed: TypeError")
    assert timing.check_compliance(str(folder / "result_2.txt"), "1.0.0") == ("SUCCESS", "")


def test_unparsed_mllog_lines_are_skipped_and_counted(tmp_path):
    folder = edited_fixture(tmp_path, {"result_3.txt": ("+ export SEED", ':::MLLOG {"key": broken\n+ export SEED')})
    run = timing.read_run(str(folder / "result_3.txt"), "1.0.0")
    assert run.unparsed_lines == 1 and run.status == "success"
    assert timing.check_compliance(run.path, "1.0.0") == ("FAILED", "Log lines had parsing errors.")


def test_plot_writes_a_png(tmp_path, fixture_report):
    png = tmp_path / "runs.png"
    timing.plot(fixture_report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000


def bad_inputs(tmp_path):
    """(argument, expected error) pairs, on real files made in tmp_path."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain.log").write_text("STARTING TIMING RUN\nno mllog here\n")
    text = (FIXTURE / "result_1.txt").read_text(encoding="latin-1")
    (tmp_path / "no_start.log").write_text(text.replace('"key": "run_start"', '"key": "run_begin"'))
    (tmp_path / "keyless.log").write_text(':::MLLOG {"time_ms": 1}\n')
    return [
        (tmp_path / "missing.log", "no such file or directory"),
        (tmp_path / "empty", "directory has no *.log or result_*.txt files"),
        (tmp_path / "plain.log", "no :::MLLOG lines"),
        (tmp_path / "no_start.log", "no run_start in its MLLOG lines"),
        (tmp_path / "keyless.log", "malformed MLLOG line (KeyError: 'key')"),
    ]


def test_bad_input_is_one_line(tmp_path, capsys):
    for path, problem in bad_inputs(tmp_path):
        with pytest.raises(SystemExit) as exit_:
            run_cli(lambda: timing.main([str(path)]), "timing")
        assert exit_.value.code == 2
        assert capsys.readouterr().err == f"timing: error: {path}: {problem}\n"


def test_module_entry_point_reports_bad_input(tmp_path):
    missing = tmp_path / "missing"
    done = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(missing)],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"python -m rn50_mx.timing: error: {missing}: no such file or directory\n"


def test_plot_says_where_the_picture_went(tmp_path, capsys):
    png = tmp_path / "runs.png"
    timing.main([str(FIXTURE / "result_1.txt"), "--plot", str(png)])
    assert capsys.readouterr().err == f"timing: wrote the plot to {png}\n" and png.stat().st_size > 20000


def test_plot_output_is_checked_before_the_logs_are_read_and_owned_while_written(tmp_path):
    """A --plot into a missing folder is one line before any work (the report is not printed); a second writer of
    the same picture meets the first's lock in one line; the picture is written under a temporary name."""
    missing = tmp_path / "no" / "runs.png"
    result = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(FIXTURE / "result_1.txt"), "--plot",
                             str(missing)], capture_output=True, text=True, env={**os.environ, **PYTHONPATH})
    assert_one_line_naming(result, f"{missing}: cannot write")
    assert result.stdout == ""
    png = tmp_path / "runs.png"
    held = files.lock_file(f"{png}.lock")
    try:
        result = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(FIXTURE / "result_1.txt"), "--plot",
                                 str(png)], capture_output=True, text=True, env={**os.environ, **PYTHONPATH})
        assert_one_line_naming(result, "another process is writing this output now")
        assert not png.exists() and result.stdout == ""
    finally:
        os.close(held)
    timing.main([str(FIXTURE / "result_1.txt"), "--plot", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and sorted(os.listdir(tmp_path)) == ["runs.png"]


def test_the_mlperf_facts_agree_with_mlperf_logging():
    """mlperf_rules states the runs a ResNet score takes without importing mlperf_logging; the package's own table
    must say the same."""
    from mlperf_logging.benchmark_meta import get_result_file_counts

    from rn50_mx import mlperf_rules
    assert get_result_file_counts(mlperf_rules.USAGE)[mlperf_rules.BENCHMARK] == mlperf_rules.RUNS_NEEDED


def test_a_folder_named_like_a_log_is_not_read(tmp_path):
    """A results folder holding a folder named x.log (a user's, or a checkpoint folder): timing scores the logs
    beside it instead of ending in IsADirectoryError."""
    shutil.copy(FIXTURE / "result_1.txt", tmp_path / "run1.log")
    (tmp_path / "x.log").mkdir()
    assert timing.find_logs([str(tmp_path)]) == [str(tmp_path / "run1.log")]
    result = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(tmp_path)], capture_output=True, text=True,
                            env={**os.environ, **PYTHONPATH}, timeout=300)
    assert result.returncode == 0 and "run1.log" in result.stdout and "Traceback" not in result.stderr


@pytest.mark.parametrize("key, ruleset, rule_file", [
    ("submission_division", "1.0.0", "evil_common.yaml"),  # common.yaml: '{}_common.yaml'
    ("submission_benchmark", "0.6.0", "evil.yaml"),  # training_0.6.0/common.yaml: '{}.yaml', its own log format
    ("opt_name", "1.0.0", "")])  # closed_resnet.yaml: 'closed_resnet_{}.yaml', no way out of the folder
def test_no_log_value_names_a_rule_file_the_checker_runs(tmp_path, key, ruleset, rule_file):
    """The compliance checker execs the `BEGIN: CODE` of each YAML file whose path it builds from the log's
    submission_division, submission_benchmark and opt_name (the POSTs of the rulesets' common.yaml, closed_common.yaml
    and closed_resnet.yaml; mlp_compliance.py:281 joins, :172 execs). A log naming `../../evil` beside a planted
    evil_common.yaml is one line naming the value, before any checker runs: in timing, and a FAILED verdict in
    check_compliance (the search's finals)."""
    from mlperf_logging.compliance_checker import mlp_compliance

    marker = tmp_path / "ran"
    if rule_file:
        (tmp_path / rule_file).write_text(f"- BEGIN:\n    CODE: \"open({str(marker)!r}, 'w').write('x')\"\n")
    rules = os.path.join(os.path.dirname(mlp_compliance.__file__), f"training_{ruleset}")
    value = json.dumps(os.path.relpath(tmp_path / "evil", rules))
    if ruleset == "0.6.0":
        folder = tmp_path / "logs"
        folder.mkdir()
        (folder / "result_1.txt").write_text(f':::MLL 1623782025.188 {key}: {{"value": {value}}}\n')
    else:
        planted = {"submission_division": '"closed"', "opt_name": '"lars"'}[key]
        folder = edited_fixture(tmp_path, {"result_1.txt": (f'"key": "{key}", "value": {planted}',
                                                            f'"key": "{key}", "value": {value}')})
    log = folder / "result_1.txt"
    verdict, why = timing.check_compliance(str(log), ruleset)
    assert not marker.exists() and verdict == "FAILED" and why.startswith(f"{log}: {key} "), why
    result = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(folder), "--ruleset", ruleset],
                            capture_output=True, text=True, env={**os.environ, **PYTHONPATH})
    assert_one_line_naming(result, f"{log}: {key} ")
    assert not marker.exists()


def test_five_copies_of_one_run_get_no_score(tmp_path):
    """Five copies of one run (one seed) scored valid; the package checker refuses two runs logging one seed."""
    for k in range(1, 6):
        shutil.copy(FIXTURE / "result_1.txt", tmp_path / f"result_{k}.txt")
    report = report_of([tmp_path])
    seed = report["runs"][0]["seed"]
    assert report["score"]["minutes"] is None
    assert report["score"]["verdict"] == (f"no score: each run needs a seed of its own (seed {seed}: result_1.txt, "
                                          "result_2.txt, result_3.txt, result_4.txt, result_5.txt)")


def test_an_error_naming_a_path_with_a_newline_stays_on_one_line(tmp_path):
    """A newline in a path was printed raw, the one-line error spread over two."""
    missing = tmp_path / "a\nb.log"
    result = subprocess.run([sys.executable, "-m", "rn50_mx.timing", str(missing)], capture_output=True, text=True,
                            env={**os.environ, **PYTHONPATH})
    assert_one_line_naming(result, f"{tmp_path}/a\\nb.log: no such file or directory")


def test_a_log_without_a_division_line_is_called_so(tmp_path):
    """A log with no submission_division line was reported as an open run beside closed ones."""
    folder = edited_fixture(tmp_path, {"result_1.txt": ('"key": "submission_division"', '"key": "no_division"')})
    verdict = report_of([folder])["score"]["verdict"]
    assert verdict.startswith("no score: the runs are not of one division (no division line: result_1.txt; closed: ")



RUN_STOP_1 = ':::MLLOG {"namespace": "", "time_ms": 1623783706683, "event_type": "INTERVAL_END", "key": "run_stop"'


def planted(key, value, metadata):
    """The fixture logs, result_1.txt with an MLLOG line planted just before its run_stop (success)."""
    line = (':::MLLOG {"namespace": "", "time_ms": 1623783706683, "event_type": "POINT_IN_TIME", '
            f'"key": "{key}", "value": {value}, "metadata": {metadata}}}')
    return {"result_1.txt": (RUN_STOP_1, line + "\n" + RUN_STOP_1)}


def test_a_planted_diverged_line_before_run_stop_success_is_not_the_verdict(tmp_path):
    """Training writes `diverged` then run_stop aborted: run_stop is the verdict. A `diverged` line someone else put
    before a run_stop success (its step not a number) leaves the run a success, scored. The old code showed it as
    diverged, and the search (trials.verdict) pruned it as diverged."""
    folder = edited_fixture(tmp_path, planted("diverged", '"planted"', '{"epoch_num": 3, "step": "abc", "steps": -1}'))
    run = timing.read_run(str(folder / "result_1.txt"), "1.0.0")
    assert run.status == "success" and run.diverged is None, run
    report = report_of([folder])
    assert report["score"]["minutes"] is not None and "result_1" not in report["score"]["verdict"], report["score"]


@pytest.mark.parametrize("metadata", ['"notadict"', "[1]", "3"])
def test_mllog_metadata_that_is_not_an_object_is_one_line(tmp_path, metadata):
    """A `diverged` line (or any) whose metadata is not a JSON object: one line naming the file, not an
    AttributeError traceback from every command that reads the log (timing, the search reading its trials)."""
    folder = edited_fixture(tmp_path, planted("diverged", '"x"', metadata))
    with pytest.raises(InputError, match=r"result_1.txt: diverged's metadata .* is not a JSON object"):
        timing.read_run(str(folder / "result_1.txt"), "1.0.0")


def test_a_folder_with_glob_characters_in_its_name_is_read(tmp_path):
    """A folder of logs named with '[' and '*' (a user's run folder 'run[1]*'): its logs are found, not matched as a
    pattern. The old code said the folder had no *.log or result_*.txt files."""
    folder = tmp_path / "run[1]*"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("README.md"))
    assert len(timing.find_logs([str(folder)])) == 5
