"""What the search shows and writes: a line per trial, the plan, the finalists' table, the picture, and the winner as
config/<SYSTEM>_hparams.sh."""
import datetime
import os

from ..errors import InputError
from ..files import os_error, remove_quietly, special_kind, temp_name, write_atomically
from . import space


def trials_folder(results, study):
    """The study's trial runs, named by the study: studies sharing --results never share a log."""
    return os.path.join(results, f"{study}.trials")


def earlier_runs(folder, study):
    """The one line for a folder of runs the study did not start (another database's study of this name)."""
    return InputError(f"{folder}: holds runs of an earlier study {study!r} (another database?); a trial scores only "
                      "logs it writes: give another --results or --study")


def holds_runs(folder):
    """Whether `folder` is a folder with something in it; one line when it cannot be listed."""
    try:
        return os.path.isdir(folder) and bool(os.listdir(folder))
    except OSError as err:
        raise os_error(folder, err, "read") from None


def made_folder(path):
    """The folder `path`, made if missing, never a symlink: a link planted there would send the runs elsewhere;
    anything else but a folder there is one line too (a FIFO sent finals_folder through a million names)."""
    if os.path.islink(path):
        raise InputError(f"{path}: a symlink; the search keeps its runs in a folder of its own there")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InputError(f"{path}: {special_kind(os.lstat(path).st_mode)}, not a folder; the search keeps its runs in "
                         "a folder of its own there")
    os.makedirs(path, exist_ok=True)


def trial_path(results, study, number):
    """Trial `number`'s folder: every run of it writes there, and names it (a later driver ends it by that)."""
    return os.path.join(trials_folder(results, study), f"{number:04d}")


def trial_folder(results, study, number):
    """Trial `number`'s folder, made here and new: a trial scores only logs it writes, never one an earlier
    database's trial of this number left."""
    folder = trial_path(results, study, number)
    try:
        made_folder(os.path.dirname(folder))
        os.mkdir(folder)
    except FileExistsError:
        raise earlier_runs(folder, study) from None
    except OSError as err:
        raise os_error(folder, err, "create") from None
    return folder


def finals_parent(results, study):
    """The folder of every run of the study's finals, RESULTS/STUDY.finals: a recorded finalist's log is read there
    only."""
    return os.path.join(results, f"{study}.finals")


def finals_folder(results, study):
    """This run of the finals' folder, STUDY.finals/N with the first N not there, made here: a second run of the
    finals keeps the first's logs and never reads them."""
    parent = finals_parent(results, study)
    for n in range(1, 1_000_000):
        folder = os.path.join(parent, str(n))
        try:
            made_folder(parent)
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue
        except OSError as err:
            raise os_error(folder, err, "create") from None
    raise InputError(f"{parent}: a million runs of the finals; clear it")


def fragment_name(s, mode):
    """The fragment's file name: config/<SYSTEM>_hparams.sh, which the launchers source after config/<SYSTEM>.sh;
    an open search of a closed config writes the fragment of its open config (<SYSTEM>_open.sh, as the recipe names
    it), which closed launches never source."""
    system = s.dgxsystem if mode == "closed" or s.submission_division == "open" else f"{s.dgxsystem}_open"
    return f"{system}_hparams.sh"


def params_text(params):
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def trial_line(slot, state, value, results):
    """trial N  PARAMS: per seed its top-1 per eval and epochs to the target; the trial's state and value."""
    seeds = []
    for run, read in results:
        curve = " ".join(f"{t:.3f}" for _, t in (read.evals if read else []))
        seeds.append(f"seed {run.s.seed}: top-1 {curve or '-'}" + (f" ({run.stopped})" if run.stopped else ""))
    shown = "" if value is None else f" {value:.3g}"
    why = f" ({slot.pruned})" if slot.pruned else ""
    return f"trial {slot.trial.number:3d}  {params_text(slot.params)}: {'; '.join(seeds)} -> {state}{shown}{why}"


