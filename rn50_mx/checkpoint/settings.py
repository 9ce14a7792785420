"""Which settings a resumed run must share with its checkpoint's run: those that decide the data order and the
numerics."""
from .. import config

# Settings that do not change what a run computes; every other one must match the checkpoint's. The world size is
# compared instead of the node and GPU counts.
FREE = {"checkpoint_dir", "checkpoint_every", "save_model", "mllog_file", "disp_batches", "exit_timeout",
        "cache_cleared", "submission_org", "dgxsystem", "dgxnnodes", "dgxngpu", "seed"}


def differences(saved, s, world):
    """'--flag VALUE (checkpoint: OLD)' for each setting that decides the data order or the numerics and differs
    from the checkpoint's (the seed only when given: a run without one takes the checkpoint's)."""
    now = {**{f: getattr(s, f) for f in config.FIELDS if f not in FREE}, "ranks": world}
    was = {**saved["settings"], "ranks": saved["world"]}
    if s.seed is not None:
        now["seed"], was["seed"] = s.seed, saved["seed"]
    return [f"{config.flag_name(k) if k != 'ranks' else 'ranks'} {now[k]} (checkpoint: {was.get(k)})"
            for k in now if now[k] != was.get(k)]
