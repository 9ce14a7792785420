"""Every published MLPerf ResNet-50 closed GPU result as one CSV row per run, for the recipe's time-to-train model.

    .venv/bin/python bench/mlperf_results.py RESULTS_DIR [--out bench/mlperf_resnet_results.csv]

RESULTS_DIR holds one folder per round, v0.6 ... v4.0, each laid out as its mlcommons/training_results_v* repository
(SUBMITTER/results/SYSTEM/resnet/result_*.txt and SUBMITTER/systems/SYSTEM.json); the logs stay outside this
repository. The MLLOG lines are read with mlperf_logging's own parser (compliance_checker.mlp_parser, the round's
ruleset), the olympic mean with the result summarizer's (_compute_olympic_average, one run dropped each side; a run
that did not end `success` counts as the slowest, as the summarizer drops it). The published results passed the
MLCommons review, so the compliance checker is not run again here (it would cost minutes of CPU per round). The
score is the raw olympic mean: from v2.1 the summarizer also scales runs that converged faster than the RCP mean,
which this column does not.

Rows: one per run. Results this script cannot use (not a GPU, not closed, no readable log) go to SKIPPED_CSV with the
reason. Both files are written under a temporary name and renamed.
"""
import argparse
import ast
import csv
import glob
import io
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mlperf_logging.compliance_checker.mlp_parser import parse_file  # noqa: E402
from mlperf_logging.result_summarizer import result_summarizer  # noqa: E402

from rn50_mx.errors import InputError, run_cli  # noqa: E402
from rn50_mx.files import write_atomically  # noqa: E402
from rn50_mx.mlperf_rules import MAX_DROPPED  # noqa: E402
from rn50_mx.recipe.predict import generation  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COLUMNS = ("round", "submitter", "system", "accelerator", "generation", "accelerators", "nodes", "interconnect",
           "framework", "global_batch", "batch_per_accelerator", "status", "epochs", "minutes", "scored_minutes",
           "init_minutes", "eval_minutes", "evals", "source")
NOT_GPU = re.compile(r"TPU|IPU|Gaudi|Ascend|Habana|Xeon|^N/A$", re.I)  # accelerator names of the non-GPU results


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("results", help="folder of v0.6 ... v4.0 folders laid out as training_results_v*")
    parser.add_argument("--out", default=os.path.join(HERE, "mlperf_resnet_results.csv"), help="the runs' CSV")
    parser.add_argument("--skipped", default=os.path.join(HERE, "mlperf_resnet_skipped.csv"),
                        help="the results not used, with the reason")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.results):
        raise InputError(f"{args.results}: no such folder")
    for path in (args.out, args.skipped):  # before minutes of parsing
        if not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
            raise InputError(f"{path}: cannot write (its folder is missing or not writable)")
    return args


def round_key(name):
    """v0.7 < v1.0 < v1.1 ... as numbers."""
    return [int(x) for x in name.lstrip("v").split(".")]


def ruleset(round_name):
    """v1.0 -> 1.0.0: the mlp_parser of the round."""
    return round_name.lstrip("v") + ".0"


