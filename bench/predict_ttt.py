"""The recipe's time-to-train model (rn50_mx.recipe.predict) fitted to the published results, and judged on rounds it
was not fitted on.

    .venv/bin/python bench/predict_ttt.py [--csv bench/mlperf_resnet_results.csv] [--plot docs/predict_ttt.png]
                                          [--write-fit]

Results are the CSV's runs grouped by round, submitter and system; a result republished unchanged in a later round
(the same system and the same scored minutes) counts once, in its first round, so no round is judged on its own
copy. Leave-one-round-out: for each round, the model is fitted on the other rounds and predicts the scored minutes
of every result of that round with the RCP checker's epochs, as the recipe would. Printed: the median and the 90th
percentile of |predicted - published| / published, overall, per system size and for 8 to 512 GPUs; the worst ten
with why (epochs: the RCP's against the logs'; step: the model's against the logs'). --write-fit fits on every round
and writes rn50_mx/recipe/predict_fit.py, with the leave-one-round-out interval per system size.
"""
import argparse
import csv
import math
import os
import pprint
import statistics
import sys
from collections import defaultdict
from types import SimpleNamespace

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rn50_mx.errors import InputError, run_cli  # noqa: E402
from rn50_mx.files import write_atomically  # noqa: E402
from rn50_mx.mlperf_rules import IMAGENET_TRAIN  # noqa: E402
from rn50_mx.recipe import predict  # noqa: E402
from mlperf_results import round_key  # noqa: E402 (bench/, beside this script)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIT_MODULE = os.path.join(ROOT, "rn50_mx", "recipe", "predict_fit.py")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--csv", default=os.path.join(HERE, "mlperf_resnet_results.csv"),
                        help="bench/mlperf_results.py's CSV")
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "predict_ttt.png"), help="PNG of predicted "
                        "against published minutes ('' for none)")
    parser.add_argument("--write-fit", action="store_true", help=f"write {os.path.relpath(FIT_MODULE, ROOT)}")
    args = parser.parse_args(argv)
    folder = os.path.dirname(os.path.abspath(args.plot))
    if args.plot and not os.access(folder, os.W_OK):
        raise InputError(f"{args.plot}: cannot write the plot ({folder} is not a writable folder)")
    return args


def results(path):
    """One record per result (its runs' medians), republished copies dropped."""
    try:
        with open(path, newline="") as f:
            runs = list(csv.DictReader(f))
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    try:
        return records_of(runs)
    except (KeyError, ValueError, ZeroDivisionError) as err:
        raise InputError(f"{path}: not the CSV bench/mlperf_results.py writes ({type(err).__name__}: {err})") from None


def records_of(runs):
    """The records of the CSV's rows (see results)."""
    groups = defaultdict(list)
    for run in runs:
        groups[(run["round"], run["submitter"], run["system"])].append(run)
    seen, found = set(), []
    for (round_name, submitter, system), group in sorted(groups.items(), key=lambda kv: round_key(kv[0][0])):
        first = group[0]
        copy = (system, first["scored_minutes"])
        ok = [r for r in group if r["status"] == "success"]
        if copy in seen or not ok:
            continue
        seen.add(copy)
        nodes, gpus, batch = int(first["nodes"]), int(first["accelerators"]), int(first["global_batch"])
        steps = math.ceil(IMAGENET_TRAIN / batch)
        step = statistics.median((float(r["minutes"]) - float(r["eval_minutes"])) * 60 / (float(r["epochs"]) * steps)
                                 for r in ok)
        inits = [float(r["init_minutes"]) for r in group if r["init_minutes"]]
        found.append(SimpleNamespace(
            round=round_name, name=f"{round_name} {submitter}/{system}", gpu=first["generation"], nodes=nodes,
            gpus=gpus, gpus_per_node=gpus // nodes, batch=batch, per_gpu=batch / gpus, step=step,
            epochs=statistics.mean(float(r["epochs"]) for r in ok), scored=float(first["scored_minutes"]),
            init=statistics.median(inits) if inits else None,
            gbps=predict.node_gbps(first["interconnect"], first["generation"]), source=first["source"]))
    return found


def fit(records):
    """The model's constants from these results: images/s per GPU per generation (median of the single-node
    results), then latency and per_doubling by least squares, weighted to relative error, on what multi-node steps
    took beyond b / v and the unhidden ring."""
    single = defaultdict(list)
    for r in records:
        if r.nodes == 1:
            single[r.gpu].append(r.per_gpu / r.step)
    img = {gpu: round(statistics.median(v)) for gpu, v in single.items()}
    xs, ys, weights = [], [], []
    for r in records:
        if r.nodes > 1 and r.gpu in img:
            bare = SimpleNamespace(LATENCY=0.0, PER_DOUBLING=0.0)
            xs.append(math.log2(r.nodes))
            ys.append(r.step - predict.step_seconds(r.per_gpu, r.nodes, img[r.gpu], r.gbps, bare))
            weights.append(1 / r.step)  # relative error: a 6 ms step weighs as much as a 150 ms one
    per_doubling, latency = numpy.polyfit(xs, ys, 1, w=weights) if len(xs) > 1 else (0.0, 0.0)
    if per_doubling < 0:  # the data show no growth with the nodes: the constant alone (weighted mean)
        per_doubling, latency = 0.0, numpy.average(ys, weights=numpy.square(weights))
    inits = defaultdict(list)
    for r in records:
        if r.init is not None:
            inits[predict.size_class(r.nodes)].append(r.init)
    return SimpleNamespace(IMG_PER_S=img, LATENCY=max(0.0, float(latency)),
                           PER_DOUBLING=float(per_doubling),
                           INIT_MINUTES={k: round(statistics.median(v), 2) for k, v in inits.items()},
                           RULESET=predict.predict_fit.RULESET, RATIO_INTERVAL=predict.predict_fit.RATIO_INTERVAL)


