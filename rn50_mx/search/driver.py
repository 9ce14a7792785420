"""The study loop: one driver, the only writer of its Optuna study (ask-and-tell), runs trials in --parallel slots,
prunes them on their eval curves, and survives its own death: each trial's process groups are in the study before
they run, so a restarted driver ends what is left of them and runs those trials again."""
import time
import zlib
from statistics import mean

from ..errors import InputError
from . import launchers, output, space, trials

SEARCH_SEEDS, FINAL_SEEDS = 100_000, 900_000  # disjoint: a finalist is never measured on a search seed


def final_seeds(study, count):
    """The finalists' fresh seeds: from FINAL_SEEDS, at an offset drawn from the study's name, so that a second
    study (the open search after the closed one) does not judge its sets on seeds an earlier study chose by."""
    base = FINAL_SEEDS + 16 * (zlib.crc32(study.encode()) % 4096)
    return [base + k for k in range(count)]


def check_study(study, where, knobs):
    """Every value of the study's trials a driver reads, as this search writes it: each trial's run records (what a
    later driver ends), its eval curves (what runs are pruned against, and drawn), a finished trial's values of the
    knobs, and the values each trial holds or is queued with (Optuna's fixed_params: what the next ask runs). The
    database may be another's: anything else is one line naming the study and the trial, before any trial runs or
    any signal is sent (a curve [[1]] was a TypeError mid-study, with a trial left training; fixed_params
    {"EVAL_OFFSET": "abc"} a ValueError from study.ask at every later driver)."""
    import optuna

    envs = {k.env for k in knobs}
    for t in study.get_trials(deepcopy=False):
        at = f"{where}, trial {t.number}"
        runs, curves = t.user_attrs.get("runs", []), t.user_attrs.get("curves", [])
        if not isinstance(runs, list):
            raise InputError(f"{at}: its runs {runs!r:.100} are not a list of run records; this search did not write "
                             "them")
        for record in runs:
            launchers.check_record(record, at)
        if not (isinstance(curves, list) and all(isinstance(c, list) and all(is_eval(e) for e in c) for c in curves)):
            raise InputError(f"{at}: its curves {curves!r:.100} are not lists of [epoch, top-1]; this search did not "
                             "write them")
        if t.state == optuna.trial.TrialState.COMPLETE and set(t.params) != envs:
            raise InputError(f"{at}: a finished trial of {sorted(t.params)}, not of the knobs {sorted(envs)}; this "
                             "search did not write it")
        for what, point in (("its values", t.params), ("the values it is queued with", t.system_attrs.get(
                "fixed_params", {}))):
            problem = space.point_problem(point, knobs)
            if problem:
                raise InputError(f"{at}: {what}: {problem}; this search did not write them")


def is_eval(point):
    """An eval of a curve as read back from the study: [epoch >= 0, top-1 or null]."""
    return (isinstance(point, list) and len(point) == 2 and launchers.is_count(point[0], 0)
            and (point[1] is None or isinstance(point[1], (int, float)) and not isinstance(point[1], bool)))


class Slot:
    """A trial in progress: its Optuna trial, params, settings and the seeds still to run."""

    def __init__(self, trial, params, s, seeds, folder):
        self.trial, self.params, self.s, self.seeds, self.folder = trial, params, s, list(seeds), folder
        self.runs, self.reported, self.pruned = [], set(), ""

    @property
    def current(self):
        return self.runs[-1] if self.runs else None


