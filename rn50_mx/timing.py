"""Time to train and MLPerf score of a set of ResNet-50 training logs, with the official checkers' verdicts.

    python -m rn50_mx.timing results/                  # table of the runs + score verdict
    python -m rn50_mx.timing results/ --rcp            # also the RCP check of the convergence epochs
    python -m rn50_mx.timing a.log b.log --json        # JSON instead of the table
    python -m rn50_mx.timing results/ --plot runs.png  # top-1 and images/s per epoch of each run

A directory stands for its `*.log` and `result_*.txt` files. Only the `:::MLLOG` lines count, read with
mlperf_logging's own parser; MLLOG lines it cannot parse are skipped and counted, and the compliance
checker fails such a run. Time to train, the olympic mean and the drop rule are the result summarizer's:
a run that did not end `success` or fails the compliance check is dropped as the slowest; one such run
is tolerated, two make the result invalid. The score needs exactly 5 runs, as the package checker does.
A run logged `submission_division: open` (one with an open-division lever, docs/open-division.md) is shown as open and
scored only with open runs, never in a closed score; the compliance checker takes the open rules from that line of
the log itself (common.yaml enqueues open_common.yaml), and the RCPs, which judge closed runs, are not applied.
"""
import contextlib
import glob
import json
import logging
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Optional

from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.compliance_checker.mlp_parser import parse_file

from . import files
from .config import Parser
from .mlperf_rules import (BENCHMARK, DEFAULT_RULESET, MAX_DROPPED, PRUNED, RUNS_NEEDED, TARGET_TOP1, USAGE,
                           checker_module, load_checker, rcp_file, summarizer_module)
from .errors import InputError, printable, run_cli

# training_policies PR #503: runs faster than the RCP mean are scaled to it from the v2.1 round on; the
# installed RCP checker computes the factor for every ruleset, so older rulesets must not apply it.
NORMALIZED_FROM = "2.1.0"
RESUMED = "resumed from a checkpoint"  # a Run's status when its log holds resumed_from
# The log values the compliance checker builds a rule file's path from before it execs the file's BEGIN CODE
# (mlp_compliance.py:281 joins, :172 execs; every line of the key, as opt_name's POST runs on each): common.yaml:44
# enqueues '{submission_division}_common.yaml', training_0.6.0/common.yaml:44 '{submission_benchmark}.yaml',
# closed_common.yaml:6 and open_common.yaml:6 'closed_{submission_benchmark}.yaml', closed_resnet.yaml:11
# 'closed_resnet_{opt_name}.yaml' (training_1.0.0; the other rulesets' files alike). A log is read by no checker
# unless each of these is one of the values below: the checker's own files, never one a log names.
RULE_FILE_VALUES = {"submission_division": ("closed", "open"), "submission_benchmark": (BENCHMARK,),
                    "opt_name": ("lars", "sgd")}


@dataclass
class Run:
    """What one log says about its run, and the compliance checker's verdict on it."""
    path: str
    minutes: Optional[float]  # run_stop - run_start as the result summarizer computes it; None without run_stop
    status: str  # run_stop's status (success / aborted), "missing", or RESUMED
    converged_epoch: Optional[int]  # epoch_num of the last eval before run_stop success
    top1: Optional[float]  # the last eval_accuracy
    seed: Optional[int]
    batch_size: Optional[int]  # global_batch_size
    benchmark: Optional[str]  # submission_benchmark
    platform: Optional[str]  # submission_platform: the system the run ran on
    unparsed_lines: int
    evals: list  # [epoch, top-1] per eval
    throughput: list  # [epoch, images/s] per epoch
    compliance: str = ""  # SUCCESS / FAILED
    compliance_reason: str = ""  # the checker's first complaint, on one line
    division: Optional[str] = None  # submission_division: closed, or open for a run with open-division levers
    diverged: Optional[str] = None  # training's verdict that the loss diverged (its `diverged` line; run_stop aborted)
    stalled: Optional[str] = None  # the progress watchdog's verdict (its `stalled` line; run_stop aborted, exit 79)

    @property
    def resumed(self):
        """The log holds resumed_from: the rules time one uninterrupted run."""
        return self.status == RESUMED

    @property
    def counted(self):
        """Whether the score counts this run; otherwise it is dropped as the slowest."""
        return self.status == "success" and self.compliance == "SUCCESS" and not self.resumed


