"""What a rehearsal runs: the sourced config shrunk to seconds, on generated records or the user's.

Only sizes shrink (images, units a stage, batch, examples, epochs, ranks, DALI's threads and queue); every switch of
the config (device, dtype, layout, NormConv, fused BatchNorm, optimizer, open levers, eval schedule) stays as it is,
so that the same code runs as on the GPU. Each shrink is said in the report."""
import dataclasses
import os

import numpy as np
from PIL import Image

from .. import config, files
from ..errors import InputError
from ..prep_rec.folders import pack_train_val
from .stages import CYCLE_MS

SIDE = 64  # pixels of the shrunk training crop: every stage of ResNet-50 still has a 2x2 map
LAYERS = 26  # --num-layers: 2 bottlenecks a stage, its projection unit and an identity unit (ResNet-50: 3 to 6)
BATCH = 4  # images per rank per step
STEPS = 3  # steps per epoch
QUICK_STEPS = 2  # per epoch with --quick, which stops nothing: the same epochs and evals, a third fewer stand-in steps
MIN_EPOCHS = 3  # a stop asked at step 1 lands by step 8 or an update later (checkpoint.stops): epoch 2 or 3
CLASSES, TRAIN_IMAGES, VAL_IMAGES = 4, 32, 16  # generated: at most CLASSES classes (fewer when the config has fewer)


class Limit(InputError):
    """A config the plan cannot shrink: the rehearsal's limit, not the config's fault."""


@dataclasses.dataclass
class Plan:
    """The flags that shrink the config (they beat its variables), and what each shrink was."""
    flags: dict
    shrunk: list
    ranks: int


def scaled(side, factor, step=1, least=1):
    """A pixel setting scaled with the training side, kept a positive multiple of `step` and at least `least` (what
    the settings allow); 0 (off) stays 0."""
    return side and max(step, least, int(round(side * factor / step)) * step)


def scaled_schedule(s, epochs):
    """--batch-schedule's points moved into the shrunk run of `epochs` epochs as the progressive ramp is: the config's
    epochs 0..last onto 0..epochs-1, in proportion. Points that land on one epoch keep the later one's factor (the
    one the config's run reaches last), so every factor change that fits is rehearsed."""
    points = {}
    for epoch, factor in s.batch_points:
        points[round(epoch * (epochs - 1) / max(1, s.epoch_limit - 1))] = factor
    return ",".join(f"{epoch}:{factor}" for epoch, factor in points.items())


def first_eval_from(s, epoch):
    """The first 0-based epoch from `epoch` on that the config's schedule evaluates after: the shrunk run ends there
    (a run stops after its last eval), so it has the config's evals and no epoch no eval would judge."""
    return next(e for e in range(epoch, epoch + s.eval_period) if e % s.eval_period == s.eval_offset % s.eval_period)


