"""Device placement and the warm-up, on the CPU, as the GPU path needs them.

A CUDA build of MXNet refuses an operator whose inputs live on different device types ("require all inputs live
on the same context", src/imperative/imperative_utils.h); on the CPU every array is on cpu(0), so a stray array
made without a context (the bug that crashed every GPU trial at its first eval) goes unseen. `strict_contexts`
makes this MXNet refuse a mix of cpu(0) and cpu(1) the same way, and the step, the warm-up and the eval then run
on cpu(1): any array they make on the default context meets the others in some operator and fails there.
"""
import dataclasses
import os
import re

import mxnet as mx
import numpy as np
import pytest
from mxnet.ndarray import register

from rn50_mx import data, dist, train
from rn50_mx.config import Settings
from rn50_mx.rehearse.stages import same_bits
from tests.support import devices
from tests.support.bfloat16 import needs_bfloat16, to_np
from tests.support.devices import RUN_CONTEXT
from tests.support.nets import snapshot, trained_parts
from tests.support.settings import small_settings


@pytest.fixture
def strict_contexts(monkeypatch):
    """Operators refuse inputs (and outputs) that live on different contexts, device id included (support.devices)."""
    monkeypatch.setattr(register, "_verify_all_legacy_ndarrays",
                        devices.same_context_check(register._verify_all_legacy_ndarrays))


def test_strict_contexts_refuse_a_mix(strict_contexts):
    with pytest.raises(mx.MXNetError, match="same context"):
        mx.nd.concat(mx.nd.ones(1, ctx=RUN_CONTEXT), mx.nd.ones(1), dim=0)
    mx.nd.concat(mx.nd.ones(1, ctx=RUN_CONTEXT), mx.nd.ones(1, ctx=RUN_CONTEXT), dim=0).wait_to_read()


def test_the_stand_in_refuses_to_save_a_device_s_arrays(tmp_path, monkeypatch):
    """GPU review 3, F2: a GPU build's mx.nd.load puts an array back on the device it was saved from, in every rank
    that loads it; this CPU build loads a cpu(1) array onto cpu(0), so only the save can show it: the stand-in
    (devices.install, as every --standin process runs) refuses it, naming the device, and saves a host copy."""
    path = str(tmp_path / "arrays")
    mx.nd.save(path, {"w": mx.nd.ones(2, ctx=RUN_CONTEXT)})
    assert mx.nd.load(path)["w"].context == mx.cpu(0)  # the device id is lost on the CPU
    monkeypatch.setattr(mx.nd, "save", mx.nd.save)
    monkeypatch.setattr(register, "_verify_all_legacy_ndarrays", register._verify_all_legacy_ndarrays)
    devices.install()
    wrapped = mx.nd.save
    devices.install()
    assert mx.nd.save is wrapped  # once
    for arrays in ({"w": mx.nd.ones(2, ctx=RUN_CONTEXT)}, [mx.nd.ones(2), mx.nd.ones(2, ctx=RUN_CONTEXT)],
                   mx.nd.ones(2, ctx=RUN_CONTEXT)):
        with pytest.raises(mx.MXNetError, match=re.escape(f"{path}: arrays saved from the stand-in device cpu(1)")):
            mx.nd.save(path, arrays)
    mx.nd.save(path, {"w": mx.nd.ones(2, ctx=RUN_CONTEXT).as_in_context(dist.HOST)})
    assert mx.nd.load(path)["w"].asnumpy().tolist() == [1, 1]


def run_settings(rec_prefix, **changes):
    """small_settings with a val set, batch 8 and a 2-epoch schedule: a run's parts."""
    return small_settings(rec_prefix, **{"data_val": rec_prefix + ".rec", "batch_size": 8, "num_epochs": 2,
                                         "warmup_epochs": 1, "seed": 3, **changes})


