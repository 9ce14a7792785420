"""`python -m rn50_mx.search`: the seed article's hyperparameter method, automated. On the sourced config and its data
(the settings object training resolves), it runs real training trials, coarse then fine (the sourced settings, then
the horizon, the learning rate within +-10-20%, the warmup, the weight decay on its lattice, then a seeded TPE
sampler), prunes them on their eval curves, re-runs the best sets and the sourced one on fresh seeds, and writes the
winner as config/<SYSTEM>_hparams.sh.

    source config/CPU.sh
    DATADIR=data/fashion-mnist python -m rn50_mx.search --trials 12 --hours 2 [--dry-run] [rn50_mx.train flags]

Modules: space (knobs, allowed forms, the plan), trials (one trial's runs, read as they grow, pruned), driver (the
Optuna study, ask-and-tell from this one process, resumable), finals (fresh seeds, MLPerf's olympic mean, the
checkers), output (lines, table, picture, fragment). docs/search.md says when to search and what it costs.
"""
import os
import re

from .. import children, config, files
from ..errors import InputError
from . import launchers, output, space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parser():
    """The search's own options (config.tool_parser: training's flags are handed on)."""
    parser = config.tool_parser("python -m rn50_mx.search", __doc__)
    add = parser.add_argument
    add("--mode", choices=("closed", "open"), default="closed",
        help="closed: only the closed division's hyperparameters, each in its allowed form (default); open: any "
             "numeric setting, the runs logged as open")
    add("--knob", action="append", default=[], metavar="NAME=LOW:HIGH",
        help="a setting to search, by its environment name, and its range (repeat it); default: NUMEPOCHS 2 below "
             "to 1 above the config's, LR half to double, WARMUP_EPOCHS 0 to 1 above")
    add("--trials", type=int, default=12, help="trials to finish, counting those of an earlier run of the study "
                                                "(default 12)")
    add("--hours", type=float, default=24.0, help="hours this run of the driver may start trials for (default 24)")
    add("--seeds-per-trial", type=int, default=1, help="runs per trial, each on its own seed (default 1)")
    add("--finalists", type=int, default=1, help="best sets re-run on fresh seeds beside the sourced one (default 1)")
    add("--final-seeds", type=int, default=10,
        help="fresh seeds per finalist (default 10: a set that misses 1 seed in 5 misses one of 10 in 89%% of "
             "finals, of MLPerf's 5 in 67%%)")
    add("--parallel", type=int, default=1, help="trials at once (default 1: one machine's GPUs per trial)")
    add("--launcher", choices=launchers.KINDS, default="local",
        help="local: python -m rn50_mx.train (under horovodrun for several processes) on this machine (default); "
             "docker: run_with_docker.sh (CONT: the image), one trial per run; slurm: one run.sub job per run "
             "through sbatch (sbatch from this repository's root; --parallel jobs at once)")
    add("--storage", default="", help="an Optuna storage URL (default: sqlite:///RESULTS/STUDY.db)")
    add("--study", default="", help="the study's name (default: the config's DGXSYSTEM)")
    add("--objective", choices=("epochs", "minutes"), default="epochs",
        help="epochs to the target (MLPerf's measure, default) or minutes from run_start to run_stop")
    add("--prune-share", type=float, default=0.75,
        help="share of the horizon after which a trial behind the best curve is stopped (default 0.75)")
    add("--results", default="", help="folder of the study's runs, picture and lock (default results/search/STUDY)")
    add("--out", default=os.path.join(ROOT, "config"), help="folder of the fragment (config/)")
    add("--dry-run", action="store_true", help="print the plan and its cost; run nothing (no data needed)")
    return parser