def predicted(r, model):
    """(minutes, why) of a result under `model`, or (None, why not)."""
    img = predict.speed(r.gpu, model)
    if img is None:
        return None, f"no single-node {r.gpu} result in the fitted rounds"
    epochs = predict.rcp_epochs(r.batch)
    if epochs is None:
        return None, f"global batch {r.batch} is above every RCP"
    minutes, _ = predict.minutes(epochs, r.nodes, r.gpus_per_node, r.per_gpu, img, r.gbps, model)
    step = predict.step_seconds(r.per_gpu, r.nodes, img, r.gbps, model)
    cause = "epochs" if abs(math.log(r.epochs / epochs)) > abs(math.log(r.step / step)) else "step time"
    return minutes, (f"mostly the {cause}: epochs RCP {epochs:.1f} / logs {r.epochs:.1f}; step model {step * 1e3:.1f} "
                     f"ms / logs {r.step * 1e3:.1f} ms ({r.gpu}, {r.gpus} GPUs x {r.per_gpu:g})")


def leave_one_round_out(records):
    """[(record, predicted minutes or None, why)] with each round predicted by a fit on the others."""
    out = []
    for round_name in sorted({r.round for r in records}, key=round_key):
        model = fit([r for r in records if r.round != round_name])
        out += [(r, *predicted(r, model)) for r in records if r.round == round_name]
    return out


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def error_rows(judged):
    """The table: per group, results, median and 90th-percentile relative error of the scored minutes."""
    groups = defaultdict(list)
    for r, minutes, _ in judged:
        if minutes is None:
            continue
        error = abs(minutes - r.scored) / r.scored
        groups["all"].append(error)
        groups[predict.size_class(r.nodes)].append(error)
        if 8 <= r.gpus <= 512:
            groups["8-512 GPUs"].append(error)
    return [(name, len(v), statistics.median(v), quantile(v, 0.9)) for name, v in groups.items()]


def ratio_interval(judged):
    """Per system size, the 10th and 90th percentile of published / predicted."""
    ratios = defaultdict(list)
    for r, minutes, _ in judged:
        if minutes is not None:
            ratios[predict.size_class(r.nodes)].append(r.scored / minutes)
    return {size: (round(quantile(v, 0.1), 3), round(quantile(v, 0.9), 3)) for size, v in ratios.items()}


def fit_module(model, interval, records):
    """predict_fit.py's text."""
    rounds = sorted({r.round for r in records}, key=round_key)
    return f'''"""The time-to-train model's constants (rn50_mx.recipe.predict), written by
`bench/predict_ttt.py --write-fit` from bench/mlperf_resnet_results.csv: {len(records)} results of rounds
{rounds[0]}-{rounds[-1]}. Do not edit: rerun it."""
RULESET = {model.RULESET!r}  # the RCPs the epochs come from (the newest with ResNet)
# images/s per GPU on one node: the median of the single-node results
IMG_PER_S = {pprint.pformat(dict(sorted(model.IMG_PER_S.items())), width=116)}
LATENCY = {model.LATENCY:.6f}  # seconds a step across nodes loses beyond b / v and the unhidden ring
PER_DOUBLING = {model.PER_DOUBLING:.6f}  # and more per doubling of the nodes (0: the data show no growth)
INIT_MINUTES = {dict(sorted(model.INIT_MINUTES.items()))!r}  # init_start to run_start, median per system size
# published / predicted, 10th and 90th percentile, leave-one-round-out, per system size
RATIO_INTERVAL = {dict(sorted(interval.items()))!r}
'''


def plot(judged, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 6))
    rounds = sorted({r.round for r, m, _ in judged if m is not None}, key=round_key)
    colours = plt.get_cmap("tab10")
    for i, round_name in enumerate(rounds):
        points = [(r.scored, m) for r, m, _ in judged if m is not None and r.round == round_name]
        ax.scatter(*zip(*points), s=14, color=colours(i), label=round_name)
    ends = [0.1, 500]
    ax.plot(ends, ends, color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="published scored minutes", ylabel="predicted minutes (fitted on the "
           "other rounds)", title="ResNet-50 time to train, leave-one-round-out")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    os.replace(tmp, path)


def main(argv=None):
    args = parse_args(argv)
    records = results(args.csv)
    judged = leave_one_round_out(records)
    print(f"{len(records)} results (republished copies counted once) from {len({r.round for r in records})} rounds")
    print(f"{'systems':<12} {'results':>7} {'median':>7} {'p90':>7}   relative error of the scored minutes")
    for name, n, median, p90 in error_rows(judged):
        print(f"{name:<12} {n:>7} {median:>7.1%} {p90:>7.1%}")
    missed = [(r, why) for r, m, why in judged if m is None]
    for r, why in missed:
        print(f"not predicted: {r.name}: {why}")
    print("worst ten:")
    worst = sorted((x for x in judged if x[1] is not None), key=lambda x: -abs(x[1] - x[0].scored) / x[0].scored)
    for r, minutes, why in worst[:10]:
        error = (minutes - r.scored) / r.scored
        print(f"  {r.name}: predicted {minutes:.2f} against {r.scored:.2f} min ({error:+.0%}); {why}")
    if args.plot:
        plot(judged, args.plot)
        print(f"wrote {args.plot}")
    if args.write_fit:
        write_atomically(FIT_MODULE, fit_module(fit(records), ratio_interval(judged), records), "fit", force=True)
        print(f"wrote {FIT_MODULE}")


if __name__ == "__main__":
    run_cli(main, "bench/predict_ttt.py")
