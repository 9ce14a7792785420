"""What training minimises and how: the smoothed loss, LARS (MXNet optimizers `lars` and `sgdwfastlars`),
the learning-rate schedule, and the trainer.

Gradient scaling (symbols/resnet-v1b-stats-fl.py and common/fit.py): the loss is a per-sample vector, so backward gives
gradients *summed* over the local batch, and `trainer.step(local_batch_size)` sets rescale_grad = 1/local_batch_size.
Across ranks, hvd.DistributedTrainer (Horovod 0.28) either sums and divides rescale_grad by the world size (Gloo, NCCL <
2.10: measured 1/(4 x 2) with 2 Gloo ranks of 4 images) or averages in the allreduce; both give the optimizer the
gradient of the mean loss over the global batch, as the reference's sum x 1/3264 does. With --batch-schedule an
update's m steps add their gradients up and `trainer.step(m x local_batch_size)` divides by the update's images.
"""
import functools
import typing
import warnings

import mxnet as mx
import numpy as np
from mxnet import gluon, nd

from . import fused_update, standin
from .model import BFLOAT16, is_layer_weight, is_low_precision, split_params
from .updates import Updates

# MXNet's multi-tensor SGD kernels take at most 60 tensors per call (PreloadedMultiSGDKernelParam::N; NVIDIA's
# LARSMultiSGDKernelParam::N, sneaxiy/NVIDIA-MxNet@ce30b18 src/operator/lars_multi_sgd-inl.h:156, unchecked there).
MAX_TENSORS_PER_CALL = 60


def momentum_kernels(operators=standin.operators):
    """(float32, multi-precision) multi-tensor momentum-SGD kernels taking per-tensor learning rates and weight decays
    as arrays, under this build's names (its operator registry): stock MXNet's preloaded_multi_*, or NVIDIA's
    lars_multi_* (the fork has those in their place: src/operator/lars_multi_sgd.cc:75, 184; python/mxnet/optimizer/
    optimizer.py:34-38; NVIDIA's v4.0 code on the 24.04 image calls them, common/optimizer.py:45-46)."""
    prefix = "preloaded_multi" if "preloaded_multi_sgd_mom_update" in operators() else "lars_multi"
    return getattr(nd, f"{prefix}_sgd_mom_update"), getattr(nd, f"{prefix}_mp_sgd_mom_update")


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
    """The training loss with the settings' label smoothing (0.1 in the reference), hybridized as the network is:
    one cached graph per step instead of eight operators pushed one by one from Python."""
    loss = SmoothedCrossEntropy(settings.label_smoothing)
    loss.hybridize(static_alloc=True, static_shape=True)
    return loss


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


def momentum_at(step, points, steps_per_epoch):
    """Momentum of update number `step` on the schedule `points` [(epoch, momentum), ...] (--mom-schedule): linear
    between the points and constant outside them, in the epochs `lr_at`'s steps count (step / steps per epoch)."""
    epochs, values = zip(*points)
    return float(np.interp(step / steps_per_epoch, epochs, values))


def schedule(settings, steps_per_epoch):
    """`lr_at` bound to the settings: a callable num_update -> lr, which MXNet optimizers take as lr_scheduler. With
    --batch-schedule an update of m steps takes m x lr_at at the steps done when it ends (updates.py)."""
    lr = functools.partial(lr_at, base_lr=settings.lr, end_lr=settings.end_lr,
                           warmup_steps=round(settings.warmup_epochs * steps_per_epoch),
                           total_steps=settings.num_epochs * steps_per_epoch)
    updates = Updates.of(settings, steps_per_epoch)
    return lr if updates is None else functools.partial(updates.scaled, lr)