@pytest.mark.slow
def test_step_warm_up_and_eval_make_every_array_on_the_run_context(small_rec, strict_contexts):
    """Fails on the old train.evaluate, whose mx.nd.full(1, valid) lived on cpu(0)."""
    s = run_settings(small_rec)
    net, loss_fn, trainer = trained_parts(s, RUN_CONTEXT)
    train_it, val_it = data.make_iters(s, 0, 1, 3, RUN_CONTEXT)
    train.warm_up(net, loss_fn, trainer, s, RUN_CONTEXT)
    loss = train.train_step(net, loss_fn, trainer, next(iter(train_it)))
    assert loss.context == RUN_CONTEXT
    top1, top5, images = train.evaluate(net, val_it, dist.Single(), 0)
    assert images == 21 and 0 <= top1 <= top5 <= 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_bfloat16)])
def test_warm_up_leaves_no_trace_on_the_run(small_rec, dtype):
    """After the warm-up the weights, BatchNorm statistics, update count and optimizer states are as before (the
    old warm-up's training forward moved the running statistics), the states are already allocated, and two
    real steps then give the same weights as two steps without a warm-up. In bfloat16 the state of a bfloat16 weight
    is zero momentum and a float32 master equal to the weight."""
    s = run_settings(small_rec, dtype=dtype)
    ctx = mx.cpu()
    batches = [b for b, _ in zip(data.make_iters(s, 0, 1, 3, ctx)[0], range(2))]
    runs = {}
    for warmed in (False, True):
        net, loss_fn, trainer = trained_parts(s, ctx)
        before = snapshot(net)
        if warmed:
            train.warm_up(net, loss_fn, trainer, s, ctx)
            after = snapshot(net)
            assert all(same_bits(before[k], after[k]) for k in before), \
                [k for k in before if not same_bits(before[k], after[k])]
            assert trainer._optimizer.num_update == 0 and trainer.learning_rate == 0
            states = trainer._updaters[0].states
            assert len(states) == 161
            for index, state in states.items():
                mom, master = state if isinstance(state, tuple) else (state, None)
                assert not mom.asnumpy().any()
                if master is not None:
                    assert np.array_equal(master.asnumpy(), to_np(trainer._params[index].data()))
        for batch in batches:
            train.train_step(net, loss_fn, trainer, batch)
        assert trainer._optimizer.num_update == 2
        runs[warmed] = snapshot(net)
    for name, value in runs[False].items():
        np.testing.assert_allclose(runs[True][name], value, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("changes, runs", [({"device": "cpu"}, 1), ({"device": "gpu"}, 2),
                                           ({"device": "gpu", "standin": "gpu"}, 1)], ids=["cpu", "gpu", "stand-in"])
def test_warm_up_ends_with_the_training_graph(small_rec, changes, runs):
    """A static_alloc block re-initialises its graph whenever `recording` differs from its last run (MXNet
    cached_op.cc StaticForward): the warm-up's last forward must be a training one, for the network and the loss
    (hybridized with it), or the first timed step pays the re-initialisation (and on the GPU re-captures its
    CUDA graphs at step 2). Each graph runs twice for a GPU config (its CUDA graphs are captured on the second run),
    once on the CPU and on the rehearsal's stand-in GPU build, which captures none (the settings' counts, run here on
    the CPU)."""
    s = run_settings(small_rec)
    net, loss_fn, trainer = trained_parts(s, mx.cpu())
    recording = {"net": [], "loss": []}
    net.register_forward_hook(lambda *_: recording["net"].append(mx.autograd.is_recording()))
    loss_fn.register_forward_hook(lambda *_: recording["loss"].append(mx.autograd.is_recording()))
    train.warm_up(net, loss_fn, trainer, dataclasses.replace(s, **changes), mx.cpu())  # only the runs' count
    assert recording["net"] == [False] * runs + [True] * runs and recording["loss"] == [True] * runs


def test_the_run_context_comes_from_the_device_setting(monkeypatch):
    """On the GPU the rank's device also becomes the thread's current CUDA device (DALI's calls without a device
    would otherwise use GPU 0 from every rank)."""
    made_current = []
    monkeypatch.setattr(dist, "use_device", made_current.append)
    assert dist.context(Settings(), 3) == mx.cpu() and made_current == []
    gpu = Settings(device="gpu", input_layout="NHWC", dtype="float16")
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 8)  # the answer of a node with 8 visible GPUs
    assert dist.context(gpu, 3) == mx.gpu(3) and made_current == [3]
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 1)  # Slurm gave the task one GPU: it is GPU 0 to it
    assert dist.context(gpu, 3) == mx.gpu(0) and made_current == [3, 0]


