"""What training minimises and how: the smoothed loss, LARS (MXNet optimizers `lars` and `sgdwfastlars`),
the learning-rate schedule, and the trainer.

Gradient scaling (symbols/resnet-v1b-stats-fl.py and common/fit.py): the loss is a per-sample vector, so backward
gives gradients *summed*
over the local batch, and `trainer.step(local_batch_size)` sets rescale_grad = 1/local_batch_size. Across
ranks, hvd.DistributedTrainer (Horovod 0.28) either sums and divides rescale_grad by the world size (Gloo, NCCL
< 2.10: measured 1/(4 x 2) with 2 Gloo ranks of 4 images) or averages in the allreduce; both give the optimizer
the gradient of the mean loss over the global batch, as the reference's sum x 1/3264 does.
"""
import functools
import warnings

import mxnet as mx
import numpy as np
from mxnet import gluon, nd

from .model import is_layer_weight, split_params

# MXNet's multi-tensor SGD kernels take at most 60 tensors per call (PreloadedMultiSGDKernelParam::N).
MAX_TENSORS_PER_CALL = 60


class SmoothedCrossEntropy(gluon.HybridBlock):
    """Per-sample cross-entropy against label-smoothed targets, in float32.

    Targets follow REF (Keras): q = (1 - a) on the gold class + a/K on every class, so gold gets
    1 - a + a/K and the others a/K. (The MXNet submission's SoftmaxOutput puts a/(K-1) on the others.)
    loss = -(1 - a) log p_gold - (a/K) sum_k log p_k, whose gradient w.r.t. the logits is p - q, with no
    one-hot built. It returns one value per sample, not the mean: backward then gives gradients *summed*
    over the batch, and the optimizer's rescale_grad = 1/global batch turns them into the mean
    (symbols/resnet-v1b-stats-fl.py).
    """

    def __init__(self, smoothing):
        super().__init__()
        self.smoothing = smoothing

    def hybrid_forward(self, F, logits, label):
        log_p = F.log_softmax(F.cast(logits, "float32"), axis=-1)
        gold = F.pick(log_p, label, axis=-1)
        return -(1 - self.smoothing) * gold - self.smoothing * F.mean(log_p, axis=-1)


def make_loss(settings):
    """The training loss with the settings' label smoothing (0.1 in the reference)."""
    return SmoothedCrossEntropy(settings.label_smoothing)


def lr_at(step, base_lr, end_lr, warmup_steps, total_steps, power=2):
    """Learning rate of update number `step` (1-based: the first update is step 1), PolySchedule.

    Linear warmup base*t/Tw for t <= Tw, then end + (base - end)*(1 - (t - Tw)/(T - Tw))**power; from T on it
    stays at end. Step 0 (before any update) gives 0 with warmup.
    """
    if warmup_steps > 0 and step <= warmup_steps:
        return base_lr * step / warmup_steps
    if step >= total_steps:
        return end_lr
    left = 1 - (step - warmup_steps) / (total_steps - warmup_steps)
    return end_lr + (base_lr - end_lr) * left ** power


def schedule(settings, steps_per_epoch):
    """`lr_at` bound to the settings: a callable num_update -> lr, which MXNet optimizers take as lr_scheduler."""
    return functools.partial(lr_at, base_lr=settings.lr, end_lr=settings.end_lr,
                             warmup_steps=round(settings.warmup_epochs * steps_per_epoch),
                             total_steps=settings.num_epochs * steps_per_epoch)