class Masters:
    """Float32 master weights for low-precision weights under multi_precision, for LARS and SGD alike: the state of
    a float16 or bfloat16 tensor is (float32 momentum, float32 master), as MXNet's SGD makes it for float16.

    float16 goes through MXNet's multi-precision kernels, which update the master and write the weight rounded from
    it in one pass. Those kernels take no bfloat16: MXNet 1.9.1's preloaded_multi_mp_sgd_mom_update
    (src/operator/contrib/preloaded_multi_sgd-inl.h:313), multi_mp_sgd_mom_update and mp_sgd_mom_update
    (src/operator/optimizer_op-inl.h:367, :734) dispatch on MSHADOW_REAL_TYPE_SWITCH, which has no bfloat16 case
    (3rdparty/mshadow/mshadow/base.h:1238: "Unknown type enum 12"), as does multi_sum_sq (contrib/multi_sum_sq.cc:87).
    So a bfloat16 tensor takes the float32 update on its master, with its gradient cast to float32, and the weight is
    the master rounded to bfloat16 afterwards: the float16 kernels' arithmetic in float32, and the same rounding of
    the result into the weight (MXNet's Optimizer.update_multi_precision does so for float16, python/mxnet/optimizer/
    optimizer.py:298). A subclass names its update through MXNet's kernels `update_kernels`.

    On the CPU, float32 and bfloat16 tensors are updated by `fused` instead where the library is built (make_optimizer
    sets it): one pass per tensor computing what the path above computes, bit for bit (rn50_mx/fused_update). A
    subclass gives it its learning rates, weight decays and momenta in `fused_terms`."""

    fused = None  # fused_update.Kernel, or None: MXNet's kernels (use_fused sets it)

    def use_fused(self, kernel):
        """Update CPU tensors with `kernel` (a fused_update.Kernel), or with MXNet's kernels (None)."""
        self.fused, self.fused_groups = kernel, {}

    def __getstate__(self):
        """Pickled without the library (a handle of this process) and the arrays last updated; unpickled with the
        library again where it was on."""
        state = super().__getstate__()
        state["fused"], state["fused_groups"] = self.fused is not None, {}
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.fused = fused_update.load() if self.fused else None

    def create_state_multi_precision(self, index, weight):
        """(momentum, master) for a low-precision weight under multi_precision, else the momentum. A bfloat16 master
        is copied once the queue is empty: after an inference forward (the warm-up's eval) MXNet's oneDNN
        convolution leaves its weight in oneDNN's layout and a training pass reorders it in place while the engine
        counts that as a read, so a copy queued beside the backward reads it half-reordered (measured: "The size of
        NDArray doesn't match the requested MKLDNN memory desc", src/ndarray/ndarray.cc:693). States are made at the
        first update, a reset and a resume only."""
        if self.multi_precision and is_low_precision(weight.dtype):
            if weight.dtype == BFLOAT16:
                nd.waitall()
            master = weight.astype("float32")
            return (self.create_state(index, master), master)
        return super().create_state_multi_precision(index, weight)

    def update_multi_precision(self, index, weight, grad, state):
        listed = isinstance(index, (tuple, list))
        if self.fused is not None and self.update_fused(*((index, weight, grad, state) if listed else
                                                            ([index], [weight], [grad], [state]))):
            return
        if not (self.multi_precision and (weight[0] if listed else weight).dtype == BFLOAT16):
            return self.update_kernels(index, weight, grad, state)
        weights, grads, states = (weight, grad, state) if listed else ([weight], [grad], [state])

        def given(arrays):  # one tensor or a list, as the caller gave them
            return arrays if listed else arrays[0]

        masters = [s[1] for s in states]
        # amp_cast widens by oneDNN's reorder (src/operator/tensor/amp_cast.cc, AMPCastExCPU); with astype's Cast
        # the bfloat16 demo's epoch ran at 257 images/s against 438 (bench/against.py, side by side)
        wide = [nd.amp_cast(g, dtype="float32") for g in grads]
        self.update(index, given(masters), given(wide), given([s[0] for s in states]))
        for master, w in zip(masters, weights):
            nd.amp_cast(master, dtype=BFLOAT16, out=w)

    def update_fused(self, index, weights, grads, states):
        """The update of these tensors by `fused`, if it takes them (fused_update.prepared; no gradient clipping);
        False, having done nothing, if not."""
        low = weights[0].dtype == BFLOAT16
        if low and not self.multi_precision or self.clip_gradient:
            return False
        moms = [s[0] if low else s for s in states]
        masters = [s[1] if low else w for s, w in zip(states, weights)]
        sizes = fused_update.prepared(self.fused_groups, tuple(index), weights, grads, moms, masters)
        if sizes is None:
            return False
        self._update_count(index)
        terms = self.fused_terms(index, weights)
        self.fused.update(*[[arrays[k] for k in terms.order] for arrays in (weights, grads, moms, masters, sizes)],
                          terms.lars, terms.lrs, terms.wds, terms.momenta, eta=terms.eta, eps=terms.eps,
                          rescale=self.fused.param_float(self.rescale_grad))
        return True


