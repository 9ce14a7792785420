"""The trainer's state in a checkpoint as arrays and plain data, not Gluon's pickle.

Trainer.save_states pickles the updater states with the optimizer object, so resuming a folder from someone else
would run any code planted in it, and unpickling puts every array back on the device it was saved from: on a node
where each process sees all GPUs, ranks 1-7 got our LARS groups on gpu(0) and died at their first step (MXNet's
dispatch compares cpu/gpu, not which GPU), and every rank opened a CUDA context on GPU 0.

Here the states are host copies saved with mx.nd.save (`trainer`: key "<param index>.<part>"), and the update counts,
the only optimizer state the schedule does not rebuild, are JSON (`trainer.json`), with each state's number of parts
and, for a state with None parts, their positions (`none`; a trainer.json written before it has no such key). A restore copies each array into
the state the warm-up left on the rank's own device, in place: nothing is allocated on another device, and the
arrays a captured graph points at stay where they are.
"""
import json
import os

import mxnet as mx

from .. import dist
from ..errors import InputError

STATES, COUNTS = "trainer", "trainer.json"


def parts(state):
    """The arrays of one updater state: none, one (momentum) or two (momentum, float32 master)."""
    if state is None:
        return []
    return list(state) if isinstance(state, (tuple, list)) else [state]


def nones(state):
    """The positions of the parts of `state` that are None: MXNet's SGD keeps (None, float32 master) for a float16
    weight under multi_precision with momentum 0 (mxnet 1.9.1 optimizer/optimizer.py:583-600)."""
    return [k for k, part in enumerate(parts(state)) if part is None]


def updater(trainer):
    """The trainer's one updater: one context per process, update on the worker (ours and Horovod's)."""
    if trainer._update_on_kvstore or len(trainer._updaters) != 1:
        raise InputError("checkpoints need a trainer that updates on its one context (--kv-store device/horovod)")
    return trainer._updaters[0]


def save(trainer, folder):
    """Write STATES and COUNTS of `trainer` into `folder` (rank 0: the states are the same on every rank)."""
    states = updater(trainer).states
    arrays = {f"{index}.{k}": part.as_in_context(dist.HOST)
              for index, state in states.items() for k, part in enumerate(parts(state)) if part is not None}
    mx.nd.save(os.path.join(folder, STATES), arrays)
    optimizer = trainer._optimizer
    plain = {"num_update": optimizer.num_update,
             "parts": {str(index): len(parts(state)) for index, state in states.items()},
             "none": {str(index): nones(state) for index, state in states.items() if nones(state)},
             "counts": {str(index): count for index, count in optimizer._index_update_count.items()}}
    with open(os.path.join(folder, COUNTS), "w") as f:
        json.dump(plain, f)


def restore(trainer, folder):
    """Put back a `save`d state: each array copied into this rank's state on its weight's device, the update counts
    into the optimizer (whose lr and momentum schedule follow them). Files that do not load, or a state of another
    shape, are one line."""
    try:
        with open(os.path.join(folder, COUNTS)) as f:
            plain = json.load(f)
        arrays = mx.nd.load(os.path.join(folder, STATES))
        put_back(trainer, plain, arrays, folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, mx.base.MXNetError) as err:
        raise InputError(f"{folder}: the trainer state does not load ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no detail'})") from None


def put_back(trainer, plain, arrays, folder):
    updater_, optimizer = updater(trainer), trainer._optimizer
    ctx = trainer._params[0].data().context
    for key, count in plain["parts"].items():
        index = int(key)
        weight = trainer._params[index].data()
        if index not in updater_.states:
            updater_.states[index] = optimizer.create_state_multi_precision(index, weight)
            updater_.states_synced[index] = True
        mine, none = parts(updater_.states[index]), plain.get("none", {}).get(key, [])
        keys = [None if k in none else f"{index}.{k}" for k in range(count)]
        if len(mine) != count or not all(fits(arrays, k, part) for k, part in zip(keys, mine)):
            raise InputError(f"{os.path.join(folder, STATES)}: the optimizer state of parameter {index} does not fit "
                             f"this model ({trainer._params[index].name})")
        for k, part in zip(keys, mine):
            if k is not None:
                part[:] = arrays[k]
    optimizer.num_update = int(plain["num_update"])
    optimizer._set_current_context(ctx.device_id)
    optimizer._index_update_count.clear()
    optimizer._index_update_count.update({int(k): int(v) for k, v in plain["counts"].items()})


def fits(arrays, key, part):
    """Whether saved part `key` (None: saved as None) fits this rank's `part`: both None, or one shape and type."""
    if key is None or part is None:
        return key is None and part is None
    saved = arrays.get(key)
    return saved is not None and saved.shape == part.shape and saved.dtype == part.dtype