def shrink(s, ranks, data, steps=STEPS):
    """The Plan of settings `s` on `ranks` processes of one node with the data {"train": rec, "val": rec}, `steps`
    steps an epoch."""
    c, h, _ = s.image_chw
    factor = SIDE / h
    epochs = first_eval_from(s, MIN_EPOCHS - 1) + 1
    flags = dict(standin="gpu", data_train=data["train"], data_val=data["val"], image_shape=f"{c},{SIDE},{SIDE}",
                 num_layers=LAYERS, batch_size=BATCH, num_examples=ranks * BATCH * steps, num_epochs=epochs,
                 max_epochs=0, warmup_epochs=min(s.warmup_epochs, 1), accuracy_threshold=1.0, dgxnnodes=1,
                 dgxngpu=ranks, kv_store="horovod", dali_threads=1, dali_prefetch_queue=2, seed=1, disp_batches=1,
                 val_crop=scaled(s.val_crop, factor, least=config.MIN_IMAGE_SIDE),
                 prog_start_side=scaled(s.prog_start_side, factor, 16, config.MIN_PROG_SIDE),
                 prog_step=16 if s.prog_start_side else s.prog_step, ema_every=min(s.ema_every, steps),
                 batch_schedule=scaled_schedule(s, epochs))
    if s.prog_start_side:  # the ramp inside the shrunk run: the first epoch at the start side, the last at H,W
        flags.update(prog_start_epoch=0, prog_end_epoch=epochs - 1)
    try:
        config.validate(s.replace(**flags))
    except config.SettingsError as err:
        raise Limit(f"the rehearsal cannot shrink this config ({err}): a limit of its plan (rn50_mx/rehearse/plan.py), "
                    "not a fault of the config, which python -m rn50_mx.check judges") from None
    shrunk = [f"images {h} -> {SIDE} px (val crop, progressive sides alike), {s.num_layers} -> {LAYERS} layers (2 "
              f"units a stage: its projection unit and an identity unit), batch {s.batch_size} -> {BATCH} a rank, "
              f"{steps} steps an epoch, {s.epoch_limit} -> {epochs} epochs (evals kept on their schedule), warmup "
              f"{s.warmup_epochs:g} -> {flags['warmup_epochs']:g}, no target (top-1 1.0)",
              f"{s.world_size} ranks ({s.dgxnnodes} x {s.dgxngpu}) -> {ranks} on this machine, Gloo in place of NCCL, "
              f"Horovod's cycle {CYCLE_MS} ms (the GPU configs' HOROVOD_CYCLE_TIME=0.1 would spin the cores the ranks "
              "share)",
              f"DALI threads {s.dali_threads} -> 1, queue {s.dali_prefetch_queue} -> 2"
              + (f", weight EMA every {s.ema_every} -> {flags['ema_every']} steps" if s.ema_decay else "")
              + (", progressive ramp over the shrunk epochs" if s.prog_start_side else "")
              + (f", batch schedule {s.batch_schedule} -> {flags['batch_schedule']}" if s.batch_schedule else "")]
    return Plan(flags, shrunk, ranks)


# Settings that are values only: they choose no code, so two configs that differ in these alone take one code path.
VALUES_ONLY = {"lr", "end_lr", "wd", "mom", "lars_eta", "lars_eps", "label_smoothing", "ema_decay", "warmup_epochs",
               "dgxsystem", "dali_hw_decoder_load", "dali_nvjpeg_memory_padding", "dali_preallocate_width",
               "dali_preallocate_height", "dali_tmp_buffer_hint", "dali_decoder_buffer_hint",
               "dali_crop_buffer_hint", "dali_normalize_buffer_hint", "dali_initial_fill", "val_resize",
               "exit_timeout", "horovod_num_groups", "omp_num_threads", "optimizer_aggregation_size",
               "bfloat16_fallback"}
# The shrunk run's lengths, which the plan derives from the eval schedule (shrink: its epochs end at the first eval
# from MIN_EPOCHS on, a ramp ends with them): the schedule stays in the path, and the lengths choose no code of their
# own.
DERIVED = {"num_epochs", "prog_end_epoch"}


def code_path(s, plan):
    """The shrunk settings that choose code: what makes two configs' rehearsals differ."""
    shrunk = s.replace(**plan.flags)
    return tuple((name, getattr(shrunk, name)) for name in sorted(config.FIELDS)
                 if name not in VALUES_ONLY | DERIVED)


def generated_records(folder, num_classes=CLASSES, seed=0):
    """{"train": rec, "val": rec} of small JPEGs made here, TRAIN_IMAGES and VAL_IMAGES (or a few more) in CLASSES
    classes, or the config's `num_classes` when fewer (a label is a class number below it): each class a colour and
    stripes of its own under noise, of sizes that make the random crops and the val resize work. A disk that cannot
    take them is one line."""
    rng = np.random.RandomState(seed)
    raw = os.path.join(folder, "jpegs")
    classes = min(CLASSES, num_classes)
    try:
        for split, images in (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)):
            for k in range(classes):
                os.makedirs(os.path.join(raw, split, f"class{k}"), exist_ok=True)
                for i in range(-(-images // classes)):
                    h, w = rng.randint(SIDE + 8, 2 * SIDE, size=2)
                    stripes = (np.arange(w) // (k + 2) % 2)[None, :, None] * 60
                    pixels = np.clip(rng.normal(90 + 40 * k, 30, (h, w, 3)) + stripes, 0, 255).astype(np.uint8)
                    Image.fromarray(pixels).save(os.path.join(raw, split, f"class{k}", f"{i}.jpg"), quality=90)
    except OSError as err:  # a full or read-only disk
        raise files.os_error(raw, err, "write the rehearsal's generated images") from None
    pack_train_val(raw, folder, force=True)
    return {split: os.path.join(folder, f"{split}.rec") for split in ("train", "val")}