@dataclass
class RcpVerdict:
    """The RCP checker's verdict on the runs' convergence epochs."""
    passed: Optional[bool]  # None: the checker was not run (message says why)
    message: str  # the checker's own words: RCP found / RCP Interpolation / Insufficient convergence / ...
    rcp_mean: Optional[float] = None  # reference runs' olympic mean epochs at this batch size (None: interpolated)
    min_epochs: Optional[float] = None  # the lowest runs' mean the checker's t-test accepts
    runs_mean: Optional[float] = None  # olympic mean epochs of these runs
    norm_factor: float = 1.0  # the score is multiplied by it when the runs converge faster than the RCP mean


def find_logs(paths):
    """The log files named in `paths`, a directory standing for its *.log and result_*.txt files."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            named = glob.glob(os.path.join(glob.escape(path), "*.log")) + \
                glob.glob(os.path.join(glob.escape(path), "result_*.txt"))  # a '[' or '*' in its name is its own
            inside = sorted(p for p in named if os.path.isfile(p))  # a folder named x.log is not a log
            if not inside:
                raise InputError(f"{path}: directory has no *.log or result_*.txt files")
            found += inside
        elif os.path.isfile(files.regular_input(path)):
            found.append(path)
        else:
            raise InputError(f"{path}: no such file or directory")
    return list(dict.fromkeys(found))


def images_per_second(key, value, meta, epoch):
    """(epoch, images/s) of a `throughput` line (value images/s; epoch from metadata epoch_num, else the
    current one, as in the v1.0 logs) or a `tracked_stats` line (value {"imgs_sec": x}, metadata step)."""
    if key == "throughput" and isinstance(value, (int, float)):
        return meta.get("epoch_num", epoch), float(value)
    if key == "tracked_stats" and isinstance(value, dict) and "imgs_sec" in value:
        return meta.get("step", epoch), float(value["imgs_sec"])
    return None, None


def parse_log(path, ruleset):
    """(MLLOG lines, unparsed lines) of the log, each value the checker names a rule file by checked."""
    try:
        lines, unparsed = parse_file(path, ruleset=ruleset)
    except (KeyError, TypeError) as err:  # the parser gives up on JSON without key or time_ms
        raise InputError(f"{path}: malformed MLLOG line ({type(err).__name__}: {err})") from None
    except OSError as err:  # the parser opens the file itself
        raise files.os_error(path, err, "read") from None
    for line in lines:
        if not isinstance(line.value.get("metadata"), (dict, type(None))):
            raise InputError(f"{path}: {line.key}'s metadata {line.value['metadata']!r:.60} is not a JSON object")
        allowed = RULE_FILE_VALUES.get(line.key)
        value = line.value.get("value") if isinstance(line.value, dict) else None  # v['value'] in the rules' POSTs
        if allowed and value not in allowed:
            raise InputError(f"{path}: {line.key} {value!r} is not {' or '.join(allowed)} (the compliance checker "
                             "would run the rule file it names)")
    return lines, unparsed


def read_run(path, ruleset):
    """One run's figures from its MLLOG lines, up to the first run_stop."""
    lines, unparsed = parse_log(path, ruleset)
    if not lines:
        raise InputError(f"{path}: no :::MLLOG lines")
    starts = sum(line.key == "run_start" for line in lines)
    resumes = sum(line.key == "resumed_from" for line in lines)
    if not starts and not any(line.key == "stalled" for line in lines):  # a run may stall before run_start
        raise InputError(f"{path}: no run_start in its MLLOG lines")
    if starts > 1 + resumes:  # a resumed run continues its run's log: one run_start per part
        raise InputError(f"{path}: holds {starts} runs (run_start {starts} times); a log scores one run: give "
                         "each run its own file")
    first, evals, speed, epoch, status, diverged, stalled = {}, [], {}, None, "missing", None, None
    for line in lines:
        value, meta = line.value["value"], line.value["metadata"] or {}
        first.setdefault(line.key, value)
        if line.key in ("epoch_start", "epoch_stop"):
            epoch = meta.get("epoch_num", epoch)
        if line.key == "eval_accuracy":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f"{path}: eval_accuracy {value!r} is not a number")
            evals.append([meta.get("epoch_num"), value])
        point_epoch, rate = images_per_second(line.key, value, meta, epoch)
        if point_epoch is not None:
            speed[point_epoch] = rate  # throughput and tracked_stats repeat each other in the v1.0 logs
        if line.key == "diverged":
            diverged = f"diverged at epoch {meta.get('epoch_num')} step {meta.get('step')}: {value}"
        if line.key == "stalled":
            stalled = f"stalled: {printable(str(value))[:300]}"  # one line, whoever wrote the log
        if line.key == "run_stop":
            status = meta.get("status", "no status")
            break
    if status == "success":  # run_stop is the verdict: a `diverged` or `stalled` line before it was not training's
        diverged = stalled = None
    if resumes:  # the rules time one uninterrupted run; the parts' run_start..run_stop is no such time
        status = RESUMED
    return Run(
        path=path,
        minutes=None if status in ("missing", RESUMED) or not starts else
        summarizer_module()._query_mlperf_strong_scaling_score(lines),
        status=status,
        converged_epoch=evals[-1][0] if status == "success" and evals else None,
        top1=evals[-1][1] if evals else None,
        seed=first.get("seed"),
        batch_size=first.get("global_batch_size"),
        benchmark=first.get("submission_benchmark"),
        platform=first.get("submission_platform"),
        division=first.get("submission_division"),
        diverged=diverged,
        stalled=stalled,
        unparsed_lines=len(unparsed),
        evals=evals,
        throughput=[[e, speed[e]] for e in sorted(speed)],
    )


