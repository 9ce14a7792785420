"""Progressive resizing (docs/open-division.md): the training crop side follows a schedule over epochs, applied by
the same DALI graph (a per-batch size) and taken by the hybridized network at each size. Tiny: the three_classes set
(24 images at 32x32) read at 32 -> 48 -> 64 px."""
import os
import signal

import mxnet as mx
import pytest

from rn50_mx import check, checkpoint, config, data, train
from rn50_mx.errors import InputError
from rn50_mx.rehearse.stages import same_bits
from tests.support import runs
from tests.support.mllog import events, values
from tests.support.procs import wait_for
from tests.support.nets import snapshot, trained_parts
from tests.support.settings import open_settings

RAMP = dict(image_shape="3,64,64", prog_start_side=32, prog_start_epoch=0, prog_end_epoch=2, prog_step=16,
            num_epochs=3, warmup_epochs=0, eval_offset=0)


def test_the_schedule_ramps_linearly_and_rounds_down_to_the_step():
    s = config.Settings(image_shape="3,224,224", prog_start_side=160, prog_start_epoch=2, prog_end_epoch=12,
                        prog_step=32, submission_division="open", num_epochs=16)
    assert [s.train_hw(e)[0] for e in range(14)] == [160] * 7 + [192] * 5 + [224] * 2  # FFCV: 192 from epoch 5
    assert s.train_sizes == [(160, 160), (192, 192), (224, 224)]
    assert config.Settings().train_sizes == [(224, 224)]


def epoch_shapes(it, epochs):
    """Per epoch, the set of (H, W) of its batches (each batch's provide_data says its own shape)."""
    shapes = []
    for _ in range(epochs):
        it.reset()
        batches = list(it)
        assert all(b.provide_data[0].shape == b.data[0].shape for b in batches)
        shapes.append({tuple(b.data[0].shape[2:]) for b in batches})
    return shapes


@pytest.mark.parametrize("antialias", [True, False])  # fn.resize, or the scaling warp
def test_the_batches_of_each_epoch_have_the_schedule_s_size(three_classes, antialias):
    s = open_settings(three_classes, dali_resize_antialias=antialias, **RAMP)
    it, _ = data.make_iters(s, 0, 1, 3, mx.cpu())
    assert epoch_shapes(it, 3) == [{(32, 32)}, {(48, 48)}, {(64, 64)}]


def test_the_warm_up_trains_at_every_size_the_first_epoch_s_last_and_leaves_the_model_as_it_was(three_classes):
    """Each size of the schedule gets its warm-up steps (one on the CPU, train.warm_up_runs) before run_start (then
    the first timed step finds the static graph at its own shape), and the weights, statistics and optimizer states
    are put back."""
    s = open_settings(three_classes, **RAMP)
    net, loss_fn, trainer = trained_parts(s, mx.cpu())
    before = snapshot(net)
    seen = []
    net.register_forward_pre_hook(lambda _, inputs: seen.append((inputs[0].shape[2:], mx.autograd.is_recording())))
    train.warm_up(net, loss_fn, trainer, s, mx.cpu())
    runs = train.warm_up_runs(s)
    assert runs == 1 and seen == [((64, 64), False)] * runs + [((64, 64), True)] * runs + [
        ((48, 48), True)] * runs + [((32, 32), True)] * runs
    after = snapshot(net)
    assert [k for k in before if not same_bits(before[k], after[k])] == []
    assert trainer._optimizer.num_update == 0


@pytest.mark.parametrize("env,name", [
    ({"RN50_PROG_START_SIDE": "64"}, "RN50_PROG_START_SIDE"),  # start > end (IMAGE_SHAPE 3,48,48)
    ({"RN50_PROG_START_SIDE": "8", "RN50_PROG_STEP": "8"}, "RN50_PROG_START_SIDE"),  # below 16
    ({"RN50_PROG_START_SIDE": "40", "RN50_PROG_STEP": "16"}, "RN50_PROG_STEP"),  # step does not divide the start
    ({"RN50_PROG_START_SIDE": "32", "RN50_PROG_STEP": "32"}, "RN50_PROG_STEP"),  # nor H,W
    ({"RN50_PROG_START_SIDE": "32", "RN50_PROG_STEP": "16", "RN50_PROG_START_EPOCH": "3",
      "RN50_PROG_END_EPOCH": "2"}, "RN50_PROG_END_EPOCH"),
    ({"RN50_PROG_START_SIDE": "32", "RN50_PROG_STEP": "0"}, "RN50_PROG_STEP"),
    ({"RN50_PROG_START_SIDE": "32", "RN50_PROG_STEP": "16", "DALI_ROI_DECODE": "0"}, "RN50_PROG_START_SIDE"),
    ({"RN50_PROG_START_SIDE": "32", "RN50_PROG_STEP": "16", "SYNTHETIC": "1"}, "RN50_PROG_START_SIDE"),
    ({"RN50_PROG_START_SIDE": "32", "RN50_PROG_STEP": "16", "DTYPE": "float16", "INPUT_LAYOUT": "NHWC",
      "DEVICE": "gpu"}, "RN50_PROG_START_SIDE"),  # NormConv counts one H,W
])
def test_bad_progressive_values_are_one_line(env, name):
    with pytest.raises(config.SettingsError, match=f"^{name}=") as error:
        config.load([], dict(env, IMAGE_SHAPE="3,48,48", SUBMISSION_DIVISION="open"))
    assert "\n" not in str(error.value)