def parse_args(argv):
    """(the search's own options, the rn50_mx.train flags left for config)."""
    args, rest = parser().parse_known_args(argv)
    # Seeds: each trial's and each study's finals take 16 in a row (driver.py), so at most 16 per trial and per set.
    for name, low, high in (("trials", 1, 10_000), ("seeds_per_trial", 1, 16), ("finalists", 0, 100),
                            ("final_seeds", 1, 16), ("parallel", 1, 1024)):
        if not low <= getattr(args, name) <= high:
            raise InputError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be {low} to {high}")
    if not args.hours > 0 or not 0 < args.prune_share <= 1:
        raise InputError("--hours must be > 0 and --prune-share in (0, 1]")
    return args, rest


def prepare(argv):
    """(settings, args, knobs) checked, before any study is opened."""
    args, rest = parse_args(argv)
    s = config.load(rest, prog="rn50_mx.search")
    args.fragment = os.path.abspath(os.path.join(args.out, output.fragment_name(s, args.mode)))  # one path, checked
    if args.mode == "open":
        s = s.replace(submission_division="open")
    knobs = [space.parse_knob(k, args.mode) for k in args.knob] or space.default_knobs(s, args.mode)
    space.check_start(space.start(s, knobs), knobs, args.mode)
    args.study = args.study or s.dgxsystem
    if not re.fullmatch(config.SYSTEM_NAME, args.study):
        raise InputError(f"--study {args.study!r}: letters, digits, '.', '_' and '-' only (it names the study's files)")
    args.results = os.path.abspath(args.results or os.path.join("results", "search", args.study))
    args.storage = args.storage or f"sqlite:///{os.path.join(args.results, args.study + '.db')}"
    return s, args, knobs


def started_with(s, knobs):
    """The sourced settings the study's trials are compared under: every value a variable sets, except the knobs'
    and each run's own (its seed; its log and checkpoints are host paths, which as_env leaves out)."""
    own = {k.env for k in knobs} | {"SEED", "RN50_CHECKPOINT_DIR", "RN50_SAVE_MODEL"}
    return {name: value for name, value in config.as_env(s).items() if name not in own}


def open_study(args, knobs, s):
    """The study, created or continued; one line when the storage cannot be opened or the study was started with
    another space or under other sourced settings (its trials would not be comparable)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space_text = output.params_text({k.env: f"{k.low:g}:{k.high:g}" for k in knobs}) + f" {args.mode} {args.objective}"
    try:
        study = optuna.create_study(study_name=args.study, storage=args.storage, load_if_exists=True,
                                    direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's and Optuna's storage errors: one line naming the URL
        raise InputError(f"--storage {args.storage}: cannot open the study ({type(err).__name__}: "
                         f"{str(err).splitlines()[0]})") from None
    known = study.user_attrs.get("space")
    if known is None:
        study.set_user_attr("space", space_text)
    elif known != space_text:
        raise InputError(f"study {args.study!r} in {args.storage} searches {known}, not {space_text}: give another "
                         "--study (or the same knobs)")
    settings = started_with(s, knobs)
    known = study.user_attrs.get("settings")
    if known is None:
        study.set_user_attr("settings", settings)
    elif not (isinstance(known, dict) and all(isinstance(v, str) for v in known.values())):
        raise InputError(f"study {args.study!r} in {args.storage}: its settings {known!r:.100} are not the "
                         "{variable: value} this search records; it did not write them: give another --study")
    elif known != settings:
        changed = sorted(set(known) ^ set(settings) | {k for k in known if known[k] != settings.get(k)})
        then = " ".join(f"{k}={known.get(k, '(unset)')}" for k in changed[:3])
        now = " ".join(f"{k}={settings.get(k, '(unset)')}" for k in changed[:3])
        raise InputError(f"study {args.study!r} in {args.storage} was started with {then}, not {now}: its trials "
                         "would not be comparable; source those settings again, or give another --study")
    return study


def lock_path(args):
    """The study's lock file: beside its SQLite database, so that drivers given other --results folders but one
    database meet; in --results for other storages (drivers sharing a database server must share --results)."""
    if args.storage.startswith("sqlite:///"):
        return f"{os.path.abspath(args.storage[len('sqlite:///'):])}.{args.study}.lock"
    return os.path.join(args.results, args.study + ".lock")


def hold_lock(args):
    """The study's lock for the life of this process: a second driver on it is one line."""
    try:
        os.makedirs(args.results, exist_ok=True)
    except OSError as err:
        raise files.os_error(args.results, err, "create") from None
    said = f"--storage {args.storage}" if args.storage.startswith("sqlite:///") else None
    return files.noted_lock(lock_path(args), lambda note: f"study {args.study!r}: another driver runs it ({note}); "
                            "one driver writes a study", said)


