"""The finalists: the best sets of the search, and the sourced config beside them, each run again on the same fresh
seeds (never a search seed), scored as MLPerf scores a set of runs. Tuning runs, not a timed set: a timed set is
fresh, in order, and never chosen among sets."""
import os
import re
import time
from statistics import mean

from .. import files, mlperf_rules, timing
from ..errors import InputError
from . import launchers, output, space, trials


def olympic(values):
    """MLPerf's mean: without the best and the worst value when there are at least 3."""
    values = sorted(values)
    return mean(values[1:-1] if len(values) >= 3 else values)


class Record:
    """The finals' runs in the study (its user attribute "finals"), as the trials' are: each started run's set
    values, seed, folder, launcher and launcher record, and whether a driver saw it end. A driver killed during the
    finals leaves a run going and its log half written: the next driver ends it (launchers.end_recorded: only while
    it is provably the run's, a process of it naming the run's folder) and runs it again; a run that ended under a
    driver is scored from its log, not run again, once the log's own seed and settings are the run's
    (trials.log_problem: a log planted in a finalist's folder was scored as that finalist's)."""

    KEYS = {"set", "params", "seed", "folder", "launcher", "record", "ended"}

    def __init__(self, study, args, s, knobs):
        self.study, self.runs, self.knobs = study, study.user_attrs.get("finals", []), knobs
        self.where = f"{args.storage}: study {args.study!r}, finals"
        parent = output.finals_parent(args.results, args.study)
        if not isinstance(self.runs, list) or not all(self.usable(run, parent) for run in self.runs):
            raise InputError(f"{self.where}: a run {self.runs!r:.200} is not one this search recorded (its set, values, "
                             f"seed, launcher, record and a folder {parent}/N/SET)")
        for run in self.runs:
            launchers.check_record(run["record"], self.where)
        launchers.check_ending([run["record"] for run in self.runs if not run["ended"]], self.where)
        for run in self.runs:
            log = launchers.log_path(run["launcher"], run["folder"], run["seed"])
            if run["ended"] and not os.path.isfile(log):
                raise InputError(f"{self.where}: the log {log} of finalist {run['set']} seed {run['seed']}, which "
                                 "ended under an earlier driver, is not there to score; restore it, or give another "
                                 "--study")
            if run["ended"]:
                why = trials.log_problem(log, trials.Run(space.apply(s, run["params"], knobs), run["folder"],
                                                         run["seed"], run["launcher"]).s)
                if why:
                    raise InputError(f"{self.where}: the log {log} of finalist {run['set']} seed {run['seed']}, which "
                                     f"ended under an earlier driver, is not that run's ({why}); a finalist scores "
                                     "its own log only: restore it, or give another --study")

    def usable(self, run, parent):
        """Whether `run`, read back from the study, is what started() writes: values of every knob, each in its range;
        the folder it names is scored, so it must be PARENT/N/SET, N digits and SET the run's set, and lie there
        really (no '..', no planted link)."""
        if not (isinstance(run, dict) and set(run) == self.KEYS and isinstance(run["set"], str)
                and space.point_problem(run["params"], self.knobs) is None
                and set(run["params"]) == {k.env for k in self.knobs}
                and launchers.is_count(run["seed"], 0) and run["launcher"] in launchers.KINDS
                and isinstance(run["ended"], bool) and isinstance(run["folder"], str)):
            return False
        sub = set_folder(run["set"])
        shape = re.fullmatch(re.escape(parent) + r"/(\d+)/" + re.escape(sub), run["folder"])
        return bool(shape) and not os.path.islink(parent) and \
            os.path.realpath(run["folder"]) == os.path.join(os.path.realpath(parent), shape[1], sub)

    def save(self):
        self.study.set_user_attr("finals", self.runs)

    def end_orphans(self):
        """End and forget the runs a killed driver left going."""
        orphans = [run for run in self.runs if not run["ended"]]
        for run in orphans:
            done = launchers.end_recorded(run["record"], self.where, run["folder"])
            print(f"search: finalist {run['set']} seed {run['seed']} was running when the last driver stopped: {done}, "
                  "run again", flush=True)
        if orphans:
            self.runs = [run for run in self.runs if run["ended"]]
            self.save()

    def ended(self, params, seed):
        """The run of values `params` on `seed` that ended under a driver, or None."""
        return next((run for run in self.runs if run["ended"] and run["params"] == params and run["seed"] == seed),
                    None)

    def started(self, name, params, run, kind):
        entry = dict(set=name, params=params, seed=run.seed, folder=run.folder, launcher=kind,
                     record=run.started.record, ended=False)
        self.runs.append(entry)
        self.save()
        return entry

    def finished(self, entry):
        entry["ended"] = True
        self.save()


def run_sets(s, sets, knobs, seeds, args, ruleset, record):
    """{name: row} for each (name, params) of `sets`, every set on every seed of `seeds`, --parallel runs at once
    through --launcher in a new STUDY.finals/N (made when a run starts there); a run that `record` (a Record) holds as
    ended is scored from its log instead. The sets take turns seed by seed, so that a machine's slow spell falls on
    all of them alike (their minutes are compared side by side)."""
    pending, folder, running = [], None, []
    done = {name: [] for name, _ in sets}
    for seed in seeds:
        for name, params in sets:
            kept = record.ended(params, seed)
            if kept is None:
                pending.append((name, params, seed))
                continue
            done[name].append(trials.Run(space.apply(s, params, knobs), kept["folder"], seed, kept["launcher"]))
            print(f"search: finalist {name} seed {seed} ended under an earlier driver: its log "
                  f"{done[name][-1].log} is scored, not run again", flush=True)
    try:
        while pending or running:
            while pending and len(running) < args.parallel:
                name, params, seed = pending.pop(0)
                folder = folder or output.finals_folder(args.results, args.study)
                run = trials.Run(space.apply(s, params, knobs), made(os.path.join(folder, set_folder(name))), seed,
                                 args.launcher)
                run.start(launchers.job_name(args.results, args.study))
                running.append([name, run, None])  # ended from here on, whatever happens next
                running[-1][2] = record.started(name, params, run, args.launcher)
                run.go()
            for item in [r for r in running if r[1].done()]:
                running.remove(item)
                record.finished(item[2])
                done[item[0]].append(item[1])
            time.sleep(0.5)
    except BaseException:  # a stop (SIGTERM, Ctrl-C), a run that cannot start, a failure: as the trials end theirs
        for _, run, _ in running:
            run.stop("driver stopped")
        raise
    return {name: row(done[name], space.apply(s, params, knobs), ruleset, args.mode) for name, params in sets}


def set_folder(name):
    """The folder of a set's runs in STUDY.finals/N: its name without spaces (sourced, trial-3)."""
    return name.replace(" ", "-")


def made(folder):
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise files.os_error(folder, err, "create") from None
    return folder


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