class LARS(mx.optimizer.Optimizer):
    """Momentum SGD with a layer-wise trust ratio on conv and dense weights (sgdwfastlars optimizer,
    lars_multi_mp_sgd_mom_update, REF's LARS).

    For a layer weight w with rescaled gradient g = rescale_grad * grad and weight decay wd:
        lr_i = lr * eta*||w|| / (||g|| + wd*||w|| + eps)   if ||w|| > 0 and ||g|| > 0, else lr
        m = momentum*m - lr_i*(wd*w + g);  w = w + m
    1-D tensors (`model.is_layer_weight` is False) take lr_i = lr; their wd is 0 through wd_mult, which
    `make_trainer` sets. With multi_precision, float16 tensors keep a float32 master copy and float32
    momentum; norms are taken on the master copy and on the float16 gradient cast to float32 (MXNet's CPU
    multi_sum_sq squares float16 in float16 and loses small gradients).

    No momentum correction: MXNet's own `lars` and the reference scale momentum by lr_t/lr_{t-1}, but only
    on the first update call of each step (sgdwfastlars optimizer, lars_multi_mp_sgd_mom_update); REF (TF) does not,
    and neither does this class.
    This class replaces MXNet's built-in `lars`, which picks the excluded tensors by name suffix.
    """

    def __init__(self, momentum=0.9, eta=0.001, eps=0.0, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.eta = eta
        self.eps = eps
        self.aggregate_num = MAX_TENSORS_PER_CALL  # make_optimizer sets the configured size

    def create_state(self, index, weight):
        return nd.zeros(weight.shape, weight.context, dtype=weight.dtype)

    def create_state_multi_precision(self, index, weight):
        """(momentum, float32 master) for float16 weights under multi_precision, else the momentum."""
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype("float32")
            return (self.create_state(index, master), master)
        return self.create_state(index, weight)

    def update(self, index, weight, grad, state):
        self.update_multi_precision(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """Update one tensor or a list of tensors of one dtype (gluon's Updater groups them so)."""
        if not isinstance(index, (tuple, list)):
            index, weight, grad, state = [index], [weight], [grad], [state]
        self._update_count(index)
        lrs, wds = self._get_lrs(index), self._get_wds(index)
        order = sorted(range(len(index)), key=lambda k: not is_layer_weight(weight[k].shape))
        n_lars = sum(is_layer_weight(w.shape) for w in weight)
        mixed = self.multi_precision and weight[0].dtype == np.float16
        ctx = weight[0].context
        lrs = nd.array([lrs[k] for k in order], ctx=ctx, dtype="float32")
        wds = nd.array([wds[k] for k in order], ctx=ctx, dtype="float32")
        states = [tuple(state[k]) if mixed else (state[k],) for k in order]
        if n_lars:
            masters = [s[-1] if mixed else weight[k] for s, k in zip(states, order[:n_lars])]
            grads32 = [grad[k].astype("float32", copy=False) for k in order[:n_lars]]
            w_sq = nd.multi_sum_sq(*masters, num_arrays=n_lars)
            g_sq = nd.multi_sum_sq(*grads32, num_arrays=n_lars)
            nd.multi_lars(lrs[:n_lars], w_sq, g_sq, wds[:n_lars], eta=self.eta, eps=self.eps,
                          rescale_grad=self.rescale_grad, out=lrs[:n_lars])
        sgd_mom = nd.preloaded_multi_mp_sgd_mom_update if mixed else nd.preloaded_multi_sgd_mom_update
        inputs = [a for s, k in zip(states, order) for a in (weight[k], grad[k]) + s]
        sgd_mom(*inputs, lrs, wds, out=[weight[k] for k in order], num_weights=len(order),
                momentum=self.momentum, rescale_grad=self.rescale_grad)


class SGDwFastLARS(LARS):
    """The same optimizer under the reference's name (`--optimizer sgdwfastlars`, common/fit.py)."""


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # replacing MXNet's own `lars` is intended; MXNet warns about it
    mx.optimizer.register(LARS)
mx.optimizer.register(SGDwFastLARS)


def make_optimizer(settings, steps_per_epoch):
    """LARS or momentum SGD on the warmup + poly(2) schedule; fp32 master weights when training in float16."""
    common = dict(momentum=settings.mom, wd=settings.wd, lr_scheduler=schedule(settings, steps_per_epoch),
                  multi_precision=settings.dtype == "float16")
    if settings.is_lars:
        optimizer = mx.optimizer.create(settings.optimizer, eta=settings.lars_eta, eps=settings.lars_eps, **common)
    else:
        optimizer = mx.optimizer.create("sgd", **common)
    # Tensors per multi-tensor update call. MXNet's own optimizers read MXNET_OPTIMIZER_AGGREGATION_SIZE from the
    # environment themselves; config.py reads it for every optimizer here, so the value in force is the one shown.
    optimizer.aggregate_num = settings.optimizer_aggregation_size
    return optimizer


def reset_trainer(trainer):
    """Undo the updates of a warm-up: update count 0 (the schedule restarts) and every optimizer state as it is
    created for the current weights (zero momentum, a master copy equal to the weight). The states stay
    allocated, so the first timed step creates none."""
    optimizer = trainer._optimizer
    optimizer.num_update = optimizer.begin_num_update
    for counts in optimizer._all_index_update_counts.values():
        counts.clear()
    for updater in trainer._updaters:
        for index in updater.states:
            fresh = optimizer.create_state_multi_precision(index, trainer._params[index].data())
            assign(updater.states[index], fresh)


def assign(state, value):
    """Copy `value` into `state` in place, both an array, None, or a tuple of them (the master-weight states)."""
    if isinstance(state, (tuple, list)):
        for part, new in zip(state, value):
            assign(part, new)
    elif state is not None:
        state[:] = value


def make_trainer(net, settings, steps_per_epoch, new_trainer=gluon.Trainer):
    """A trainer for `net` in which 1-D parameters get no weight decay and the others get settings.wd.

    `new_trainer(params, optimizer, optimizer_params)` builds it: gluon.Trainer for one process, or
    hvd.DistributedTrainer (e.g. `dist`'s `d.trainer`) for several; see the module docstring for the scaling.
    """
    for p in split_params(net)[1]:
        p.wd_mult = 0.0
    return new_trainer(net.collect_params(), make_optimizer(settings, steps_per_epoch), None)