def plan_text(s, knobs, args):
    """The --dry-run listing: the space, the plan's order, the budget and what it costs in epochs of training."""
    epochs = (args.trials * args.seeds_per_trial + (args.finalists + 1) * args.final_seeds) * s.num_epochs
    lines = [f"rn50_mx.search on {s.dgxsystem}: global batch {s.global_batch}, "
             f"{args.mode} division, objective {args.objective}, study {args.study!r} in {args.storage}",
             "space: " + ", ".join(f"{k.env} {k.low:g}..{k.high:g}" + (" on 1e-4 x 2^N" if k.lattice else "")
                                   for k in knobs),
             f"1. the sourced settings: {params_text(space.start(s, knobs))}",
             "2. the plan, each phase around the best so far: " + "; ".join(
                 f"{env} {', '.join({'add': f'{v:+g}', 'times': f'x{v:g}', 'set': f'{v:g}'}[how] for v in steps)}"
                 for env, steps, how in space.phases(knobs, args.mode)),
             "3. then a seeded TPE sampler over the space, up to the budget",
             f"budget: {args.trials} trials of {args.seeds_per_trial} seed(s) or {args.hours:g} h, {args.parallel} at "
             f"once; pruning: a diverging run at once, a run behind the best curve after {args.prune_share:.0%} of "
             "its horizon",
             f"finalists: the best {args.finalists} and the sourced settings on {args.final_seeds} fresh seeds each; "
             f"only a set that reaches the target on all of them can win (a set that misses 1 seed in 5 misses one "
             f"here {1 - 0.8 ** args.final_seeds:.0%} of the time)",
             f"cost at most: {epochs} epochs of training ({epochs} x the minutes of one epoch at this batch; "
             f"x {s.world_size} GPUs for GPU-hours)"]
    return "\n".join(lines)


def table(rows, mode):
    """The finalists side by side; says plainly that these are tuning runs."""
    head = f"{'set':14} {'epochs (olympic)':>16} {'min':>5} {'max':>5} {'converged':>9} {'minutes':>8}  params"
    lines = ["finalists (tuning runs on fresh seeds, not a timed MLPerf set):", head]
    for name, (params, r) in rows.items():
        minutes = "-" if r["minutes"] is None else f"{r['minutes']:.2f}"
        lines.append(f"{name:14} {r['epochs']:16.2f} {r['min']:5g} {r['max']:5g} {r['converged']:>9} {minutes:>8}  "
                     f"{params_text(params)}")
        if mode == "closed":
            lines.append(f"{'':14} compliance checker: {r['compliance']}" + (f"; RCP: {r['rcp']}" if r.get("rcp") else
                                                                              ""))
    return "\n".join(lines)


def fragment_text(fragment, params, row, study):
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    config = os.path.basename(fragment)[:-len("_hparams.sh")] + ".sh"
    head = ["# shellcheck shell=bash",
            f"# Written by python -m rn50_mx.search (study {study!r}), {when}, for config/{config}: "
            f"{row['epochs']:.2f} epochs to the target (olympic mean), {row['converged']} runs converged on fresh seeds",
            f"# Sourced after config/{config} and its _tuned.sh by run_with_docker.sh and run.sub, where a "
            "variable exported after the config keeps its value"]
    return "\n".join(head + [f"export {k}={v:g}" if isinstance(v, float) else f"export {k}={v}"
                             for k, v in params.items()]) + "\n"


def write_fragment(path, text):
    write_atomically(path, text, "hyperparameter fragment")


def picture(path, trial_list, target):
    """Top-1 per eval of every trial's runs (pruned ones faded) with the target line, and the best value so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, best) = plt.subplots(1, 2, figsize=(12, 4.5))
    values, running = [], None
    for t in trial_list:
        pruned = t.state.name != "COMPLETE"
        for curve in t.user_attrs.get("curves", []):
            if curve:
                curves.plot([e for e, _ in curve], [v for _, v in curve], alpha=0.25 if pruned else 0.9,
                            linestyle=":" if pruned else "-")
        if t.state.name == "COMPLETE":
            running = t.value if running is None else min(running, t.value)
        values.append(running)
    curves.axhline(target, color="grey", linestyle="--", label=f"target {target}")
    curves.set(xlabel="epoch", ylabel="top-1", title="every trial's evals (pruned: dotted)")
    curves.legend()
    best.plot(range(len(values)), values, marker="o")
    best.set(xlabel="trial", ylabel="best objective so far")
    fig.tight_layout()
    tmp = temp_name(path)  # a name no other writer shares: a link planted at a fixed one is never followed
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    except OSError as err:
        raise os_error(path, err) from None
    finally:
        plt.close(fig)
        remove_quietly(tmp)