@contextlib.contextmanager
def checkers_muted():
    """The checkers log every complaint to the root logger; we print a one-line summary instead."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def summarize_complaints(complaints):
    """The first complaint on one line (its headline and failed test), and how many more there are."""
    lines = complaints[0].splitlines()
    text = " ".join([lines[0]] + [line for line in lines if line.startswith("failed test:")])
    return text + (f" (+{len(complaints) - 1} more)" if len(complaints) > 1 else "")


def check_compliance(path, ruleset):
    """The official compliance checker, in-process: ("SUCCESS", "") or ("FAILED", the reason on one line). It checks
    the lines read and checked here (its check_file, mlp_compliance.py:291-307, parses the file again: a log rewritten
    in between would escape the check of RULE_FILE_VALUES)."""
    try:
        lines, unparsed = parse_log(path, ruleset)
    except InputError as err:
        return "FAILED", str(err)
    checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=True, werror=False)
    try:
        with checkers_muted():
            if unparsed:
                checker.put_message("Log lines had parsing errors.")
            checker.check_loglines(lines, f"{USAGE}_{ruleset}/common.yaml")
            valid = not checker.has_messages()
    except Exception as err:  # some malformed values crash its rules, e.g. an eval_accuracy of null
        mlp_compliance.enqueued_configs.clear()  # its module-level queue of rule files, left half-consumed
        return "FAILED", f"the checker crashed: {type(err).__name__}: {err}"
    if valid:
        return "SUCCESS", ""
    return "FAILED", summarize_complaints(list(checker.overwritable.values()) + checker.not_overwritable)


def drop_reason(run):
    """Why the score drops this run."""
    if run.resumed:
        return f"{RESUMED} (not one uninterrupted run)"
    if run.diverged or run.stalled:
        return run.diverged or run.stalled
    return f"run_stop {run.status}" if run.status != "success" else "failed the compliance check"


def score(runs):
    """The MLPerf score in minutes (None when there is none) and a one-line verdict saying why."""
    if len(runs) != RUNS_NEEDED:
        return None, f"no score: ResNet-50 is scored on exactly {RUNS_NEEDED} runs, got {len(runs)}"
    if len({run.division for run in runs}) > 1:
        return None, f"no score: the runs are not of one division ({divisions(runs)})"
    mixed = mixed_runs(runs)
    if mixed:
        return None, f"no score: the runs are not of one system and batch size ({mixed})"
    repeated = repeated_seeds(runs)
    if repeated:
        return None, f"no score: each run needs a seed of its own ({repeated})"
    dropped = [run for run in runs if not run.counted]
    why = "; ".join(f"{os.path.basename(run.path)}: {drop_reason(run)}" for run in dropped)
    if len(dropped) > MAX_DROPPED:
        return None, f"invalid: {len(dropped)} runs dropped, at most {MAX_DROPPED} allowed ({why})"
    minutes = summarizer_module()._compute_olympic_average(
        [run.minutes for run in runs if run.counted], len(dropped), MAX_DROPPED)
    if dropped:
        return minutes, f"valid: olympic mean, one run dropped as the slowest ({why}) and the fastest dropped"
    return minutes, "valid: olympic mean (fastest and slowest dropped)"


def grouped(runs, key):
    """{key(run): [file names]} of the runs."""
    groups = {}
    for run in runs:
        groups.setdefault(key(run), []).append(os.path.basename(run.path))
    return groups


def listed(groups):
    """Groups of runs as 'key: a, b; key: c'."""
    return "; ".join(f"{key}: {', '.join(names)}" for key, names in groups.items())


def divisions(runs):
    """The runs by submission_division, as 'open: a, b; closed: c' (a log without the line: 'no division line')."""
    return listed(grouped(runs, lambda run: run.division or "no division line"))


def repeated_seeds(runs):
    """'' when no two runs logged one seed; else those runs by seed, as 'seed 7: a, b'. The package checker refuses
    two runs logging one seed from one source line (seed_checker.py:102-115), as every rn50_mx run does."""
    groups = grouped(runs, lambda run: f"seed {run.seed}")
    return listed({key: names for key, names in groups.items() if len(names) > 1})


def division_of(runs):
    """The one division of the runs, or None when there are none or they mix."""
    found = {run.division for run in runs}
    return found.pop() if len(found) == 1 else None


def mixed_runs(runs):
    """'' when every run has the same platform and global batch size; else the groups, as 'platform batch N: a, b'."""
    groups = grouped(runs, lambda run: f"{run.platform} batch {run.batch_size}")
    return "" if len(groups) == 1 else listed(groups)


def check_rcp(runs, ruleset):
    """The official RCP checker on the runs, laid out as the result_*.txt folder it expects."""
    if not os.path.isfile(rcp_file(ruleset)):
        return RcpVerdict(None, f"mlperf_logging has no ResNet RCPs for ruleset {ruleset}")
    if len(runs) != RUNS_NEEDED:
        return RcpVerdict(None, f"needs exactly {RUNS_NEEDED} runs, got {len(runs)}")
    if any(run.division != "closed" for run in runs):
        return RcpVerdict(None, f"RCPs judge closed-division runs only ({divisions(runs)})")
    if any(run.benchmark != BENCHMARK for run in runs):
        return RcpVerdict(None, f"every log must say submission_benchmark {BENCHMARK}")
    if mixed_runs(runs):
        return RcpVerdict(None, f"the runs are not of one system and batch size ({mixed_runs(runs)})")
    with tempfile.TemporaryDirectory() as folder, checkers_muted():
        for i, run in enumerate(runs, 1):
            os.symlink(os.path.abspath(run.path), os.path.join(folder, f"result_{i}.txt"))
        passed, message, norm = checker_module().check_directory(
            folder, USAGE, ruleset, verbose=False, bert_train_samples=False, rcp_pass=PRUNED)
    verdict = RcpVerdict(passed, message, norm_factor=norm)
    # check_directory returns the verdict only; the RCP mean and lowest accepted epochs shown beside it are the
    # record its own checker used, which only the (private) lookup gives: mlperf-logging is pinned for it.
    record = load_checker(ruleset)._find_rcp(runs[0].batch_size, PRUNED)
    if record:
        verdict.rcp_mean, verdict.min_epochs = record["RCP Mean"], record["Min Epochs"]
    epochs = [run.converged_epoch for run in runs if run.converged_epoch is not None]
    if len(runs) - len(epochs) <= MAX_DROPPED:
        verdict.runs_mean = summarizer_module()._compute_olympic_average(epochs, len(runs) - len(epochs), MAX_DROPPED)
    return verdict


def display_names(paths):
    """Paths relative to their common folder, so the runs of one directory show as bare file names."""
    base = os.path.commonpath([os.path.dirname(os.path.abspath(path)) for path in paths])
    return [os.path.relpath(os.path.abspath(path), base) for path in paths]


def build_report(runs, ruleset, with_rcp):
    """Everything the table, the JSON and the plot show."""
    minutes, verdict = score(runs)
    report = {
        "ruleset": ruleset,
        "runs": [dict(name=name, **asdict(run), counted=run.counted)
                 for name, run in zip(display_names([run.path for run in runs]), runs)],
        "score": {"minutes": minutes, "verdict": verdict, "division": division_of(runs)},
        "rcp": None,
    }
    if with_rcp:
        rcp = check_rcp(runs, ruleset)
        faster = rcp.passed and rcp.norm_factor > 1
        applies = bool(faster and checker_module().is_version_at_least(ruleset, NORMALIZED_FROM))
        report["rcp"] = dict(asdict(rcp), normalization_applies=applies,
                             normalized_minutes=minutes * rcp.norm_factor if applies and minutes else None)
    return report


def number(value, fmt):
    """`value` formatted, or "-" when it is missing."""
    return "-" if value is None else format(value, fmt)


def columns(rows):
    """Rows of cells as aligned text: the first column (names) to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join([row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])])
            for row in rows]


