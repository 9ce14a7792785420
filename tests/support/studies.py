"""Optuna studies of rn50_mx.search as another program, or an earlier driver, could leave them in RESULTS/CPU.db."""
import os

from tests.support.settings import SHRUNK_LAYERS


def planted_study(results, trial_runs=None, finals=None, attrs=None, finished=None, fixed=None):
    """The study 'CPU' in `results`/CPU.db (made here): with `finished` ({knob: value}, or (params, user attributes))
    a COMPLETE trial of those values scoring 1 epoch; then with `trial_runs` a RUNNING trial whose run record is
    `trial_runs` (and, with `fixed`, the values Optuna's enqueue_trial would have fixed for it: its system attribute
    fixed_params); the finals' records `finals` and other study attributes `attrs`."""
    import optuna

    os.makedirs(results, exist_ok=True)
    study = optuna.create_study(study_name="CPU", storage=f"sqlite:///{os.path.join(results, 'CPU.db')}")
    if finished is not None:
        params, user_attrs = finished if isinstance(finished, tuple) else (finished, {"curves": [[[1, 0.5]]]})
        from rn50_mx.search import space
        knobs = {env: space.parse_knob(f"{env}=0:{max(value, 1)}", "closed" if env in space.CLOSED else "open")
                 for env, value in params.items()}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={env: k.distribution() for env, k in knobs.items()}, value=1.0,
            user_attrs=user_attrs))
    if trial_runs is not None:
        trial = study.ask()
        trial.set_user_attr("runs", trial_runs)
        if fixed is not None:
            study._storage.set_trial_system_attr(trial._trial_id, "fixed_params", fixed)
    if finals is not None:
        study.set_user_attr("finals", finals)
    for name, value in (attrs or {}).items():
        study.set_user_attr(name, value)
    return study


def search_argv(results, out, data, *extra):
    """`python -m rn50_mx.search`'s arguments for a tiny study 'CPU' in `results` (fragment in `out`) on the shared
    data set DATA/train.rec and val.rec (5 classes at 32x32), knob EVAL_OFFSET 0:1 (sourced 1), one trial, one final
    seed, no finalist: a run that trains only when a trial or a finalist is left to run."""
    return ["--results", str(results), "--out", str(out), "--knob", "EVAL_OFFSET=0:1", "--trials", "1",
            "--final-seeds", "1", "--finalists", "0", "--data-train", f"{data}/train.rec", "--data-val",
            f"{data}/val.rec", "--num-classes", "5", "--image-shape", "3,32,32", "--num-layers", str(SHRUNK_LAYERS),
            "--batch-size", "4", "--dali-threads", "1", "--num-epochs", "3", "--eval-period", "2", "--eval-offset", "1",
            "--warmup-epochs", "1", "--accuracy-threshold", "0.3", *extra]
