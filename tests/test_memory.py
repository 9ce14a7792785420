"""The memory statement (rn50_mx.memory) against the arrays a real trainer holds, on the CPU."""
import dataclasses

import mxnet as mx
import numpy as np
import pytest

from tests.support.bfloat16 import needs_bfloat16
from tests.support.procs import sourced
from rn50_mx import memory, model, optim
from rn50_mx.config import Settings


def nbytes(array):
    return array.size * np.dtype(array.dtype).itemsize


def held(trainer, net):
    """Bytes of every parameter, every gradient and every optimizer state the trainer holds."""
    params = list(net.collect_params().values())
    total = sum(nbytes(p.data()) for p in params) + sum(nbytes(p.grad()) for p in params if p.grad_req != "null")
    for updater in trainer._updaters:
        for state in updater.states.values():
            total += sum(nbytes(a) for a in (state if isinstance(state, (tuple, list)) else (state,)))
    return total


@pytest.mark.parametrize("dtype", ["float32", "float16", pytest.param("bfloat16", marks=needs_bfloat16)])
def test_weights_are_what_the_trainer_holds_after_a_step(dtype):
    """Parameters, gradients and LARS's states (float16 and bfloat16: float32 momentum and master copy besides the
    low-precision weight; BatchNorm's float32 tensors keep float32 momentum) summed from the real arrays after one
    step."""
    s = dataclasses.replace(Settings(num_classes=10, image_shape="3,32,32", batch_size=2), dtype=dtype)
    net = model.build_model(s, mx.cpu())
    trainer = optim.make_trainer(net, s, steps_per_epoch=1)
    trainable = [p.data() for p in net.collect_params().values() if p.grad_req != "null"]
    with mx.autograd.record():  # a gradient for every tensor without the network's float16 GEMMs (none on the CPU)
        total = mx.nd.add_n(*[w.astype("float32").sum() for w in trainable])
    total.backward()
    trainer.step(2)
    mx.nd.waitall()
    assert memory.weight_bytes(net) == held(trainer, net)


def test_activations_grow_with_the_batch_and_the_dtype():
    """From the symbol's inferred shapes: twice the batch, twice the bytes; float16 half of float32."""
    s = Settings(num_classes=10, image_shape="3,32,32", batch_size=2)
    net = model.build_model(s, mx.cpu())
    small = memory.activation_bytes(net, s)
    assert memory.activation_bytes(net, s.replace(batch_size=4)) == 2 * small
    half = dataclasses.replace(s, dtype="float16")
    assert memory.activation_bytes(model.build_model(half), half) == small // 2
    # the stem alone: conv0 (64 x 16 x 16), bn0 and relu outputs of that shape, pool0 (64 x 8 x 8), per image
    assert small > 2 * 4 * (3 * 64 * 16 * 16 + 64 * 8 * 8)


def test_the_words_say_when_it_does_not_fit():
    need = memory.Need(input=5 << 30, weights=1 << 30, activations=30 << 30)
    assert memory.words(need, 80 << 30, "A100-80GB").endswith("of the A100-80GB's 80.0 GiB: 45% of it")
    assert memory.words(need, 32 << 30, "V100-32GB").endswith("of the V100-32GB's 32.0 GiB: does not fit, lower "
                                                             "the batch")
    assert memory.words(need).startswith("36.0 GiB per process: input 5.00, weights, gradients and optimizer states "
                                         "1.00, activations 30.0 (estimate)")


def test_the_nf5688m6_figure_the_docs_give():
    """docs/recipes.md, "Memory per GPU": 408 images of 4x224x224 float16 a GPU, DALI's queue 15."""
    result = sourced("NF5688M6", "python -c 'from rn50_mx import config, memory; "
                                 "print(memory.words(memory.need(config.load([]))))'")
    assert result.stdout.strip() == "34.0 GiB per process: input 5.19, weights, gradients and optimizer states 0.29, " \
                                    "activations 28.5 (estimate)", result.stderr


def test_a_need_close_to_the_gpu_s_memory_says_what_is_not_counted():
    """GPU review 3, F6: the estimate leaves out the CUDA context, cuDNN's workspace (1 GiB by default per
    convolution), NCCL's and DALI's buffers, so a need at 95% of the GPU is no comfortable fit."""
    need = memory.Need(0, 0, 76 << 30)
    assert memory.words(need, 80 << 30, "A100-80GB").endswith(
        "95% of it, close to the limit: the CUDA context, cuDNN's workspace, NCCL's and DALI's buffers are not counted "
        "(lower the batch if it runs out of memory)")
    assert memory.words(memory.Need(0, 0, 60 << 30), 80 << 30).endswith(": 75% of it")
