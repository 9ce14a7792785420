"""Checkpoints: everything a run's future depends on, written so that a stop at any moment leaves a usable one, and
read back so that the resumed run continues exactly as the uninterrupted run would have (tests/test_checkpoint.py).

A checkpoint is a folder DIR/step-N, N the train steps done:
  meta.json            the run (settings, ranks, base seed), where it stands (epoch, step, MLPerf block), every
                       other file's size and CRC-32, and the --mllog-file's path, size and CRC-32 (the resumed run
                       appends to that file); written last: a folder without it is partial
  params               rank 0's parameters (mx.nd.save), BatchNorm running statistics included
  trainer              rank 0's optimizer states (momentum, fp32 master weights) as arrays (mx.nd.save), and
  trainer.json         the update counts the schedule follows: no pickle, so a folder runs no code (trainer_file.py)
  rank<R>.aux          rank R's BatchNorm running statistics (each rank's own: BatchNorm is over the local batch)
  rank<R>.ema          with --ema-decay: rank R's weight EMA (the weights' and its own BatchNorm statistics' averages)
  rank<R>.json         rank R's iterator positions and skipped records, Python and NumPy RNG states, the epoch's loss
  rank<R>.<split>.dali rank R's DALI pipeline states (Pipeline.checkpoint(): reader position, shuffle buffer and the
                       random operators' generators)
Every array is saved from the host, so a restore allocates only on each rank's own device.
Weights and optimizer states are the same on every rank after each step (the gradients are allreduced): rank 0's stand
for all. MXNet's own generator (mx.random) has no state to save in 1.9.1; nothing draws from it after the model's
initialisation (a test checks it), and a resumed run builds its model without draws (zeros until the restore).

Writing: every rank writes its files into DIR/.tmp-step-N, each fsynced; once every rank has, rank 0 adds meta.json,
fsyncs, and renames the folder to step-N: that one rename makes it current. The previous checkpoint stays (a newest one
found corrupt falls back to it); older ones are deleted. DIR/lock keeps a second run off the folder.

Stopping: with a checkpoint folder, SIGTERM and SIGUSR1 (what Slurm's --signal sends before the time limit) only ask
for a stop. Every CHECK_PERIOD steps (with --batch-schedule, at every update end of several steps) the ranks sum their
requests in a tiny allreduce that is read at the next check, so that no step waits for it; all ranks see the same sum
at the same update end, write a checkpoint there and exit 75 (rn50_mx/exit_codes.sh states the codes).
Without a folder the default actions end a rank at once (dist.py says why).
The same allreduce carries each rank's verdict on its loss since the check before: when it was NaN, infinite or past
1000 ln C over the ranks, every rank stops at that same update end, run_stop aborted, and exits 78; no checkpoint is
written of a state that has not passed that check (Stops.settle), so none holds a diverged state.

The parts: disk.py (durable writes, the checks of meta.json), folder.py (the lock, the choice, writing and reading,
and which settings a resumed run must share with its checkpoint's), trainer_file.py (the optimizer's state),
stops.py (the signals and the agreed step), model_file.py (--save-model).
"""
from ..errors import InputError
from .disk import first_line, read_meta
from .folder import Checkpoints, Position, lock, model_arrays, newest_usable, refuse_ended, set_params
from .model_file import CHECKPOINT_FIELDS, MODEL_FILES, load_model, model_output, save_model, settings_problem
from ..exits import DIVERGED_EXIT, RESUMABLE_EXIT
from .stops import DIVERGED, RESUMABLE, Divergence, Stops, default_signals, loss_limit

__all__ = ["InputError", "first_line", "read_meta", "Checkpoints", "Position", "lock", "model_arrays",
           "newest_usable", "refuse_ended", "set_params", "model_output", "CHECKPOINT_FIELDS", "MODEL_FILES",
           "save_model", "load_model", "settings_problem", "RESUMABLE", "RESUMABLE_EXIT", "DIVERGED", "DIVERGED_EXIT",
           "Divergence", "Stops", "default_signals", "loss_limit"]
