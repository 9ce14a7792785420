"""The finalists: the best sets of the search, and the sourced config beside them, each run again on the same fresh
seeds (never a search seed), scored as MLPerf scores a set of runs. Tuning runs, not a timed set: a timed set is
fresh, in order, and never chosen among sets."""
import os
import time
from statistics import mean

from .. import mlperf_rules, timing
from . import space, trials


def olympic(values):
    """MLPerf's mean: without the best and the worst value when there are at least 3."""
    values = sorted(values)
    return mean(values[1:-1] if len(values) >= 3 else values)


def run_sets(s, sets, knobs, seeds, folder, args, ruleset):
    """{name: row} for each (name, params) of `sets`, every set on every seed of `seeds`, --parallel runs at once
    through --launcher. The sets take turns seed by seed, so that a machine's slow spell falls on all of them
    alike (their minutes are compared side by side)."""
    pending = [(name, params, seed) for seed in seeds for name, params in sets]
    running, done = [], {name: [] for name, _ in sets}
    while pending or running:
        while pending and len(running) < args.parallel:
            name, params, seed = pending.pop(0)
            sub = os.path.join(folder, name.replace(" ", "-"))
            os.makedirs(sub, exist_ok=True)
            run = trials.Run(space.apply(s, params, knobs), sub, seed, args.launcher)
            run.start()
            running.append((name, run))
        for item in [r for r in running if r[1].done()]:
            running.remove(item)
            done[item[0]].append(item[1])
        time.sleep(0.5)
    return {name: row(done[name], space.apply(s, params, knobs), ruleset, args.mode) for name, params in sets}


def row(runs, s, ruleset, mode):
    """What the table shows of one set: epochs to the target (olympic mean, min, max), converged runs, minutes, and
    in closed mode the compliance checker's verdicts and the RCP checker's on the logs."""
    read = [r.read() for r in runs]
    epochs = [trials.epochs_to_target(x, s) for x in read]
    converged = [x for x in read if x is not None and x.status == "success"]
    minutes = [x.minutes for x in converged if x.minutes is not None]
    result = {"epochs": olympic(epochs), "min": min(epochs), "max": max(epochs),
              "converged": f"{len(converged)}/{len(runs)}", "all_converged": len(converged) == len(runs), "minutes": olympic(minutes) if minutes else None,
              "logs": [r.log for r in runs], "seeds": [r.s.seed for r in runs]}
    if mode == "closed":
        checked = [timing.check_compliance(r.log, ruleset) for r in runs]
        reasons = [why for verdict, why in checked if verdict != "SUCCESS"]
        result["compliance"] = f"{len(runs) - len(reasons)}/{len(runs)} SUCCESS" + (f" ({reasons[0]})" if reasons else "")
        if len(converged) == len(runs) == mlperf_rules.RUNS_NEEDED and s.num_classes == mlperf_rules.IMAGENET_CLASSES:
            result["rcp"] = timing.check_rcp(converged, ruleset).message
    return result