def test_making_a_device_current_reaches_cuda():
    """On this machine without a GPU, cudaSetDevice itself refuses: the call is made, through DALI's runtime."""
    with pytest.raises(RuntimeError, match="CUDA"):
        dist.use_device(0)


def arrays_in(thing, depth=0):
    """Every NDArray reachable from `thing` through containers and object attributes (a few levels deep)."""
    if isinstance(thing, mx.nd.NDArray):
        return [thing]
    if depth > 4 or isinstance(thing, (str, bytes, int, float, type(None))):
        return []
    if isinstance(thing, dict):
        items = list(thing.values())
    elif isinstance(thing, (list, tuple, set)):
        items = list(thing)
    else:
        items = list(getattr(thing, "__dict__", {}).values())
    return [a for item in items for a in arrays_in(item, depth + 1)]


@pytest.mark.slow
def test_a_checkpoint_is_saved_from_the_host_and_resumes_on_the_rank_s_device(small_rec, strict_contexts, tmp_path,
                                                                             monkeypatch):
    """GPU review 3, F1 and F2, with cpu(1) standing in for rank r's gpu(r): every array handed to mx.nd.save is a
    host copy (a device array loads back onto the device it was saved from: GPU 0 for every rank), and after a
    restore and a step every array the trainer holds, the optimizer's per-group arrays included, is on the rank's
    device (the old pickled optimizer brought its LARS groups back on cpu(0): the step then mixed devices, an
    illegal memory access on 8 GPUs); the resumed step is bit-identical to the uninterrupted one."""
    from rn50_mx import checkpoint

    s = run_settings(small_rec, checkpoint_dir=str(tmp_path / "ckpt"))
    train_it, val_it = data.make_iters(s, 0, 1, 3, RUN_CONTEXT)[:2]
    saved, save = [], mx.nd.save
    monkeypatch.setattr(mx.nd, "save", lambda fname, arrays: (saved.extend(arrays.values()), save(fname, arrays))[1])
    runs = []
    for resumed in (False, True):
        net, loss_fn, trainer = trained_parts(s, RUN_CONTEXT)
        train.warm_up(net, loss_fn, trainer, s, RUN_CONTEXT)
        folder = checkpoint.Checkpoints(s, dist.Single())
        folder.attach(net, trainer, {"train": train_it, "val": val_it}, 2, 3)  # as a run's checkpoint holds them
        if resumed:  # the reader back at the checkpoint's step (a checkpoint whose reader is elsewhere is refused)
            assert folder.restore() == checkpoint.Position(step=1)
        else:
            train.train_step(net, loss_fn, trainer, next(train_it))
            folder.save(checkpoint.Position(step=1))
        train.train_step(net, loss_fn, trainer, next(train_it))
        mx.nd.waitall()
        os.close(folder.lock)
        held = arrays_in(trainer._optimizer) + arrays_in(trainer._updaters[0].states)
        assert held and {a.context for a in held} == {RUN_CONTEXT}
        runs.append(snapshot(net))
    assert saved and {a.context for a in saved} == {dist.HOST}
    assert all(same_bits(runs[0][k], runs[1][k]) for k in runs[0])


