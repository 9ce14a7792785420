"""The open-division levers (docs/open-division.md): eval resolution and flip averaging, weight EMA, and their
honest record (refused in the closed division, logged, scored as open). Tiny: the three_classes set at 32x32."""
import os

import mxnet as mx
import numpy as np
import pytest

from rn50_mx import config, data, dist, model, train
from rn50_mx.config import Settings
from tests.support.procs import assert_one_line_naming, run_train

OPEN = dict(num_classes=3, image_shape="3,32,32", batch_size=4, dali_threads=1, min_random_area=1.0, seed=3,
            submission_division="open")


def open_settings(three_classes, **changes):
    return Settings(data_train=os.path.join(three_classes, "train.rec"),
                    data_val=os.path.join(three_classes, "val.rec"), **dict(OPEN, **changes))


# --- eval resolution and flip averaging ---------------------------------------------------------------------

def test_the_default_val_preprocessing_is_the_reference_s():
    """256 -> 224 at any size, as before the levers: 37 for a 32 crop, 256 for 224."""
    assert Settings(image_shape="3,32,32").val_resize_side == 37 == round(256 * 32 / 224)
    assert Settings().val_resize_side == 256 and Settings().eval_chw == (3, 224, 224)
    s = Settings(image_shape="3,176,176", val_crop=224, val_resize=232, submission_division="open")
    assert s.eval_chw == (3, 224, 224) and s.val_resize_side == 232  # MosaicML's train 176, eval 232/224


def expected_top1(net_like, s, batches, flip):
    """Top-1 of the same weights in a fresh imperative network, each batch through it separately (and its mirror,
    summing the softmax), in NumPy."""
    fresh = model.build_model(s, mx.cpu())
    for p, q in zip(fresh.collect_params().values(), net_like.collect_params().values()):
        p.set_data(q.data().copy())
    right = total = 0
    for x, label, valid in batches:
        logits = fresh(x).asnumpy()
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        if flip:
            mirrored = fresh(mx.nd.array(x.asnumpy()[:, :, :, ::-1])).asnumpy()
            other = np.exp(mirrored - mirrored.max(1, keepdims=True))
            probs = probs + other / other.sum(1, keepdims=True)
        right += int((probs.argmax(1)[:valid] == label.asnumpy()[:valid]).sum())
        total += valid
    return right / total


@pytest.mark.parametrize("flip", [False, True])
def test_an_eval_at_another_size_than_training_counts_what_a_fresh_network_gives(three_classes, flip):
    """The hybridized, static-shape network trains at 32, is evaluated at 64 (and with the mirror), then trains at 32
    again; the eval's top-1 equals a fresh network's on the same weights and batches."""
    s = open_settings(three_classes, val_crop=64, eval_flip=flip)
    ctx = mx.cpu()
    train_it, val_it = data.make_iters(s, 0, 1, 1, ctx)
    net, loss_fn, trainer = train.parts(s, ctx, train_it.steps_per_epoch, mx.gluon.Trainer)
    train.warm_up(net, loss_fn, trainer, s, ctx)
    train_it.reset()
    for batch in train_it:
        train.train_step(net, loss_fn, trainer, batch)
    assert val_it.provide_data[0].shape == (4, 3, 64, 64)
    top1, _, images = train.accuracy(net, val_it, dist.Single(), train.flip_axis(s))
    val_it.reset()
    batches = [(b.data[0].copy(), b.label[0].copy(), 4 - b.pad) for b in val_it]
    assert batches[0][0].shape == (4, 3, 64, 64) and images == 12
    assert top1 == expected_top1(net, s, batches, flip)
    train_it.reset()
    loss = train.train_step(net, loss_fn, trainer, next(iter(train_it)))  # back at the training size
    assert np.isfinite(loss.asscalar())


def test_the_mirror_is_the_width_axis_of_each_layout():
    assert train.flip_axis(Settings(eval_flip=True, submission_division="open")) == 3
    assert train.flip_axis(Settings(eval_flip=True, submission_division="open", input_layout="NHWC",
                                    device="gpu")) == 2
    assert train.flip_axis(Settings()) is None


@pytest.mark.parametrize("env,name", [
    ({"RN50_VAL_CROP": "16"}, "RN50_VAL_CROP"),
    ({"RN50_VAL_CROP": "-1"}, "RN50_VAL_CROP"),
    ({"RN50_VAL_CROP": "4097"}, "RN50_VAL_CROP"),
    ({"RN50_VAL_CROP": "x"}, "RN50_VAL_CROP"),
    ({"RN50_EVAL_FLIP": "maybe"}, "RN50_EVAL_FLIP"),
    ({"VAL_RESIZE": "0"}, "VAL_RESIZE"),
])
def test_bad_eval_lever_values_are_one_line(env, name):
    with pytest.raises(config.SettingsError, match=name):
        config.load([], dict(env, SUBMISSION_DIVISION="open"))


@pytest.mark.parametrize("env,name", [
    ({"RN50_VAL_CROP": "64"}, "RN50_VAL_CROP"),
    ({"RN50_EVAL_FLIP": "1"}, "RN50_EVAL_FLIP"),
    ({"VAL_RESIZE": "232"}, "VAL_RESIZE"),
])
def test_a_lever_in_the_closed_division_is_refused(env, name):
    with pytest.raises(config.SettingsError, match=f"^{name}=.*open-division lever.*SUBMISSION_DIVISION=open "):
        config.load([], env)
    assert config.open_levers(config.load([], dict(env, SUBMISSION_DIVISION="open")))
    assert config.open_levers(config.load([], {})) == {}


def test_train_refuses_a_closed_lever_in_one_line():
    assert_one_line_naming(run_train(["--eval-flip", "1"]), "--eval-flip")
