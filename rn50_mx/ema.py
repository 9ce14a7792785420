"""Weight EMA (an open-division lever, docs/open-division.md): an exponential moving average of every parameter,
BatchNorm running statistics included, that every eval uses instead of the live weights.

Every --ema-every steps, after the optimizer's update: ema = decay * ema + (1 - decay) * w, in float32, where w is
the fp32 master copy of a float16 or bfloat16 weight (the optimizer's state) and the parameter itself otherwise (float32
weights, BatchNorm's parameters and statistics, which Gluon keeps in float32). The update is MXNet's multi-tensor
SGD kernel (multi_sgd_update) with lr = 1 - decay, wd = 1 and rescale_grad = -1 on the "gradient" w:
    ema - lr * (rescale_grad * w + wd * ema) = decay * ema + (1 - decay) * w,
a few calls per update on the parameters' device, queued like the step: no host sync.

BatchNorm writes its running statistics in its backward without declaring them to MXNet's engine (train.fit's
waitall before the statistics' allreduce), so an operation that reads only them could run while the backward still
writes. Each update call therefore holds whole layers: a BatchNorm's statistics come with its gamma, which the engine
hands over only after the optimizer has updated it from the gradient that very backward wrote.
"""
import contextlib

import mxnet as mx

from .errors import InputError
from .optim import MAX_TENSORS_PER_CALL


def make(net, trainer, s):
    """The EMA of `net` for --ema-decay, or Off; after the warm-up, which creates the optimizer's master copies."""
    return EMA(net, trainer, s.ema_decay, s.ema_every) if s.ema_decay else Off()


class Off:
    """No EMA: the evals use the live weights."""

    def update(self, step):
        pass

    @contextlib.contextmanager
    def swapped_in(self):
        yield

    def state(self):
        return None


def masters(trainer):
    """{parameter name: its fp32 master copy} for the parameters the optimizer keeps one of (float16 and bfloat16
    weights under multi_precision: the state is (momentum, master))."""
    states = trainer._updaters[0].states if trainer._updaters else {}
    return {trainer._params[i].name: state[1] for i, state in states.items()
            if isinstance(state, (tuple, list)) and len(state) == 2}


def layers(params):
    """The parameters cut into layers: runs of trainable parameters followed by the statistics that go with them
    (conv weight, gamma, beta, running mean, running var), so no update call splits a BatchNorm (see the module)."""
    runs, run = [], []
    for p in params:
        if run and p.grad_req != "null" and run[-1].grad_req == "null":
            runs.append(run)
            run = []
        run.append(p)
    return runs + [run] if run else runs


def chunks(params, size=MAX_TENSORS_PER_CALL):
    """Lists of at most `size` parameters made of whole layers (a layer is far smaller than a call)."""
    out, chunk = [], []
    for layer in layers(params):
        if chunk and len(chunk) + len(layer) > size:
            out.append(chunk)
            chunk = []
        chunk = chunk + layer
    return out + [chunk] if chunk else out


class EMA:
    """The average of `net`'s parameters, on their device: `update` every `every`-th step, `swapped_in` for an eval,
    `state` and `restore` for checkpoints (arrays by parameter name)."""

    def __init__(self, net, trainer, decay, every):
        self.params = list(net.collect_params().values())
        self.decay, self.every = decay, every
        master = masters(trainer)
        self.sources = {p.name: master.get(p.name, p.data()) for p in self.params}
        self.average = {p.name: self.sources[p.name].astype("float32", copy=True) for p in self.params}
        self.live = {p.name: p.data().copy() for p in self.params}  # the training weights while the EMA is in
        self.calls = chunks(self.params)

    def update(self, step):
        """After update number `step` (1-based, counted over the run): average the new weights in on every
        `every`-th one."""
        if step % self.every:
            return
        for chunk in self.calls:
            n = len(chunk)
            pairs = [a for p in chunk for a in (self.average[p.name], self.sources[p.name])]
            mx.nd.multi_sgd_update(*pairs, lrs=(1 - self.decay,) * n, wds=(1.0,) * n, rescale_grad=-1.0,
                                   num_weights=n, out=[self.average[p.name] for p in chunk])

    @contextlib.contextmanager
    def swapped_in(self):
        """The network runs with the averaged parameters (cast to each parameter's dtype) inside the block, and
        with its own again after it: device copies only. The copies of the BatchNorm statistics wait for every queued
        operation first: the last backward may still be writing them, and the engine does not know it (the module's
        docstring; a 1-rank run has no statistics allreduce that waits)."""
        mx.nd.waitall()
        for p in self.params:
            p.data().copyto(self.live[p.name])
            mx.nd.cast(self.average[p.name], dtype=p.dtype, out=p.data())
        try:
            yield
        finally:
            for p in self.params:
                self.live[p.name].copyto(p.data())

    def state(self):
        """{parameter name: its average}, on the device (the checkpoint copies them to the host)."""
        return dict(self.average)

    def restore(self, arrays, where):
        """Copy a `state` back in place; one of another model is refused naming `where`."""
        for name, average in self.average.items():
            saved = arrays.get(name)
            if saved is None or saved.shape != average.shape:
                raise InputError(f"{where}: no EMA of {name} of shape {average.shape}")
            average[:] = saved