def system_description(path):
    """The system JSON as a dict. v0.6's are MLL-style 'key: {"value": ...}' lines whose `entry` is a Python dict's
    repr with `nodes` a repr inside it; they are flattened to the later rounds' names."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        try:
            fields[key.strip()] = json.loads(value)["value"]
        except (ValueError, KeyError, TypeError):
            continue
    entry = ast.literal_eval(fields.get("entry", "{}"))
    nodes = ast.literal_eval(entry.get("nodes", "{}"))
    return {"submitter": fields.get("org"), "division": fields.get("division"),
            "number_of_nodes": nodes.get("num_nodes"), "accelerators_per_node": nodes.get("num_accelerators"),
            "accelerator_model_name": nodes.get("accelerator"), "host_networking": entry.get("interconnect"),
            "framework": entry.get("framework")}


def read_log(path, rules):
    """One run's figures from its MLLOG lines (mlperf_logging's parser; v0.6 logs repeat lines once per process:
    the first run_start, run_stop and init_start count)."""
    lines, _ = parse_file(path, ruleset=rules)
    first, evals, eval_ms, open_eval, status = {}, [], 0.0, None, None
    scale = 1000.0 if rules == "0.6.0" else 1.0  # v0.6 timestamps are seconds, later ones milliseconds
    for line in lines:
        value = line.value.get("value") if isinstance(line.value, dict) else None
        meta = (line.value.get("metadata") if isinstance(line.value, dict) else None) or {}
        first.setdefault(line.key, (line.timestamp * scale, value))
        if line.key == "eval_start":
            open_eval = line.timestamp * scale
        elif line.key == "eval_stop" and open_eval is not None:
            eval_ms, open_eval = eval_ms + line.timestamp * scale - open_eval, None
        elif line.key == "eval_accuracy" and meta.get("epoch_num") is not None:
            if not evals or evals[-1][0] != meta["epoch_num"]:  # v0.6 repeats each eval per process
                evals.append((meta["epoch_num"], value))
        elif line.key == "run_stop":
            status = meta.get("status", "no status")
            break
    if "run_start" not in first or status is None:
        raise ValueError("no run_start" if "run_start" not in first else "no run_stop")
    start, stop = first["run_start"][0], first["run_stop"][0] if "run_stop" in first else None
    init = first.get("init_start", (None,))[0]
    return {"status": status, "minutes": (stop - start) / 60000,
            "init_minutes": "" if init is None else round((start - init) / 60000, 3),
            "eval_minutes": round(eval_ms / 60000, 3), "evals": len(evals),
            "epochs": evals[-1][0] if status == "success" and evals else "",
            "global_batch": (first.get("global_batch_size") or first.get("input_batch_size") or (0, None))[1],
            "division": (first.get("submission_division") or (0, None))[1]}


def result_rows(round_name, folder, root):
    """The rows of one result (SUBMITTER/results/SYSTEM/resnet), or raise ValueError saying why it is not used."""
    submitter, system = folder.split(os.sep)[-4], folder.split(os.sep)[-2]
    described = os.path.join(root, round_name, submitter, "systems", system + ".json")
    if not os.path.isfile(described):
        raise ValueError("no systems/SYSTEM.json")
    desc = system_description(described)
    accelerator = str(desc.get("accelerator_model_name") or "")
    if NOT_GPU.search(accelerator) or not accelerator:
        raise ValueError(f"not a GPU: {accelerator or 'no accelerator named'}")
    if str(desc.get("division", "closed")).lower() != "closed":
        raise ValueError(f"division {desc.get('division')}")
    nodes = int(desc.get("number_of_nodes") or desc["number of nodes"])  # v0.7 DellEMC spells it with spaces
    per_node = int(desc.get("accelerators_per_node") or 0)
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "result_*.txt"))):
        try:
            runs.append((path, read_log(path, ruleset(round_name))))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{os.path.basename(path)}: {err}") from None
    if not runs:
        raise ValueError("no result_*.txt")
    if any(run["division"] not in (None, "closed") for _, run in runs):
        raise ValueError("open-division logs")
    counted = [run["minutes"] for _, run in runs if run["status"] == "success"]
    dropped = len(runs) - len(counted)
    if dropped > MAX_DROPPED:
        raise ValueError(f"{dropped} of {len(runs)} runs did not succeed")
    scored = result_summarizer._compute_olympic_average(counted, dropped, MAX_DROPPED)
    if scored is None:  # the summarizer's None: nothing left after the drops
        raise ValueError(f"{len(runs)} run(s): no olympic mean")
    rows, here = [], os.path.join(root, round_name)
    for path, run in runs:
        batch = int(run["global_batch"] or 0)
        rows.append({"round": round_name, "submitter": submitter, "system": system, "accelerator": accelerator,
                     "generation": generation(accelerator, system), "accelerators": nodes * per_node, "nodes": nodes,
                     "interconnect": " ".join(str(desc.get("host_networking") or "").split()),
                     "framework": desc.get("framework", ""), "global_batch": batch,
                     "batch_per_accelerator": round(batch / (nodes * per_node), 2) if batch and per_node else "",
                     "status": run["status"], "epochs": run["epochs"], "minutes": round(run["minutes"], 3),
                     "scored_minutes": round(scored, 3), "init_minutes": run["init_minutes"],
                     "eval_minutes": run["eval_minutes"], "evals": run["evals"],
                     "source": f"training_results_{round_name}/{os.path.relpath(path, here)}"})
    return rows


def collect(root):
    """(rows, skipped): every ResNet result folder under the rounds in `root`."""
    rows, skipped = [], []
    for round_name in sorted((r for r in os.listdir(root) if re.fullmatch(r"v\d+\.\d+", r)), key=round_key):
        for folder in sorted(glob.glob(os.path.join(root, round_name, "*", "results", "*", "resnet"))):
            try:
                rows += result_rows(round_name, folder, root)
            except (ValueError, KeyError, TypeError, SyntaxError) as err:
                skipped.append({"round": round_name, "result": os.path.relpath(folder, os.path.join(root, round_name)),
                                "reason": str(err).splitlines()[0] if str(err) else type(err).__name__})
    return rows, skipped


def csv_text(rows, columns):
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main(argv=None):
    args = parse_args(argv)
    rows, skipped = collect(args.results)
    if not rows:
        raise InputError(f"{args.results}: no ResNet-50 result_*.txt under v*/SUBMITTER/results/SYSTEM/resnet")
    write_atomically(args.out, csv_text(rows, COLUMNS), "CSV", force=True)
    write_atomically(args.skipped, csv_text(skipped, ("round", "result", "reason")), "CSV", force=True)
    results = {(r["round"], r["submitter"], r["system"]) for r in rows}
    rounds = sorted({r["round"] for r in rows}, key=round_key)
    print(f"{len(rows)} runs of {len(results)} results from {len(rounds)} rounds ({', '.join(rounds)}) -> {args.out}")
    print(f"{len(skipped)} results skipped -> {args.skipped}")


if __name__ == "__main__":
    run_cli(main, "bench/mlperf_results.py")