def search(s, args, knobs):
    from .. import data
    from . import driver, finals

    if not s.data_train or not s.data_val:
        raise InputError("--data-train and --data-val (or DATADIR): every trial trains and evaluates on real data")
    launchers.check(args.launcher, s)
    data.check_files(s)
    fragment = args.fragment
    lock = hold_lock(args)
    with files.owned_in_folder(fragment):  # the tuner's rules: folder made, one writer, checked before work
        files.refuse_special(fragment, "fragment")
        study = open_study(args, knobs, s)
        driver.check_study(study, f"{args.storage}: study {args.study!r}", knobs)
        trials_there = output.trials_folder(args.results, args.study)
        if not study.get_trials(deepcopy=False) and output.holds_runs(trials_there):
            raise output.earlier_runs(trials_there, args.study)
        record = finals.Record(study, args, s, knobs)
        record.end_orphans()  # before any trial: a finalist left going holds the devices
        loop = driver.Driver(s, args, knobs, study, args.results)
        try:
            code = trials_and_finals(s, args, knobs, study, loop, record)
        except KeyboardInterrupt:
            loop.stop_all("driver stopped")  # the finals end their own runs (finals.run_sets)
            print(f"search: stopped; every run's processes ended; the same command continues study {args.study!r}",
                  flush=True)
            return 143
        except InputError:  # e.g. Slurm unreachable for long: the runs are ended before the one line
            loop.stop_all("driver stopped")
            raise
    os.close(lock)
    return code


def trials_and_finals(s, args, knobs, study, loop, record):
    """The trials, then the finals and the fragment; the exit status."""
    from .. import mlperf_rules
    from . import driver, finals

    loop.run()
    fragment = args.fragment
    output.picture(os.path.join(args.results, args.study + ".png"), study.get_trials(deepcopy=False),
                   s.accuracy_threshold)
    best = loop.complete()[:args.finalists]
    if not best:
        print("search: no trial completed; nothing to compare" if args.finalists else "search: done")
        return 1 if args.finalists else 0
    sets = [("sourced", space.start(s, knobs))] + [(f"trial {t.number}", {k.env: t.params[k.env] for k in knobs})
                                                  for t in best if t.params != space.start(s, knobs)]
    seeds = driver.final_seeds(args.study, args.final_seeds)
    rows = finals.run_sets(s, sets, knobs, seeds, args, mlperf_rules.DEFAULT_RULESET, record)
    table = {name: (params, rows[name]) for name, params in sets}
    print(output.table(table, args.mode))
    key = "epochs" if args.objective == "epochs" else "minutes"
    reached = [name for name in table if table[name][1]["all_converged"]]  # a miss scores no epochs, only a guess
    if not reached:
        print(f"search: no set reached the target on every fresh seed; {fragment} not written")
        return 1
    winner = min(reached, key=lambda name: table[name][1][key])
    if winner == "sourced":
        print(f"search: the sourced settings stay best on fresh seeds; {fragment} not written")
    else:
        params, row = table[winner]
        output.write_fragment(fragment, output.fragment_text(fragment, params, row, args.study))
        print(f"search: wrote {fragment} ({winner}); the launchers source it after "
              f"config/{os.path.basename(fragment)[:-len('_hparams.sh')]}.sh")
    return 0


def main(argv=None):
    import sys

    s, args, knobs = prepare(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        print(output.plan_text(s, knobs, args))
        return 0
    children.stop_on_sigterm()
    return search(s, args, knobs)