class Driver:
    def __init__(self, s, args, knobs, study, folder):
        self.s, self.args, self.knobs, self.study, self.folder = s, args, knobs, study, folder
        self.distributions = {k.env: k.distribution() for k in knobs}
        self.phase, self.slots = 0, []

    # --- the study's state ------------------------------------------------------------------------------------
    def finished(self):
        import optuna

        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return [t for t in self.study.get_trials(deepcopy=False) if t.state in done]

    def complete(self):
        """The trials that ran to their end, best first (a pruned trial's value is its last top-1: not comparable)."""
        import optuna

        done = [t for t in self.finished() if t.state == optuna.trial.TrialState.COMPLETE]
        return sorted(done, key=lambda t: t.value)

    def best_params(self):
        complete = self.complete()
        if not complete:
            return space.start(self.s, self.knobs)
        return {k.env: complete[0].params[k.env] for k in self.knobs}

    def curves(self):
        return [c for t in self.complete() for c in t.user_attrs.get("curves", [])]

    def recover(self):
        """Trials a killed driver left RUNNING: their process groups or jobs ended, the trial failed and queued again;
        then the Slurm jobs it submitted without recording them (held: they never ran)."""
        import optuna

        left = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for t in left:  # every record, and Slurm's commands for a job, checked before anything is ended
            launchers.check_ending(t.user_attrs.get("runs", []), self.where(t))
        for t in left:
            folder = output.trial_path(self.folder, self.args.study, t.number)
            done = [launchers.end_recorded(record, self.where(t), folder) for record in t.user_attrs.get("runs", [])]
            self.study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            self.study.enqueue_trial(t.params or t.system_attrs.get("fixed_params", {}), skip_if_exists=False)
            print(f"search: trial {t.number} was running when the last driver stopped: "
                  f"{'; '.join(dict.fromkeys(done)) or 'no run had started'}, queued again", flush=True)
        if self.args.launcher == "slurm":
            launchers.end_unrecorded_jobs(launchers.job_name(self.args.results, self.args.study))

    def where(self, trial):
        return f"{self.args.storage}: study {self.args.study!r}, trial {trial.number}"

    def enqueue_plan(self):
        """The next plan phase's points around the best so far, once the trials before them have finished."""
        import optuna

        waiting = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        plan = space.phases(self.knobs, self.args.mode)
        while not waiting and self.phase < len(plan):
            points = space.planned(self.best_params(), self.knobs, plan[self.phase])
            self.phase += 1
            for point in points:
                if not self.seen(point):
                    self.study.enqueue_trial(point)
            waiting = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))

    def seen(self, point):
        return any(t.params == point for t in self.study.get_trials(deepcopy=False))

    # --- running trials --------------------------------------------------------------------------------------
    def launch(self):
        import optuna

        trial = self.study.ask(self.distributions)
        params = {k.env: trial.params[k.env] for k in self.knobs}
        try:
            folder = output.trial_folder(self.folder, self.args.study, trial.number)
        except InputError:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # no RUNNING trial for the next driver to end
            raise
        seeds = [SEARCH_SEEDS + trial.number * 16 + k for k in range(self.args.seeds_per_trial)]
        slot = Slot(trial, params, space.apply(self.s, params, self.knobs), seeds, folder)
        self.slots.append(slot)
        self.next_seed(slot)

    def next_seed(self, slot):
        run = trials.Run(slot.s, slot.folder, slot.seeds.pop(0), self.args.launcher)
        slot.runs.append(run)
        try:
            slot.trial.set_user_attr("runs", [run.start(launchers.job_name(self.args.results, self.args.study))])
            run.go()  # kept in the study: a driver killed from now on leaves a run the next one ends
        except launchers.LaunchError:
            self.give_back(slot)
            raise
        except InputError as err:  # the trial's settings refused: a pruned trial
            slot.pruned = str(err)

    def give_back(self, slot):
        """A trial whose run could not start or was stopped at --hours: failed, its values queued again, so that it
        costs no trial."""
        import optuna

        self.study.tell(slot.trial, state=optuna.trial.TrialState.FAIL)
        self.study.enqueue_trial(slot.params, skip_if_exists=False)
        self.slots.remove(slot)

    def poll(self, slot):
        """Report new evals, prune, start the next seed; True when the trial has ended (told to the study)."""
        import optuna

        run = slot.current
        if slot.pruned and (run.started is None or run.done()):
            return self.end(slot, optuna.trial.TrialState.PRUNED)
        # whether the run has ended, asked before its log is read: a run that ends between the two (its `stalled`,
        # `diverged` or last eval written meanwhile) is taken as running, and its whole log is read at the next poll.
        # Asked after, a stalled run's trial was told COMPLETE from the log as it was before the stall.
        done = run.done()
        state = run.read()
        for epoch, top1 in (state.evals if state else []):
            if (len(slot.runs), epoch) not in slot.reported:
                slot.reported.add((len(slot.runs), epoch))
                if len(slot.runs) == 1 and top1 is not None:
                    slot.trial.report(top1, epoch)
        if state and (state.diverged or state.stalled) and not done:
            return False  # training stops itself on a diverged loss or a stall: its run_stop and its exit come next
        if state and state.stalled:  # a rank made no progress: a failure of the run, no finding about the values
            slot.pruned = state.stalled
            return self.end(slot, optuna.trial.TrialState.FAIL)
        why = trials.verdict(state, slot.s, self.curves(), self.args.prune_share, running=not done)
        if why:
            run.stop(why)  # a run that stopped itself has ended: nothing left to end
            slot.pruned = why
            return self.end(slot, optuna.trial.TrialState.PRUNED)
        if not done:
            return False
        if slot.seeds:
            self.next_seed(slot)
            return False
        return self.end(slot, optuna.trial.TrialState.COMPLETE)

    def end(self, slot, state):
        import optuna

        results = [(r, r.read()) for r in slot.runs]
        epochs = [trials.epochs_to_target(read, slot.s) for _, read in results]
        minutes = [trials.minutes_to_target(read, slot.s) for _, read in results]
        slot.trial.set_user_attr("curves", [read.evals for _, read in results if read is not None])
        slot.trial.set_user_attr("minutes", minutes)
        slot.trial.set_user_attr("epochs", epochs)
        slot.trial.set_user_attr("logs", [r.log for r, _ in results])
        failed = any(read is None or read.minutes is None for _, read in results)
        if state == optuna.trial.TrialState.COMPLETE and failed:
            state, slot.pruned = optuna.trial.TrialState.FAIL, "a run ended without run_stop"
        value = None
        if state == optuna.trial.TrialState.COMPLETE:
            value = mean(epochs if self.args.objective == "epochs" else minutes)
        if slot.pruned:
            slot.trial.set_user_attr("why", slot.pruned)
        self.study.tell(slot.trial, value, state=state)
        print(output.trial_line(slot, state.name, value, results), flush=True)
        return True

    def run(self):
        """Trials until --trials have finished or --hours have passed; returns the number finished now. A trial still
        running at --hours (a long one, or one hung in a collective) is stopped and queued again: the next run of
        the driver runs it."""
        deadline = time.time() + self.args.hours * 3600
        self.recover()
        if not self.study.get_trials(deepcopy=False):
            self.study.enqueue_trial(space.start(self.s, self.knobs))
        started = len(self.finished())
        while True:
            self.slots = [slot for slot in self.slots if not self.poll(slot)]
            remaining = self.args.trials - len(self.finished()) - len(self.slots)
            if time.time() < deadline and remaining > 0 and len(self.slots) < self.args.parallel:
                self.enqueue_plan()
                self.launch()
                continue
            if time.time() >= deadline:
                for slot in list(self.slots):
                    if slot.current and slot.current.started:
                        slot.current.stop("past --hours")
                    self.give_back(slot)
                    print(f"search: trial {slot.trial.number} was still running at --hours: stopped, queued again",
                          flush=True)
            if not self.slots:
                return len(self.finished()) - started
            time.sleep(1.0)

    def stop_all(self, why):
        for slot in self.slots:
            if slot.current and slot.current.started:  # ending a finished run is a no-op
                slot.current.stop(why)