class Terms(typing.NamedTuple):
    """A fused update's terms beside the arrays (see fused_update.Kernel.update), each float as MXNet's kernels read
    it: the tensors' order, and in it whether each takes LARS's trust ratio, its learning rate, weight decay and
    momentum; LARS's eta and eps."""
    order: list
    lars: list
    lrs: list
    wds: list
    momenta: list
    eta: float = 0.0
    eps: float = 0.0


class LARS(Masters, mx.optimizer.Optimizer):
    """Momentum SGD with a layer-wise trust ratio on conv and dense weights (sgdwfastlars optimizer,
    lars_multi_mp_sgd_mom_update, REF's LARS).

    For a layer weight w with rescaled gradient g = rescale_grad * grad and weight decay wd:
        lr_i = lr * eta*||w|| / (||g|| + wd*||w|| + eps)   if ||w|| > 0 and ||g|| > 0, else lr
        m = mom_i*m - lr_i*(wd*w + g);  w = w + m
    1-D tensors (`model.is_layer_weight` is False) take lr_i = lr; `make_trainer` sets their wd_mult. With
    multi_precision, float16 and bfloat16 tensors keep a float32 master copy and float32 momentum (Masters); norms
    are taken on the master copy and on the gradient as it is (see grad_sq_sum), a bfloat16 one cast to float32.

    correct_momentum (the submission's SGDwFASTLARS, common/fit.py of training_results_v1.0): layer weights
    take mom_i = momentum * lr_t / lr_{t-1} (1 at the first update). The submitted code scales the momentum of
    the first aggregated update call of each step, which with MXNET_OPTIMIZER_AGGREGATION_SIZE=54 and the
    float16 group first holds exactly the 54 layer weights; here it is tied to the layer weights, whatever the
    grouping. Without it (the TF reference's form) every tensor takes mom_i = momentum.

    Per step the learning rates and weight decays are computed on the device from arrays made once per group
    of tensors: no host-to-device copy (nd.array waits for the engine to take its write: a step-wide sync).
    """

    def __init__(self, momentum=0.9, eta=0.001, eps=0.0, correct_momentum=True, momentum_scheduler=None, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.momentum_scheduler = momentum_scheduler  # num_update -> momentum (--mom-schedule), or None
        self.eta = eta
        self.eps = eps
        self.correct_momentum = correct_momentum
        self.aggregate_num = MAX_TENSORS_PER_CALL  # make_optimizer sets the configured size
        self.groups = {}  # tuple of indices -> Group
        self.kernels = None  # momentum_kernels(), looked up at the first update

    def __getstate__(self):
        """Pickled without the groups: derived data whose arrays would unpickle onto the device they were saved
        from (another rank's GPU), rebuilt by `group` on the weights' device instead; nor the kernels, found again."""
        state = super().__getstate__()
        state["groups"], state["kernels"] = {}, None
        return state

    def create_state(self, index, weight):
        return nd.zeros(weight.shape, weight.context, dtype=weight.dtype)

    def update(self, index, weight, grad, state):
        self.update_kernels(index, weight, grad, state)

    def lr_of(self, num_update):
        return self.lr_scheduler(num_update) if self.lr_scheduler is not None else self.lr

    def momentum_of(self, num_update):
        """The momentum of update `num_update`: the schedule's, or the one momentum; a host float, no sync."""
        return self.momentum_scheduler(num_update) if self.momentum_scheduler is not None else self.momentum

    def layer_momentum(self):
        """The momentum of the layer weights at update num_update (see correct_momentum)."""
        t = self.num_update
        if not self.correct_momentum or t <= 1:
            return self.momentum_of(t)
        return self.momentum_of(t) * (self.lr_of(t) / self.lr_of(t - 1))

    def group(self, index, weight):
        """The Group of these tensors, made at their first update (the warm-up's)."""
        key = tuple(index)
        if key not in self.groups:
            mults = [self.param_dict[i].lr_mult if i in self.param_dict else 1.0 for i in index]
            self.groups[key] = Group(index, weight, mults, self._get_wds(index))
        return self.groups[key]

    def fused_terms(self, index, weight):
        """The Terms of these tensors' update by `fused`: those update_kernels gives MXNet's kernels."""
        g, f = self.group(index, weight), self.fused
        n, count = g.n_lars, len(g.order)
        layer, others = f.param_float(self.layer_momentum()), f.param_float(self.momentum_of(self.num_update))
        lrs = f.times_scalar(g.lr_mults_host, self.lr_of(self.num_update))  # as `g.lr_mults * lr` below
        return Terms(g.order, [k < n for k in range(count)], lrs, g.wds_host, [layer] * n + [others] * (count - n),
                     f.param_float(self.eta), f.param_float(self.eps))

    def update_kernels(self, index, weight, grad, state):
        """Update one tensor or a list of tensors of one dtype (gluon's Updater groups them so); bfloat16 ones come
        here as their float32 masters (Masters). At most aggregate_num tensors a kernel call: stock MXNet's Updater
        hands them so, NVIDIA's hands every tensor of a dtype at once (sneaxiy/NVIDIA-MxNet@ce30b18 python/mxnet/
        optimizer/optimizer.py:2208-2220) and its kernels hold 60."""
        if not isinstance(index, (tuple, list)):
            index, weight, grad, state = [index], [weight], [grad], [state]
        step = min(self.aggregate_num, MAX_TENSORS_PER_CALL)
        if len(index) > step:
            for start in range(0, len(index), step):
                piece = slice(start, start + step)
                self.update_kernels(index[piece], weight[piece], grad[piece], state[piece])
            return
        self._update_count(index)
        g = self.group(index, weight)
        lrs = g.lr_mults * self.lr_of(self.num_update)
        mixed = self.multi_precision and weight[0].dtype == np.float16
        states = [tuple(state[k]) if mixed else (state[k],) for k in g.order]
        n = g.n_lars
        if n:
            masters = [s[-1] if mixed else weight[k] for s, k in zip(states, g.order[:n])]
            w_sq = nd.multi_sum_sq(*masters, num_arrays=n)
            g_sq = grad_sq_sum([grad[k] for k in g.order[:n]])
            nd.multi_lars(lrs[:n], w_sq, g_sq, g.wds[:n], eta=self.eta, eps=self.eps,
                          rescale_grad=self.rescale_grad, out=lrs[:n])
        self.kernels = self.kernels or momentum_kernels()
        sgd_mom = self.kernels[mixed]
        others = self.momentum_of(self.num_update)
        for part, momentum in ((slice(0, n), self.layer_momentum()), (slice(n, None), others)):
            ks = g.order[part]
            if ks:
                inputs = [a for s, k in zip(states[part], ks) for a in (weight[k], grad[k]) + s]
                sgd_mom(*inputs, lrs[part], g.wds[part], out=[weight[k] for k in ks], num_weights=len(ks),
                        momentum=momentum, rescale_grad=self.rescale_grad)


class Group:
    """What one update call's tensors keep between steps: the order (layer weights first), their number, and
    on their device the lr multipliers (Gluon's Parameter.lr_mult: 1 here, so lr_mults * lr is float32(lr) as
nd.array([lr]) made it) and weight decays (float32), made once."""

    def __init__(self, index, weight, lr_mults, wds):
        self.order = sorted(range(len(index)), key=lambda k: not is_layer_weight(weight[k].shape))
        self.n_lars = sum(is_layer_weight(w.shape) for w in weight)
        ctx = weight[0].context
        self.lr_mults_host = np.array([lr_mults[k] for k in self.order], dtype=np.float32)
        self.wds_host = np.array([wds[k] for k in self.order], dtype=np.float32)
        self.lr_mults = nd.array(self.lr_mults_host, ctx=ctx, dtype="float32")
        self.wds = nd.array(self.wds_host, ctx=ctx, dtype="float32")


def grad_sq_sum(grads):
    """Sum of squares of each gradient, accumulated in float32.

    On the GPU, multi_sum_sq takes float16 as it is: its kernel squares and accumulates in float32 (MXNet
    src/operator/contrib/multi_sum_sq.cu, MultiSumSqKernel: `float val = 0`, `static_cast<float>(x[i])`).
    MXNet's CPU kernel (multi_sum_sq.cc, MultiSumSqCPUImpl) squares and sums float16 in float16 and loses small
    gradients, so on the CPU float16 is cast to float32 first."""
    if grads[0].dtype == np.float16 and grads[0].context.device_type == "cpu":
        grads = [g.astype("float32", copy=False) for g in grads]
    return nd.multi_sum_sq(*grads, num_arrays=len(grads))


class SGDwFastLARS(LARS):
    """The same optimizer under the reference's name (`--optimizer sgdwfastlars`, common/fit.py)."""


class SGD(Masters, mx.optimizer.SGD):
    """MXNet's momentum SGD, with float32 masters for bfloat16 weights too (Masters)."""

    update_kernels = mx.optimizer.SGD.update_multi_precision

    def fused_terms(self, index, weight):
        """The Terms of these tensors' update by `fused`: those _update_impl gives multi_sgd_mom_update."""
        f, count = self.fused, len(index)
        return Terms(list(range(count)), [False] * count, [f.tuple_float(lr) for lr in self._get_lrs(index)],
                     [f.tuple_float(wd) for wd in self._get_wds(index)], [f.param_float(self.momentum)] * count)


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # replacing MXNet's own `lars` is intended; MXNet warns about it
    mx.optimizer.register(LARS)
mx.optimizer.register(SGDwFastLARS)


def make_optimizer(settings, steps_per_epoch):
    """LARS or momentum SGD on the warmup + poly(2) schedule; fp32 master weights when training in float16 or
    bfloat16; on the CPU the fused update where its library is built (Masters)."""
    common = dict(momentum=settings.mom, wd=settings.wd, lr_scheduler=schedule(settings, steps_per_epoch),
                  multi_precision=settings.dtype != "float32")
    if settings.is_lars:
        points, updates = settings.momentum_points, Updates.of(settings, steps_per_epoch)
        scheduler = functools.partial(momentum_at, points=points, steps_per_epoch=steps_per_epoch) if points else None
        if scheduler and updates:  # the momentum of the steps done when the update ends, as the learning rate's
            scheduler = functools.partial(updates.timed, scheduler)
        optimizer = mx.optimizer.create(settings.optimizer, eta=settings.lars_eta, eps=settings.lars_eps,
                                        correct_momentum=settings.lars_form == "submitted",
                                        momentum_scheduler=scheduler, **common)
    else:
        optimizer = SGD(**common)
    # Tensors per multi-tensor update call. MXNet's own optimizers read MXNET_OPTIMIZER_AGGREGATION_SIZE from the
    # environment themselves; config.py reads it for every optimizer here, so the value in force is the one shown.
    optimizer.aggregate_num = settings.optimizer_aggregation_size
    if settings.device == "cpu":
        optimizer.use_fused(fused_update.load())
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


def is_fc_bias(name):
    """The submission's test for the one 1-D tensor it decays (its set_wd_mult: 'fc' and 'bias' in the name)."""
    return "fc" in name and "bias" in name


def make_trainer(net, settings, steps_per_epoch, new_trainer=gluon.Trainer):
    """A trainer for `net` in which 1-D parameters get no weight decay and the others get settings.wd; in the
    submission's LARS form fc1_bias gets it too (its set_wd_mult: every `*_weight` and the fc bias).

    `new_trainer(params, optimizer, optimizer_params)` builds it: gluon.Trainer for one process, or
    hvd.DistributedTrainer (e.g. `dist`'s `d.trainer`) for several; see the module docstring for the scaling.
    With --batch-schedule every gradient adds up over the steps of an update (grad_req 'add', set before the network
    first runs; `zero_sums` clears them after each update).
    """
    submitted = settings.is_lars and settings.lars_form == "submitted"
    layer_weights, others = split_params(net)
    for p in others:
        p.wd_mult = 1.0 if submitted and is_fc_bias(p.name) else 0.0
    if settings.batch_schedule:
        for p in layer_weights + others:
            p.grad_req = "add"
    return new_trainer(net.collect_params(), make_optimizer(settings, steps_per_epoch), None)


def zero_sums(trainer):
    """Every gradient of `trainer`'s parameters set to 0 (one reset call, queued after the update that read them):
    under --batch-schedule's grad_req 'add', after each update, so that the next one sums its own steps only."""
    grads = [p.list_grad()[0] for p in trainer._params if p.grad_req != "null"]
    kernel = [g for g in grads if g.dtype != BFLOAT16]  # reset_arrays takes no bfloat16 (reset_arrays-inl.h:82)
    nd.reset_arrays(*kernel, num_arrays=len(kernel))
    for g in grads:
        if g.dtype == BFLOAT16:
            g[:] = 0
