"""Optuna studies of rn50_mx.search as another program, or an earlier driver, could leave them in RESULTS/CPU.db."""
import os


def planted_study(results, trial_runs=None, finals=None, attrs=None, finished=None):
    """The study 'CPU' in `results`/CPU.db (made here): with `finished` ({knob: value}, or (params, user attributes))
    a COMPLETE trial of those values scoring 1 epoch; then with `trial_runs` a RUNNING trial whose run record is
    `trial_runs`; the finals' records `finals` and other study attributes `attrs`."""
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
        study.ask().set_user_attr("runs", trial_runs)
    if finals is not None:
        study.set_user_attr("finals", finals)
    for name, value in (attrs or {}).items():
        study.set_user_attr(name, value)
    return study