def test_progressive_resizing_is_an_open_lever_logged_and_listed(capsys):
    with pytest.raises(config.SettingsError, match="^RN50_PROG_START_SIDE=160: an open-division lever"):
        config.load([], {"RN50_PROG_START_SIDE": "160"})
    s = config.load([], {"RN50_PROG_START_SIDE": "160", "RN50_PROG_END_EPOCH": "13", "SUBMISSION_DIVISION": "open"})
    assert config.open_levers(s) == dict(prog_start_side=160, prog_start_epoch=0, prog_end_epoch=13, prog_step=32)
    check.main(["--submission-division", "open", "--prog-start-side", "160", "--prog-end-epoch", "13"])
    assert ("open-division levers: --prog-start-side 160, --prog-start-epoch 0, --prog-end-epoch 13, --prog-step 32"
            in capsys.readouterr().out)


def test_the_input_memory_counts_a_buffer_ring_per_size():
    s = config.Settings(image_shape="3,64,64", prog_start_side=32, prog_end_epoch=2, prog_step=16,
                        submission_division="open")
    plain = s.replace(prog_start_side=0, submission_division="closed")
    per_image = {side: 3 * side * side * 4 + 4 for side in (32, 48, 64)}
    assert data.input_memory(s, val=False) - data.input_memory(plain, val=False) == \
        data.RING * s.batch_size * (per_image[32] + per_image[48])


def test_the_gpu_hand_over_copies_each_size_into_its_own_buffers(three_classes):
    """The GPU path's copy (copy_to_external into persistent MXNet buffers), run on the CPU: each epoch's batch lands
    in a buffer of its own shape, equal to what the zero-copy path gives."""
    s = open_settings(three_classes, **RAMP)
    copied, shared = data.make_iters(s, 0, 1, 3, mx.cpu())[0], data.make_iters(s, 0, 1, 3, mx.cpu())[0]
    copied.handover = data.Handover(s, mx.cpu(), copy=True)
    assert sorted(shape[2:] for shape in copied.handover.rings) == [(32, 32), (48, 48), (64, 64)]
    for _ in range(3):
        copied.reset(), shared.reset()
        for ours, theirs in zip(copied, shared):
            assert same_bits(ours.data[0].asnumpy(), theirs.data[0].asnumpy())
    fresh = data.make_iters(s, 0, 1, 3, mx.cpu())[0]  # its first epoch at 32, buffers of 64 only
    fresh.handover = data.Handover(s.replace(prog_start_side=0, submission_division="closed"), mx.cpu(), copy=True)
    with pytest.raises(InputError, match=r"\(3, 32, 32\), float32\) do not fit the \(4, 3, 64, 64\) float32 buffer"):
        next(fresh)


def test_a_run_stopped_mid_ramp_resumes_with_the_same_sizes_bit_identical(three_classes, tmp_path):
    """SIGTERM in epoch 1 of 2 (at 48 px of a 32 -> 64 ramp): the resumed run's pipeline, restored from DALI's
    checkpoint, counts its batches on from the saved one, so its sizes and so its evals and final weights equal the
    uninterrupted run's bit for bit; the log names the lever's values; the saved model, trained at two sizes,
    evaluates fresh at the eval size to the run's last logged top-1."""
    recs = os.path.join(three_classes, "train.rec"), os.path.join(three_classes, "val.rec")
    lever = dict(image_shape="3,64,64", prog_start_side=32, prog_end_epoch=2, prog_step=16, submission_division="open")
    log = str(tmp_path / "whole.log")
    reference = runs.run(recs, 1, tmp_path / "whole.txt", save_model=tmp_path / "whole", mllog_file=log, **lever)
    assert values(events(log), "prog_start_side") == [32] and values(events(log), "prog_step") == [16]
    scored = runs.evaluate(recs, 1, "--model", str(tmp_path / "whole"), **lever)
    assert f"top-1 {values(events(log), 'eval_accuracy')[-1]!r}, " in scored.stdout, scored.stderr[-2000:]
    folder, out = str(tmp_path / "ckpt"), tmp_path / "stopped.txt"
    proc = runs.start(recs, 1, out, checkpoint_dir=folder, **lever)
    wait_for(proc, out, rf"epoch 1 step 1/{runs.STEPS}")
    proc.send_signal(signal.SIGTERM)
    runs.finish(proc, out, code=checkpoint.RESUMABLE_EXIT)
    text = runs.run(recs, 1, tmp_path / "resumed.txt", checkpoint_dir=folder, save_model=tmp_path / "resumed", **lever)
    runs.assert_same_params(str(tmp_path / "resumed"), str(tmp_path / "whole"))
    ours, theirs = runs.epoch_lines(text), runs.epoch_lines(reference)
    assert ours[2] == theirs[2] and "top-1" in ours[2]
    # the same stop with every batch at 64 px ends elsewhere: the sizes are what made the runs equal
    flat = runs.run(recs, 1, tmp_path / "flat.txt", image_shape="3,64,64")
    assert runs.epoch_lines(flat)[2] != theirs[2]