def format_rcp(rcp, ruleset):
    """The RCP verdict on one line."""
    verdict = {True: "PASS", False: "FAIL", None: "NOT RUN"}[rcp["passed"]]
    text = f"RCP check: {verdict} ({rcp['message']})"
    if rcp["rcp_mean"] is not None:
        text += f"; RCP mean {rcp['rcp_mean']:.3f} epochs, lowest accepted {rcp['min_epochs']:.3f}"
    if rcp["runs_mean"] is not None:
        text += f"; runs' mean {rcp['runs_mean']:.3f}"
    if rcp["normalization_applies"]:
        minutes = number(rcp["normalized_minutes"], ".3f")
        return text + f"; normalization applies: x{rcp['norm_factor']:.4f} -> {minutes} min"
    if rcp["passed"] and rcp["norm_factor"] > 1:
        return text + (f"; no normalization in ruleset {ruleset} (the checker's x{rcp['norm_factor']:.4f} "
                       f"applies from {NORMALIZED_FROM})")
    return text + "; no normalization" if rcp["passed"] is not None else text


def verdict_of(run):
    """The status column: training's own verdict (diverged, stalled) where it gave one, else run_stop's status."""
    return "diverged" if run["diverged"] else "stalled" if run["stalled"] else run["status"]


def format_report(report):
    """The runs as a table, then the checker's reasons for failed runs, the score and the RCP verdict."""
    table = [["run", "division", "minutes", "status", "conv.epoch", "top-1", "seed", f"checker {report['ruleset']}"]]
    table += [[run["name"], str(run["division"]), number(run["minutes"], ".3f"),
               verdict_of(run), number(run["converged_epoch"], ""),
               number(run["top1"], ".4f"), number(run["seed"], ""), run["compliance"]] for run in report["runs"]]
    rows = columns(table)
    for run in report["runs"]:
        if run["diverged"] or run["stalled"]:
            rows.append(f"{run['name']}: {run['diverged'] or run['stalled']}")
        if run["compliance_reason"]:
            rows.append(f"{run['name']}: {run['compliance_reason']}")
        if run["unparsed_lines"]:
            rows.append(f"{run['name']}: {run['unparsed_lines']} MLLOG lines did not parse and were skipped")
    minutes, verdict = report["score"]["minutes"], report["score"]["verdict"]
    label = "open-division score" if report["score"]["division"] == "open" else "score"
    rows.append(f"verdict: {verdict}" if minutes is None else f"{label}: {minutes:.3f} min ({verdict})")
    if report["rcp"]:
        rows.append(format_rcp(report["rcp"], report["ruleset"]))
    return "\n".join(rows)