def hand_step(trainer, grads):
    """One step of `trainer` on gradients set by hand: each parameter's is d/dw sum(w * g) = g (on the CPU a float16
    layer has no forward kernel; an elementwise product has)."""
    for param, grad in zip(trainer._params, grads):
        with mx.autograd.record():
            product = param.data() * mx.nd.array(grad, ctx=RUN_CONTEXT, dtype="float16")
        product.backward()
    trainer.step(1)


def test_a_float16_sgd_state_without_momentum_round_trips_through_the_trainer_file(strict_contexts, tmp_path):
    """GPU review 4, F3: `OPTIMIZER=sgd MOM=0 DTYPE=float16` keeps (None, float32 master) states (MXNet's SGD under
    multi_precision, optimizer.py:583-600), and the old trainer file called as_in_context on the None at the first
    checkpoint. Float16 weights on cpu(1): save after a step, restore into a fresh trainer on the saved weights (as
    the params file gives them back), one more step: weights and masters bit for bit the uninterrupted run's."""
    from rn50_mx import optim
    from rn50_mx.checkpoint import contents, trainer_file

    rng = np.random.RandomState(0)
    shapes = [(4, 3, 3, 3), (4,)]
    start = [rng.standard_normal(shape).astype("float16") for shape in shapes]
    grads = [[rng.standard_normal(shape).astype("float16") for shape in shapes] for _ in range(2)]
    s = Settings(optimizer="sgd", mom=0.0, dtype="float16", lr=0.5, warmup_epochs=0, num_epochs=2)

    def trainer_on(values):
        params = mx.gluon.ParameterDict()
        for i, value in enumerate(values):
            params.get(f"p{i}_weight", shape=value.shape, dtype="float16").initialize(ctx=RUN_CONTEXT)
        for param, value in zip(params.values(), values):
            param.set_data(mx.nd.array(value, ctx=RUN_CONTEXT, dtype="float16"))
        return mx.gluon.Trainer(params, optim.make_optimizer(s, 10), kvstore=None)

    def held(trainer):
        return [p.data().asnumpy() for p in trainer._params] + [state[1].asnumpy()
                                                                 for state in trainer._updaters[0].states.values()]

    whole = trainer_on(start)
    hand_step(whole, grads[0])
    assert [state[0] for state in whole._updaters[0].states.values()] == [None, None]
    trainer_file.save(whole, str(tmp_path))
    contents.check_trainer(str(tmp_path), [(shape, np.dtype("float16")) for shape in shapes])
    resumed = trainer_on([p.data().asnumpy() for p in whole._params])
    trainer_file.restore(resumed, str(tmp_path))
    for trainer in (whole, resumed):
        hand_step(trainer, grads[1])
    assert [state[0] for state in resumed._updaters[0].states.values()] == [None, None]
    assert resumed._optimizer.num_update == whole._optimizer.num_update == 2
    assert all(same_bits(a, b) for a, b in zip(held(resumed), held(whole)))


def test_float32_averages_reach_float16_weights_on_the_device(strict_contexts):
    """A CUDA build copies between devices only within one type (ndarray_function.cu, Copy<cpu, gpu>), and the strict
    check refuses the same here. A checkpoint with a weight EMA holds float32 averages for float16 weights: evaluate
    --checkpoint-dir sets them through set_data, which moves an array in its own type and casts it on the device."""
    from rn50_mx import checkpoint

    net = mx.gluon.nn.Dense(2, in_units=3, dtype="float16")
    net.initialize(ctx=RUN_CONTEXT)
    averages = {name: mx.nd.ones(p.shape, dtype="float32") for name, p in net.collect_params().items()}
    with pytest.raises(mx.MXNetError, match="same data type when copying across devices"):
        averages[net.weight.name].copyto(net.weight.data())
    checkpoint.set_params(net, averages, "ckpt")
    assert all(p.data().dtype == np.float16 and p.data().context == RUN_CONTEXT and p.data().asnumpy().min() == 1
               for p in net.collect_params().values())