def plot(report, png):
    """Top-1 against epoch and images/s per epoch, one line per run, saved as a PNG."""
    try:
        import matplotlib  # optional (the test extra): only --plot needs it
    except ImportError:
        raise InputError(f"{png}: --plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (accuracy, speed) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run in report["runs"]:
        if run["evals"]:
            accuracy.plot(*zip(*run["evals"]), marker="o", label=run["name"])
        if run["throughput"]:
            speed.plot(*zip(*run["throughput"]), marker=".", label=run["name"])
    accuracy.axhline(TARGET_TOP1, color="grey", linestyle="--", label=f"target {TARGET_TOP1}")
    accuracy.set(xlabel="epoch", ylabel="eval top-1", title="top-1 at each eval")
    speed.set(xlabel="epoch", ylabel="images/s", title="training throughput per epoch")
    for axes in (accuracy, speed):
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    fig.tight_layout()
    tmp = files.temp_name(png)  # a reader sees the old picture or the whole new one
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, png)
    except OSError as err:
        raise InputError(f"{png}: cannot write the plot ({err.strerror})") from None
    finally:
        plt.close(fig)
        files.remove_quietly(tmp)


def parser():
    """The command line: logs or folders, the ruleset and what to print; an error is one line (config.Parser)."""
    parser = Parser(prog="python -m rn50_mx.timing", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="LOGS_OR_DIR",
                        help="training logs, or folders of *.log / result_*.txt files")
    parser.add_argument("--ruleset", default=DEFAULT_RULESET, choices=sorted(mlp_compliance.rule_choices()),
                        help=f"MLPerf training rules to check against (default {DEFAULT_RULESET})")
    parser.add_argument("--rcp", action="store_true", help="also run the RCP checker on the convergence epochs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--plot", metavar="FILE.png", help="draw top-1 and images/s per epoch of each run")
    return parser


def parse_args(argv=None):
    return parser().parse_args(argv)


def main(argv=None):
    """Read the logs, check each one, and print the report (and draw the plot)."""
    args = parse_args(argv)
    with files.owned(args.plot) if args.plot else contextlib.nullcontext():  # the plot's folder, checked first
        if args.plot:
            files.refuse_special(args.plot, "plot")
        runs = [read_run(path, args.ruleset) for path in find_logs(args.paths)]
        for run in runs:
            run.compliance, run.compliance_reason = check_compliance(run.path, args.ruleset)
        report = build_report(runs, args.ruleset, args.rcp)
        print(json.dumps(report, indent=2) if args.json else format_report(report))
        if args.plot:
            plot(report, args.plot)
            print(f"timing: wrote the plot to {os.path.abspath(args.plot)}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main, "python -m rn50_mx.timing")
