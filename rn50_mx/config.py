"""Every setting of rn50-mx, in one typed object, read from one place.

Precedence: a CLI flag beats the environment, which beats the default below. Flags keep the names of the
reference's `train_imagenet.py` (`--batch-size`, `--lr`, `--dali-threads`, ...); environment variables keep the
names its `config_<SYSTEM>.sh` files export (BATCHSIZE, LR, DALI_THREADS, ...). No other module reads
`os.environ`. Defaults are the NF5688M6 recipe (config_NF5688M6.sh) on the portable CPU path (fp32, NCHW).
"""
import argparse
import dataclasses
import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Optional

from .errors import InputError


# Bounds of the shapes: a per-process batch beyond 16384 images (40 times the reference's 408) or a side beyond
# 2048 pixels (84 times the reference's 224x224 in every activation) is a typo, not a recipe.
MAX_BATCH = 16384
MAX_IMAGE_SIDE = 2048
MIN_IMAGE_SIDE = 32  # of H, W and the val crop: ResNet-50 halves the side 5 times
SYSTEM_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"  # a DGXSYSTEM: it names config/<SYSTEM>.sh and the fragments beside it
MIN_PROG_SIDE = 16  # a progressive-resizing start side: each stride-2 layer rounds up, so 16 px leave 1x1 at stage 4


class SettingsError(InputError):
    """A bad setting; the message is one line naming the variable or flag and the problem."""


def _opt(default, help, env=None, choices=None, low=None, high=None):
    """Declare a setting: its default, help line, reference env name, allowed values and closed range."""
    return field(default=default,
                 metadata=dict(help=help, env=env, choices=choices, low=low, high=high))


@dataclass(frozen=True)
class Settings:
    # --- data -----------------------------------------------------------------------------------
    data_train: str = _opt("", "train .rec file", env="DATA_TRAIN")
    data_train_idx: str = _opt("", "train .idx file (default: the .rec path with .idx)")
    data_val: str = _opt("", "val .rec file", env="DATA_VAL")
    data_val_idx: str = _opt("", "val .idx file (default: the .rec path with .idx)")
    datadir: str = _opt("", "folder of train.rec/.idx and val.rec/.idx: the data files when --data-train or "
                        "--data-val is not given", env="DATADIR")
    skip_bad_records: bool = _opt(False, "train: skip a record that does not decode, counting it, instead of "
                                  "stopping (val never skips: the score counts every val image)",
                                  env="RN50_SKIP_BAD_RECORDS")
    num_classes: int = _opt(1000, "number of classes", env="NUM_CLASSES", low=2, high=100_000)
    num_examples: int = _opt(0, "train images per epoch for the schedule; 0 = size of the train .rec",
                             env="NUMEXAMPLES", low=0, high=2**31 - 1)
    image_shape: str = _opt("3,224,224", "C,H,W of the network input; C=4 adds a zero channel",
                            env="IMAGE_SHAPE")
    val_resize: int = _opt(256, "val: shorter side before a centre crop of 224 (scaled with the crop side when that "
                           "is not 224); another value than 256 is an open-division lever", env="VAL_RESIZE", low=1,
                           high=4096)
    val_crop: int = _opt(0, "val: centre-crop side, set apart from the training H,W (FixRes: train at a smaller side, "
                         "evaluate at a larger one); 0 = the training H,W; an open-division lever",
                         env="RN50_VAL_CROP", low=0, high=MAX_IMAGE_SIDE)
    eval_flip: bool = _opt(False, "eval: average the softmax of each val image and its horizontal mirror; an "
                           "open-division lever", env="RN50_EVAL_FLIP")
    prog_start_side: int = _opt(0, "progressive resizing: the training crop side at the start, ramped to IMAGE_SHAPE's "
                                "H,W; 0 = off (train at H,W throughout); an open-division lever",
                                env="RN50_PROG_START_SIDE", low=0, high=MAX_IMAGE_SIDE)
    prog_start_epoch: int = _opt(0, "progressive resizing: the last epoch (0-based) at the start side",
                                 env="RN50_PROG_START_EPOCH", low=0, high=1000)
    prog_end_epoch: int = _opt(0, "progressive resizing: the first epoch (0-based) at H,W; between the two the side "
                               "grows linearly", env="RN50_PROG_END_EPOCH", low=0, high=1000)
    prog_step: int = _opt(32, "progressive resizing: sides are rounded down to a multiple of this many pixels",
                          env="RN50_PROG_STEP", low=1, high=MAX_IMAGE_SIDE)
    min_random_area: float = _opt(0.05, "train crop: smallest area fraction", env="MIN_RANDOM_AREA",
                                  low=0.0, high=1.0)
    max_random_area: float = _opt(1.0, "train crop: largest area fraction", env="MAX_RANDOM_AREA",
                                  low=0.0, high=1.0)
    min_random_aspect_ratio: float = _opt(0.75, "train crop: smallest aspect ratio", low=0.0)
    max_random_aspect_ratio: float = _opt(4 / 3, "train crop: largest aspect ratio", low=0.0)
    synthetic: bool = _opt(False, "feed constant random batches instead of reading data (the I/O ceiling)",
                           env="SYNTHETIC")

    # --- DALI (config_NF5688M6*.sh and common/dali.py) ----------------------------------------------------------------
    device: str = _opt("cpu", "where DALI and the model run", env="DEVICE", choices=("cpu", "gpu"))
    dali_threads: int = _opt(3, "DALI CPU threads per pipeline", env="DALI_THREADS", low=1, high=256)
    dali_prefetch_queue: int = _opt(2, "DALI prefetch queue depth", env="DALI_PREFETCH_QUEUE", low=1, high=32)
    dali_hw_decoder_load: float = _opt(0.0, "share of the JPEGs (train and val) that the mixed decoder sends to the "
                                       "A100/H100 hardware JPEG decoder (GPU only; the CPU decoder ignores it)",
                                       env="DALI_HW_DECODER_LOAD", low=0.0, high=1.0)
    dali_nvjpeg_memory_padding: int = _opt(64, "nvJPEG host/device memory padding, MiB",
                                           env="DALI_NVJPEG_MEMPADDING", low=0, high=4096)
    dali_preallocate_width: int = _opt(0, "HW decoder preallocation width hint",
                                       env="DALI_PREALLOCATE_WIDTH", low=0, high=16384)
    dali_preallocate_height: int = _opt(0, "HW decoder preallocation height hint",
                                        env="DALI_PREALLOCATE_HEIGHT", low=0, high=16384)
    dali_roi_decode: bool = _opt(True, "fused decode + random crop (False: decode, then random_resized_crop)",
                                 env="DALI_ROI_DECODE")
    dali_cache_size: int = _opt(0, "decoded-image cache per pipeline, MB (GPU only; 0 = off)",
                                env="DALI_CACHE_SIZE", low=0, high=1 << 20)
    dali_dont_use_mmap: bool = _opt(False, "read the .rec with plain reads instead of mmap (lustre: 1)",
                                    env="DALI_DONT_USE_MMAP")
    dali_initial_fill: int = _opt(1024, "reader shuffle buffer", env="DALI_INITIAL_FILL", low=1, high=1 << 20)
    dali_stick_to_shard: bool = _opt(False, "each rank keeps its shard every epoch", env="DALI_STICK_TO_SHARD")
    dali_num_attempts: int = _opt(10, "random crop attempts before the fallback", env="DALI_NUM_ATTEMPTS",
                                  low=1, high=1000)
    dali_resize_antialias: bool = _opt(True, "antialias when resizing down (DALI's default; 0 = plain bilinear as "
                                       "ImageRecordIter: a third less CPU per train image, bench/pipeline.py)",
                                       env="DALI_RESIZE_ANTIALIAS")
    dali_tmp_buffer_hint: int = _opt(25273239, "resize temp buffer hint, bytes", env="DALI_TMP_BUFFER_HINT",
                                     low=0, high=1 << 40)
    dali_decoder_buffer_hint: int = _opt(1315942, "decoder bytes per sample hint",
                                         env="DALI_DECODER_BUFFER_HINT", low=0, high=1 << 40)
    dali_crop_buffer_hint: int = _opt(165581, "crop/resize bytes per sample hint",
                                      env="DALI_CROP_BUFFER_HINT", low=0, high=1 << 40)
    dali_normalize_buffer_hint: int = _opt(441549, "normalize bytes per sample hint",
                                           env="DALI_NORMALIZE_BUFFER_HINT", low=0, high=1 << 40)

    # --- model ------------------------------------------------------------------------------------
    dtype: str = _opt("float32", "compute precision: float16 on the GPU, bfloat16 on a CPU with avx512_bf16 or "
                      "amx_bf16; either keeps BatchNorm, the loss and fp32 master weights in float32", env="DTYPE",
                      choices=("float32", "float16", "bfloat16"))
    bfloat16_fallback: bool = _opt(False, "DTYPE=bfloat16 where the CPU cannot run it (neither avx512_bf16 nor "
                                   "amx_bf16, or several processes under Horovod): train in float32, saying so in "
                                   "one line, instead of stopping (config/CPU.sh sets it: make demo runs on any x86 "
                                   "CPU); the GPU still refuses bfloat16", env="RN50_BFLOAT16_FALLBACK")
    input_layout: str = _opt("NCHW", "tensor layout (MXNet CPU convolutions need NCHW)", env="INPUT_LAYOUT",
                             choices=("NCHW", "NHWC"))
    bn_gamma_init0: bool = _opt(False, "zero-initialise the last BN gamma of each block", env="BN_GAMMA_INIT0")
    num_layers: int = _opt(50, "the network's depth, 3 x its bottleneck units + 2: 50 is ResNet-50 v1.5 (3, 4, 6, 3 "
                           "units a stage), the benchmark's network and the only one a GPU run takes; 26 (2 a stage) "
                           "and 14 (1 a stage) run the same code on fewer units, for the rehearsal's and the tests' "
                           "shrunk runs", env="RN50_NUM_LAYERS", choices=(14, 26, 50))
    omp_num_threads: int = _opt(0, "MXNet's OpenMP threads, read by MXNet when it loads: only the variable sets it "
                                "(0 = unset: MXNet takes half the logical CPUs)", env="OMP_NUM_THREADS", low=0,
                                high=1024)
    fused_bn: bool = _opt(True, "run BN->ReLU and BN->add->ReLU as one kernel each where MXNet has those kernels "
                          "(NGC builds, NHWC, float16); 0 = separate kernels everywhere", env="RN50_FUSED_BN")
    normconv: bool = _opt(True, "run each bottleneck's conv -> BN (-> add) -> ReLU as NVIDIA's NormConv fusions "
                          "(the reference's resnet-v1b-stats-fl) where MXNet has those operators (NGC builds, NHWC, "
                          "float16); 0 = plain kernels", env="RN50_NORMCONV")
    normconv_wiring: str = _opt("stats-fl", "which of NVIDIA's NormConv wirings the bottlenecks run: stats-fl, the "
                                "v1.0 reference's; mainloop-fl, NVIDIA's own on the 24.04 image (its MLPerf v4.0 "
                                "H100 and H200 runs), for an image that refuses stats-fl (the run's probe says "
                                "which runs)", env="RN50_NORMCONV_WIRING", choices=("stats-fl", "mainloop-fl"))
    batchnorm_eps: float = _opt(1e-5, "BatchNorm epsilon", low=0.0)
    batchnorm_mom: float = _opt(0.9, "BatchNorm running-statistics momentum", low=0.0, high=1.0)

    # --- optimizer and schedule (common/fit.py) ----------------------------------------------------------
    optimizer: str = _opt("sgdwfastlars", "lars (alias sgdwfastlars) or sgd (momentum)", env="OPTIMIZER",
                          choices=("sgdwfastlars", "lars", "sgd"))
    batch_size: int = _opt(408, "images per process per step", env="BATCHSIZE", low=1, high=MAX_BATCH)
    lr: float = _opt(10.5, "peak learning rate, reached after warmup", env="LR", low=0.0)
    end_lr: float = _opt(1e-4, "learning rate at the end of the poly decay", env="END_LR", low=0.0)
    lr_step_epochs: str = _opt("pow2", "schedule: warmup + polynomial decay of power 2", env="LRSCHED",
                               choices=("pow2",))
    warmup_epochs: float = _opt(2.0, "linear warmup length, epochs", env="WARMUP_EPOCHS", low=0.0)
    num_epochs: int = _opt(37, "schedule horizon: the poly(2) decay reaches END_LR here; also the epoch limit "
                           "unless RN50_MAX_EPOCHS", env="NUMEPOCHS", low=1, high=1000)
    max_epochs: int = _opt(0, "epoch limit past the horizon, trained at END_LR (reference runs that converged late "
                           "did so); 0 = NUMEPOCHS", env="RN50_MAX_EPOCHS", low=0, high=1000)
    mom: float = _opt(0.9, "momentum", env="MOM", low=0.0, high=1.0)
    mom_schedule: str = _opt("", "momentum schedule (the MoXing article's dynamic momentum): EPOCH:MOMENTUM points, "
                             "comma-separated, epochs rising, linear between points and constant outside them "
                             "(e.g. 0:0.85,4:0.95); empty = MOM throughout; LARS only; an open-division lever",
                             env="RN50_MOM_SCHEDULE")
    batch_schedule: str = _opt("", "batch-size schedule (the MoXing article's): EPOCH:FACTOR points, comma-separated, "
                               "0-based epochs rising; from each point's epoch on, every optimizer update sums the "
                               "gradients of FACTOR steps of BATCHSIZE images (the learning rate scaled with the "
                               "update's images; the data and its shards unchanged), 1 before the first point (e.g. "
                               "2:2,3:4); empty = one step per update; an open-division lever",
                               env="RN50_BATCH_SCHEDULE")
    wd: float = _opt(5e-5, "weight decay (not on BN parameters and biases)", env="WD", low=0.0)
    lars_eta: float = _opt(0.001, "LARS trust coefficient", env="LARSETA", low=0.0)
    lars_eps: float = _opt(0.0, "LARS epsilon", env="LARSEPS", low=0.0)
    lars_form: str = _opt("submitted", "submitted: the MXNet submission's SGDwFASTLARS (layer weights' momentum "
                          "scaled by lr_t/lr_t-1, weight decay on fc1_bias), on which its recipe was tuned; tf: the "
                          "TF reference's (neither)", env="RN50_LARS_FORM", choices=("submitted", "tf"))
    optimizer_aggregation_size: int = _opt(60, "tensors per multi-tensor optimizer call (MXNet's kernels take "
                                           "at most 60)", env="MXNET_OPTIMIZER_AGGREGATION_SIZE", low=1, high=60)
    label_smoothing: float = _opt(0.1, "label smoothing of the loss (the closed rules allow 0 or 0.1; any other "
                                  "value is an open-division lever)", env="LABELSMOOTHING", low=0.0, high=0.999)

    ema_decay: float = _opt(0.0, "weight EMA: every eval (and --save-model) uses an exponential moving average of "
                            "the weights and BatchNorm statistics with this decay per update; 0 = off; an "
                            "open-division lever", env="RN50_EMA_DECAY", low=0.0, high=1.0)
    ema_every: int = _opt(1, "weight EMA: average the weights in every N steps (the decay applies per update)",
                          env="RN50_EMA_EVERY", low=1, high=1_000_000)

    # --- evaluation and stop (mlperf_fit in common/fit.py) ------------------------------------------------------------
    eval_period: int = _opt(4, "evaluate every N epochs", env="EVAL_PERIOD", low=1, high=100)
    eval_offset: int = _opt(2, "first eval after epoch offset+1 (0-based offset)", env="EVAL_OFFSET", low=0, high=99)
    accuracy_threshold: float = _opt(0.759, "stop when top-1 reaches this", env="ACCURACY_THRESHOLD",
                                     low=0.0, high=1.0)
    eval_last_epoch: bool = _opt(False, "also evaluate the last epoch when the schedule does not (off the MLPerf "
                                 "schedule: not for submissions)", env="RN50_EVAL_LAST_EPOCH")

    # --- run ----------------------------------------------------------------------------------------
    seed: Optional[int] = _opt(None, "base seed (default: drawn at random and logged)", env="SEED",
                               low=0, high=2**31 - 1)
    kv_store: str = _opt("device", "horovod for one process per device; anything else is one process",
                         env="KVSTORE", choices=("device", "local", "horovod"))
    horovod_num_groups: int = _opt(1, "Horovod: gradient allreduce calls per step, each grouping its share of the "
                                   "tensors (0 = one call per tensor, fused by Horovod)",
                                   env="MXNET_HOROVOD_NUM_GROUPS", low=0, high=1024)
    disp_batches: int = _opt(20, "progress line every N steps", env="DISP_BATCHES", low=1, high=1_000_000)
    exit_timeout: int = _opt(90, "seconds a process may take to exit after run_stop before SIGALRM ends it",
                             env="RN50_EXIT_TIMEOUT", low=1, high=86_400)
    stall_seconds: int = _opt(600, "the progress watchdog's floor: a rank that completes nothing (a batch, a step, a "
                              "stop check, an eval, a checkpoint) for longer than this many seconds and than 20 times "
                              "its slowest recent interval prints every thread's stack and one line, and the run stops "
                              "(MLPerf `stalled`, run_stop aborted, exit 79); it must cover the warm-up's longest part "
                              "(graph build, autotuning); 0 = no watchdog", env="RN50_STALL_SECONDS", low=0,
                              high=86_400)
    standin: str = _opt("off", "a stand-in GPU build on this CPU (rn50_mx/standin): devices = each rank on a CPU "
                        "context of its own, cpu(1 + local rank), mixed contexts refused; gpu = that plus CPU twins of "
                        "the kernels the CPU lacks, NVIDIA's fused operators and Python layer (python -m "
                        "rn50_mx.rehearse sets it); says nothing of a GPU's speed, memory or numerics", env="RN50_STANDIN",
                        choices=("off", "devices", "gpu"))
    standin_sm: int = _opt(80, "the compute capability (major x 10 + minor: 80 A100, 90 H100, 89 L40S) of the GPU the "
                           "stand-in GPU build stands in for (--standin gpu): NVIDIA's NormConv kernels run on the "
                           "ones rn50_mx/standin/ngc.py's NORMCONV_SM assumes (the public fork: 70, 75, 80, 86; the "
                           "24.04 image: 90 too), and refuse any other, as they would there", env="RN50_STANDIN_SM",
                           choices=(60, 61, 70, 72, 75, 80, 86, 87, 89, 90, 100, 120))
    cache_cleared: bool = _opt(False, "the launcher dropped the page cache before this run (logged as cache_clear)",
                               env="CACHE_CLEARED")
    mllog_file: str = _opt("", "also write the MLPerf log to this file", env="MLLOG_FILE")
    checkpoint_dir: str = _opt("", "folder of the run's checkpoints: a run started on one that holds a checkpoint "
                               "resumes from it exactly; SIGTERM or SIGUSR1 then write one and stop (exit 75); "
                               "empty = no checkpoints, signals end the run at once", env="RN50_CHECKPOINT_DIR")
    checkpoint_every: int = _opt(0, "with --checkpoint-dir: also write a checkpoint every N epochs (0 = only when "
                                 "a signal asks the run to stop)", env="RN50_CHECKPOINT_EVERY", low=0, high=1000)
    save_model: str = _opt("", "when the run ends, write its final parameters and hybridized symbol as "
                           "PATH-0000.params and PATH-symbol.json (for python -m rn50_mx.evaluate --model PATH)",
                           env="RN50_SAVE_MODEL")
    submission_org: str = _opt("rn50-mx", "MLPerf submission_org", env="SUBMISSION_ORG")
    submission_division: str = _opt("closed", "MLPerf submission_division: open for a run with settings the closed "
                                    "rules forbid (python -m rn50_mx.search --mode open sets it)",
                                    env="SUBMISSION_DIVISION", choices=("closed", "open"))
    dgxsystem: str = _opt("CPU", "system name, as in config/<SYSTEM>.sh", env="DGXSYSTEM")
    dgxnnodes: int = _opt(1, "number of nodes", env="DGXNNODES", low=1, high=4096)
    dgxngpu: int = _opt(1, "processes (devices) per node", env="DGXNGPU", low=1, high=64)

    # --- derived values -------------------------------------------------------------------------------
    @property
    def image_chw(self):
        """(C, H, W) parsed from image_shape."""
        return tuple(int(v) for v in self.image_shape.split(","))

    @property
    def eval_chw(self):
        """(C, H, W) of the val images the network is evaluated on: the training C,H,W unless --val-crop."""
        c, h, w = self.image_chw
        return (c, self.val_crop, self.val_crop) if self.val_crop else (c, h, w)

    @property
    def val_resize_side(self):
        """The shorter side val images are resized to before the centre crop: VAL_RESIZE for a 224 crop, scaled
        with the crop's height (the reference's 256 -> 224 ratio at any size)."""
        return round(self.val_resize * self.eval_chw[1] / 224)

    def train_hw(self, epoch):
        """(H, W) of the training crops in 0-based `epoch`: IMAGE_SHAPE's, or with --prog-start-side a linear ramp
        from that side to them between --prog-start-epoch and --prog-end-epoch, rounded down to --prog-step."""
        hw = self.image_chw[1:]
        a, b, start = self.prog_start_epoch, self.prog_end_epoch, self.prog_start_side
        if not start or epoch >= b:
            return hw
        if epoch <= a:
            return (start, start)
        return tuple(int(start + (end - start) * (epoch - a) / (b - a)) // self.prog_step * self.prog_step
                     for end in hw)

    @property
    def train_sizes(self):
        """Every training (H, W) of the run, in the order the epochs reach them."""
        return list(dict.fromkeys(self.train_hw(epoch) for epoch in range(self.epoch_limit)))

    @property
    def epoch_limit(self):
        """The last epoch a run may train, 1-based: NUMEPOCHS, or RN50_MAX_EPOCHS past it."""
        return max(self.num_epochs, self.max_epochs)

    @property
    def world_size(self):
        """Processes (devices) of the run: DGXNNODES x DGXNGPU, the world dist.check_world holds a run to."""
        return self.dgxnnodes * self.dgxngpu

    @property
    def global_batch(self):
        """Images per step over every process (MLPerf's global_batch_size without --batch-schedule; with it, each
        update's is this times batch_factor of its epoch)."""
        return self.batch_size * self.world_size

    @property
    def batch_points(self):
        """The batch-size schedule as [(epoch, factor), ...], or [] when --batch-schedule is empty (validate has
        checked its text)."""
        return batch_points(self.batch_schedule)

    def batch_factor(self, epoch):
        """Steps summed into one optimizer update in 0-based `epoch` (--batch-schedule; 1 without)."""
        return factor_at(self.batch_points, epoch)

    @property
    def momentum_points(self):
        """The momentum schedule as [(epoch, momentum), ...], or [] when --mom-schedule is empty (validate has
        checked its text)."""
        return momentum_points(self.mom_schedule)

    @property
    def input_dtype(self):
        """The dtype the input pipeline delivers the images in: DTYPE, but float32 for bfloat16, which DALI has no
        output type for (DALIDataType); the network's first operator casts them (model.ResNet50V15.cast)."""
        return "float32" if self.dtype == "bfloat16" else self.dtype

    @property
    def is_lars(self):
        return self.optimizer in ("lars", "sgdwfastlars")

    def idx_path(self, rec):
        """The .idx that goes with a .rec when none is given."""
        return os.path.splitext(rec)[0] + ".idx"

    def replace(self, **changes):
        """A copy with some fields changed, validated like the original."""
        new = dataclasses.replace(self, **changes)
        validate(new)
        return new


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
# Prefixes of the variables this tool reads. RN50_* is ours alone: an unknown RN50_ name is a typo. DALI_* is shared
# with DALI itself (DALI_AFFINITY_MASK, DALI_USE_VMM, ...) and with the images that ship it (NGC exports DALI_VERSION,
# DALI_BUILD, DALI_URL_SUFFIX): an unknown DALI_ name passes, unless it is so close to one of ours that it is a typo
# of it, or a look-alike that would do nothing here (DALI_NUM_THREADS: our pipelines set their thread count).
OWNED_ENV_PREFIXES = ("DALI_", "RN50_")
SHARED_ENV_PREFIX = "DALI_"
TYPO_SIMILARITY = 0.8  # difflib ratio: DALI_THREAD~DALI_THREADS 0.96, DALI_USE_VMM~DALI_DONT_USE_MMAP 0.73
# Any other name this close to one we read (BATCHSIZ~BATCHSIZE 0.94, NUMEPOCH~NUMEPOCHS 0.94) is a typo too; the
# bar is higher, as the environment holds every other program's names (PWD~WD is 0.8).
NEAR_MISS_SIMILARITY = 0.88
# Reference variables for features rn50_mx has one fixed form of (run_and_time.sh): the value that matches it is
# accepted, any other is refused, so a reference setting is never ignored without a word.
REFERENCE_ONLY_ENV = {
    "BN_GROUP": ("1",),  # BatchNorm statistics over each process's own batch; no cross-GPU BN groups
    "INPUT_BATCH_MULTIPLIER": ("1",),  # DALI delivers exactly one batch per step
    "NODALI": ("0",),  # the input pipeline is always DALI
}


# Settings the closed division forbids (MLPerf's closed rules fix the reference's eval preprocessing and optimizer),
# each with the settings logged along with it; a lever is on when its value is not the default, or not one of the
# values CLOSED_VALUES lists (training_rules.adoc's hyperparameter table: label smoothing 0 or 0.1, which no checker
# verifies: it is not logged in the closed division). docs/open-division.md.
OPEN_LEVERS = {"val_resize": (), "val_crop": (), "eval_flip": (), "eval_last_epoch": (), "ema_decay": ("ema_every",), "mom_schedule": (),
               "prog_start_side": ("prog_start_epoch", "prog_end_epoch", "prog_step"), "label_smoothing": (),
               "batch_schedule": ()}
CLOSED_VALUES = {"label_smoothing": (0.0, 0.1)}


def open_levers(s):
    """{setting: value} of the open-division levers `s` turns on, with their companion settings."""
    on = {}
    for name, companions in OPEN_LEVERS.items():
        if getattr(s, name) not in CLOSED_VALUES.get(name, (FIELDS[name].default,)):
            on.update({n: getattr(s, n) for n in (name, *companions)})
    return on


def momentum_points(text):
    """[(epoch, momentum), ...] parsed from EPOCH:MOMENTUM,...; ValueError says what is wrong in a few words."""
    points = []
    if not text:  # a blank one is no schedule, but would turn the lever on (open_levers): refused as malformed
        return points
    for item in (part.strip() for part in text.split(",")):
        epoch, sep, momentum = item.partition(":")
        try:
            point = float(epoch), float(momentum)
        except ValueError:
            point = None
        if not sep or point is None or not all(math.isfinite(v) for v in point):
            raise ValueError(f"{item!r} is not EPOCH:MOMENTUM")
        if point[0] < 0 or not 0 <= point[1] < 1:
            raise ValueError(f"{item!r}: the epoch must be >= 0 and the momentum in [0, 1)")
        if points and point[0] <= points[-1][0]:
            raise ValueError(f"{item!r}: the epochs must rise from point to point")
        points.append(point)
    return points


CPUINFO = "/proc/cpuinfo"
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")  # the x86 instructions oneDNN computes bfloat16 with
FALLBACK = "bfloat16_fallback"
FALLBACK_NOTE = "bfloat16_fallback_note"  # in the origins: why float32 replaced bfloat16 (no field has this name)


def cpu_flags(path=None):
    """The flags of the first processor in `path` (default CPUINFO): empty where there is no such file (not Linux).
    Read as bytes: the flags line is ASCII, a VM's model name may be any bytes."""
    try:
        with open(path or CPUINFO, "rb") as f:
            for line in f:
                key, _, value = line.decode("ascii", "replace").partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def bfloat16_obstacle(s):
    """Why this CPU cannot run `s` in bfloat16 (the instructions, or Horovod), or None."""
    if not set(BFLOAT16_FLAGS) & cpu_flags():
        return f"this CPU has neither {' nor '.join(BFLOAT16_FLAGS)} ({CPUINFO})"
    if s.kv_store == "horovod":
        return "one process only: Horovod's MXNet allreduce takes no bfloat16 (horovod/mxnet/tensor_util.cc, " \
               "TensorUtil::GetDType)"
    return None


def check_bfloat16(s, src):
    """Where bfloat16 can run: the CPU (the GPU's low precision is float16), with the instructions, in one process."""
    name = src("dtype")
    if s.device == "gpu":
        raise SettingsError(f"{name}=bfloat16: the CPU's low precision; on the GPU use float16")
    obstacle = bfloat16_obstacle(s)
    if obstacle:
        switch = flag_name(FALLBACK) if name.startswith("--") else FIELDS[FALLBACK].metadata["env"]
        raise SettingsError(f"{name}=bfloat16: {obstacle}: use float32, or {switch}=1 to fall back to it")


def fall_back(s, origins):
    """`s` in float32 where it asks for bfloat16 with the fallback on and this CPU cannot run bfloat16, the reason
    kept in `origins` for say_fallback; else `s`. Nothing is said here: a tool that resolves the settings and then
    refuses something else must say one line, not the fallback first. The GPU is not a case: validate refuses
    bfloat16 there."""
    if s.dtype != "bfloat16" or not s.bfloat16_fallback or s.device == "gpu":
        return s
    obstacle = bfloat16_obstacle(s)
    if obstacle is None:
        return s
    switch = given_as(FALLBACK, origins)
    origins[FALLBACK_NOTE] = f"{given_as('dtype', origins)}=bfloat16: {obstacle}: training in float32 ({switch}=1)"
    origins["dtype"] = origins.get(FALLBACK, "flag")
    return dataclasses.replace(s, dtype="float32")


def say_fallback(origins):
    """Say on stderr, in one line, why these settings train in float32 where bfloat16 was asked (fall_back), if they
    do. Said where the settings are put to use, once every check has passed: by the launchers' check, after its
    verdicts, and by each training process as its run starts (a trial's log holds both)."""
    if FALLBACK_NOTE in origins:
        print(origins[FALLBACK_NOTE], file=sys.stderr, flush=True)


MAX_BATCH_FACTOR = 1024  # steps per update: 1024 x 3264 images is over 3 million, far past ResNet-50 batches in use


def batch_points(text):
    """[(epoch, factor), ...] parsed from EPOCH:FACTOR,...; ValueError says what is wrong in a few words."""
    points = []
    if not text:
        return points
    for item in (part.strip() for part in text.split(",")):
        epoch, sep, factor = item.partition(":")
        if not sep or not epoch.strip().isdecimal() or not factor.strip().isdecimal():
            raise ValueError(f"{item!r} is not EPOCH:FACTOR (whole numbers)")
        point = int(epoch), int(factor)
        if not 1 <= point[1] <= MAX_BATCH_FACTOR:
            raise ValueError(f"{item!r}: the factor must be 1 to {MAX_BATCH_FACTOR}")
        if points and point[0] <= points[-1][0]:
            raise ValueError(f"{item!r}: the epochs must rise from point to point")
        points.append(point)
    return points


def factor_at(points, epoch):
    """The factor of 0-based `epoch` on the schedule `points` (batch_points'): the last point at or before it, 1 before
    the first."""
    return next((factor for start, factor in reversed(points) if start <= epoch), 1)


def flag_name(name):
    return "--" + name.replace("_", "-")


def given_as(name, origins):
    """How the user gave field `name`: its environment variable, or its flag (also for defaults)."""
    origin = origins.get(name, "flag")
    return flag_name(name) if origin == "flag" else origin


def _convert(f, text, source):
    """Turn a flag or environment string into the field's type, or raise a one-line SettingsError."""
    kind = f.type
    if kind == Optional[int]:
        kind = int
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("0", "1", "true", "false", "yes", "no"):
                raise ValueError
            return lowered in ("1", "true", "yes")
        return kind(text)
    except ValueError:
        raise SettingsError(f"{source}={text!r}: expected {kind.__name__}") from None


def _check(f, value, source):
    """The field's choices and range; `source` names the flag or variable the value came from."""
    meta = f.metadata
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingsError(f"{source}={value!r}: must be a finite number")
    if meta["choices"] and value not in meta["choices"]:
        raise SettingsError(f"{source}={value!r}: must be one of {', '.join(map(str, meta['choices']))}")
    if meta["low"] is not None and value < meta["low"]:
        raise SettingsError(f"{source}={value!r}: must be >= {meta['low']}")
    if meta["high"] is not None and value > meta["high"]:
        raise SettingsError(f"{source}={value!r}: must be <= {meta['high']}")


def check_fields(s, src=flag_name):
    """Each field's type and range on its own (validate adds the checks across fields); src(name) names it."""
    for f in FIELDS.values():
        _check(f, getattr(s, f.name), src(f.name))


def check_image_shape(s, src=flag_name):
    """C,H,W with C 3 or 4 and sides ResNet-50 can halve 5 times (a checkpoint's recorded settings too)."""
    chw = s.image_shape.split(",") if isinstance(s.image_shape, str) else []
    if len(chw) != 3 or not all(v.isdecimal() and int(v) > 0 for v in chw) or int(chw[0]) not in (3, 4):
        raise SettingsError(f"{src('image_shape')}={s.image_shape!r}: expected C,H,W with C 3 or 4")
    if not all(MIN_IMAGE_SIDE <= int(side) <= MAX_IMAGE_SIDE for side in chw[1:]):
        raise SettingsError(f"{src('image_shape')}={s.image_shape!r}: H and W must be {MIN_IMAGE_SIDE} to "
                            f"{MAX_IMAGE_SIDE} (ResNet-50 halves the side 5 times)")


def validate(s, origins=None):
    """Each field's range, then the checks across fields. origins (resolve's) lets a message name the environment
    variable a bad value came from rather than its flag."""
    origins = origins or {}

    def src(name):
        return given_as(name, origins)

    check_fields(s, src)
    check_image_shape(s, src)
    if s.min_random_area > s.max_random_area:
        raise SettingsError(f"{src('min_random_area')} is larger than {src('max_random_area')}")
    if s.min_random_aspect_ratio > s.max_random_aspect_ratio:
        raise SettingsError(f"{src('min_random_aspect_ratio')} is larger than {src('max_random_aspect_ratio')}")
    if s.eval_offset >= s.eval_period:
        raise SettingsError(f"{src('eval_offset')}={s.eval_offset}: must be below "
                            f"{src('eval_period')}={s.eval_period}")
    if 0 < s.max_epochs < s.num_epochs:
        raise SettingsError(f"{src('max_epochs')}={s.max_epochs}: must be 0 or at least "
                            f"{src('num_epochs')}={s.num_epochs}")
    if s.eval_offset >= s.epoch_limit and not s.eval_last_epoch:
        limit = f", {src('max_epochs')}={s.max_epochs}" if s.max_epochs else ""
        raise SettingsError(f"{src('eval_offset')}={s.eval_offset}: no epoch up to {s.epoch_limit} "
                            f"({src('num_epochs')}={s.num_epochs}{limit}) would be evaluated")
    if s.warmup_epochs >= s.num_epochs:
        raise SettingsError(f"{src('warmup_epochs')}={s.warmup_epochs}: must be below "
                            f"{src('num_epochs')}={s.num_epochs}")
    if s.dtype == "bfloat16":
        check_bfloat16(s, src)
    if s.num_layers != FIELDS["num_layers"].default and s.device == "gpu" and s.standin == "off":
        raise SettingsError(f"{src('num_layers')}={s.num_layers}: a GPU run trains ResNet-50 (50), the benchmark's "
                            "network; fewer layers are for shrunk runs (the rehearsal's stand-in, the CPU's tests)")
    if s.input_layout == "NHWC" and s.device == "cpu":
        raise SettingsError(f"{src('input_layout')}=NHWC: MXNet's CPU convolutions need NCHW; NHWC is the GPU layout")
    levers = [name for name in OPEN_LEVERS if name in open_levers(s)]
    if levers and s.submission_division != "open":
        raise SettingsError(f"{src(levers[0])}={getattr(s, levers[0])}: an open-division lever; the run must be "
                            "logged as open: SUBMISSION_DIVISION=open (--submission-division open)")
    if s.ema_decay >= 1:
        raise SettingsError(f"{src('ema_decay')}={s.ema_decay}: must be below 1 (1 would never move the average)")
    try:
        momentum_points(s.mom_schedule)
    except ValueError as err:
        raise SettingsError(f"{src('mom_schedule')}={s.mom_schedule!r}: {err}") from None
    if s.mom_schedule and not s.is_lars:
        raise SettingsError(f"{src('mom_schedule')}: a momentum schedule needs LARS ({src('optimizer')}="
                            f"{s.optimizer}: MXNet's SGD takes one momentum)")
    if s.batch_schedule:
        check_batch_schedule(s, src)
    if 0 < s.val_crop < MIN_IMAGE_SIDE:
        raise SettingsError(f"{src('val_crop')}={s.val_crop}: must be 0 or {MIN_IMAGE_SIDE} to {MAX_IMAGE_SIDE} "
                            "(ResNet-50 halves the side 5 times)")
    if s.prog_start_side:
        check_progressive(s, src)
    if origins.get("omp_num_threads") == "flag":
        raise SettingsError("--omp-num-threads: MXNet reads OMP_NUM_THREADS when it loads, before any flag is "
                            "parsed: set the variable instead")
    if not re.fullmatch(SYSTEM_NAME, s.dgxsystem):
        raise SettingsError(f"{src('dgxsystem')}={s.dgxsystem!r}: a system name is letters, digits, '.', '_' and '-' "
                            "(it names config/<SYSTEM>.sh and the fragments the tools write beside it)")
    if s.checkpoint_every and not s.checkpoint_dir:
        raise SettingsError(f"{src('checkpoint_every')}={s.checkpoint_every}: needs {src('checkpoint_dir')}")
    if s.world_size > 1 and s.kv_store != "horovod":
        raise SettingsError(f"{src('kv_store')}={s.kv_store}: {s.dgxnnodes} node(s) x {s.dgxngpu} processes "
                            "need horovod")


def check_batch_schedule(s, src):
    """The batch-size schedule's points, and the builds whose gradients cannot add up over steps."""
    name = src("batch_schedule")
    try:
        points = batch_points(s.batch_schedule)
    except ValueError as err:
        raise SettingsError(f"{name}={s.batch_schedule!r}: {err}") from None
    last = points[-1][0] if points else 0
    if last >= s.epoch_limit:
        raise SettingsError(f"{name}={s.batch_schedule!r}: epoch {last} is past the run's last epoch, "
                            f"{s.epoch_limit - 1} (0-based; {src('num_epochs')}={s.num_epochs})")
    if s.device == "gpu" and s.input_layout == "NHWC" and s.dtype == "float16":
        raise SettingsError(f"{name}: NVIDIA's NHWC float16 BatchNorm (NGC builds' NhwcBatchNormOp, which NormConv's "
                            "backward runs too) writes its gamma and beta gradients over the last ones instead of "
                            f"adding to them, so steps cannot add up: set {src('input_layout')}=NCHW or "
                            f"{src('dtype')}=float32")


def check_progressive(s, src):
    """The progressive-resizing schedule's settings against each other and against what the graph can change."""
    start, step, (_, h, w) = s.prog_start_side, s.prog_step, s.image_chw
    if not MIN_PROG_SIDE <= start <= min(h, w):
        raise SettingsError(f"{src('prog_start_side')}={start}: must be {MIN_PROG_SIDE} (the last stage then sees 1x1) "
                            f"to the smaller side of {src('image_shape')}={s.image_shape}")
    if start % step or h % step or w % step:
        raise SettingsError(f"{src('prog_step')}={step}: must divide {src('prog_start_side')}={start} and the H,W "
                            f"of {src('image_shape')}={s.image_shape}")
    if s.prog_end_epoch < s.prog_start_epoch:
        raise SettingsError(f"{src('prog_end_epoch')}={s.prog_end_epoch}: must be at least "
                            f"{src('prog_start_epoch')}={s.prog_start_epoch}")
    if s.synthetic:
        raise SettingsError(f"{src('prog_start_side')}={start}: --synthetic feeds one batch of IMAGE_SHAPE throughout; "
                            "progressive resizing needs the real pipeline")
    if not s.dali_roi_decode or s.dali_cache_size:
        raise SettingsError(f"{src('prog_start_side')}={start}: needs the fused decode + crop (--dali-roi-decode 1, "
                            "no --dali-cache-size): DALI's random_resized_crop takes no per-batch size")
    if s.normconv and s.input_layout == "NHWC" and s.dtype == "float16":
        raise SettingsError(f"{src('prog_start_side')}={start}: NormConv's statistics count the pixels of one H,W; "
                            f"set {src('normconv')}=0")


def from_environ(environ):
    """Settings values given by reference-named environment variables; unknown owned names are refused."""
    by_env = {f.metadata["env"]: f for f in FIELDS.values() if f.metadata["env"]}
    values = {}
    for name, text in environ.items():
        if name in by_env:
            if text == "":
                continue
            f = by_env[name]
            values[f.name] = _convert(f, text, name)
        elif name in REFERENCE_ONLY_ENV:
            if text not in REFERENCE_ONLY_ENV[name] + ("",):
                raise SettingsError(f"{name}={text!r}: rn50_mx supports only {name}={REFERENCE_ONLY_ENV[name][0]}")
        elif name.startswith(OWNED_ENV_PREFIXES):
            refuse_unknown(name, by_env)
        else:
            refuse_near_miss(name, list(by_env) + list(REFERENCE_ONLY_ENV))
    return values


def refuse_near_miss(name, known):
    """Any other name that is a likely typo of one we read (BATCHSIZ=8 would otherwise be ignored in silence)."""
    if len(name) < 5:
        return
    close = [k for k in known if k.upper() == name.upper()] or difflib.get_close_matches(
        name, known, n=1, cutoff=NEAR_MISS_SIMILARITY)
    if close:
        raise SettingsError(f"{name}: not a variable rn50_mx reads; did you mean {close[0]}? (it is ignored: unset "
                            "it or correct it)")


def refuse_unknown(name, by_env):
    """An unknown name under one of our prefixes: refused when it is ours to know (see OWNED_ENV_PREFIXES)."""
    prefix = next(p for p in OWNED_ENV_PREFIXES if name.startswith(p))
    ours = sorted(k for k in by_env if k.startswith(prefix))
    close = difflib.get_close_matches(name, ours, n=1, cutoff=TYPO_SIMILARITY)
    if close:
        raise SettingsError(f"{name}: unknown variable; did you mean {close[0]}?")
    if prefix != SHARED_ENV_PREFIX:
        raise SettingsError(f"{name}: unknown variable (known: {', '.join(ours)})")


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one SettingsError line (exit 2 through run_cli), for every tool's flags."""

    def error(self, message):
        raise SettingsError(message)


DATA_FLAGS_HELP = """data and settings: --data-train DIR/train.rec --data-val DIR/val.rec (or DATADIR, the folder of
both), and any other flag of python -m rn50_mx.train (see its --help) or variable of the sourced config/<SYSTEM>.sh"""


def tool_parser(prog, doc):
    """The parser of a tool that takes rn50_mx.train's flags too (parse_known_args hands them on): its description
    is the first paragraph of `doc`, its epilog names the data flags; an error is one line."""
    return Parser(prog=prog, description=" ".join(doc.split("\n\n")[0].split()), epilog=DATA_FLAGS_HELP,
                  allow_abbrev=False)


def settings_parser(prog):
    """The flags of every setting (FIELDS), as rn50_mx.train takes them and the tools hand them on."""
    parser = Parser(prog=prog, description="MLPerf ResNet-50 training with MXNet Gluon, DALI and Horovod")
    for f in FIELDS.values():
        env = f.metadata["env"]
        shown = f"(default {f.default})" if f.default not in ("", None) else "(default: none)"
        help_text = f.metadata["help"] + (f" [env {env}]" if env else "") + " " + shown
        parser.add_argument(flag_name(f.name), dest=f.name, metavar=f.name.upper(), default=None,
                            help=help_text)
    return parser


def resolve(argv=None, environ=None, prog="rn50_mx.train"):
    """(settings, origins): defaults, then `environ` (default os.environ), then CLI flags `argv`; origins maps
    each field given to "flag" or to the environment variable it came from."""
    environ = os.environ if environ is None else environ
    values = from_environ(environ)
    origins = {name: FIELDS[name].metadata["env"] for name in values}
    flags = vars(settings_parser(prog).parse_args([] if argv is None else argv))
    for name, text in flags.items():
        if text is not None:
            values[name] = _convert(FIELDS[name], text, flag_name(name))
            origins[name] = "flag"
    for name, file in (("data_train", "train.rec"), ("data_val", "val.rec")):
        if values.get("datadir") and not values.get(name):
            values[name], origins[name] = os.path.join(values["datadir"], file), "DATADIR"
    settings = fall_back(Settings(**values), origins)
    validate(settings, origins)
    check_horovod_stall(settings, environ, origins)
    return settings, origins


HOROVOD_STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"  # read by Horovod, not by rn50_mx (gpu_common.sh)


def check_horovod_stall(s, environ, origins):
    """Horovod's own stall shutdown (config/gpu_common.sh says what it does) at or below the progress watchdog's floor
    would end a stalled run first, with errors on every rank instead of the watchdog's verdict: refused. Horovod
    reads the variable with strtol: a value that is not a number is 0, no shutdown."""
    text = environ.get(HOROVOD_STALL_SHUTDOWN, "").strip()
    shutdown = int(text) if text.isdecimal() else 0
    if s.kv_store == "horovod" and s.stall_seconds and 0 < shutdown <= s.stall_seconds:
        raise SettingsError(f"{HOROVOD_STALL_SHUTDOWN}={text} is not above {given_as('stall_seconds', origins)}="
                            f"{s.stall_seconds}: Horovod would shut a stalled run down (errors on every rank, exit 1) "
                            "before the progress watchdog gives its verdict (stacks, exit 79); set it above the floor "
                            "(config/gpu_common.sh sets twice the default)")


def load(argv=None, environ=None, prog="rn50_mx.train"):
    """The settings of resolve(), without their origins."""
    return resolve(argv, environ, prog)[0]


# Paths on the launching machine: a container sees its data and logs elsewhere (its launcher passes those).
HOST_PATH_ENV = ("DATA_TRAIN", "DATA_VAL", "DATADIR", "MLLOG_FILE")


def env_names():
    """The environment variables this tool reads, and the patterns of those it owns (DALI_*, RN50_*): what a
    launcher hands on to a container, host paths excepted."""
    names = [f.metadata["env"] for f in FIELDS.values() if f.metadata["env"] not in (None, *HOST_PATH_ENV)]
    return names + list(REFERENCE_ONLY_ENV) + [prefix + "*" for prefix in OWNED_ENV_PREFIXES]


def value_text(value):
    """A setting's value as a flag or a variable gives it (a bool as 0 or 1)."""
    return str(int(value) if isinstance(value, bool) else value)


def as_flags(s):
    """Flags that give every field of `s` (flags beat the environment), for a process that must resolve the same
    settings; OMP_NUM_THREADS is not among them (only the variable sets it)."""
    flags = []
    for f in FIELDS.values():
        value = getattr(s, f.name)
        if value is not None and f.name != "omp_num_threads":
            flags += [flag_name(f.name), value_text(value)]
    return flags


def as_env(s):
    """{variable: value} for every field of `s` that a variable sets, host paths excepted (a launcher passes the
    data files itself): what a launcher's environment needs for its training to resolve the same settings."""
    return {f.metadata["env"]: value_text(getattr(s, f.name)) for f in FIELDS.values()
            if f.metadata["env"] not in (None, *HOST_PATH_ENV) and getattr(s, f.name) is not None}


def environ_with(**changes):
    """This process's environment with `changes`: what a child process that must see other values gets."""
    return {**os.environ, **changes}


def help_text(prog="rn50_mx.train"):
    return settings_parser(prog).format_help()


def describe(s, origins):
    """One line per setting: its flag, value and origin (flag, the environment variable, or default)."""
    return "\n".join(f"{flag_name(f.name):30} {getattr(s, f.name)!s:20} {origins.get(f.name, 'default')}"
                     for f in FIELDS.values())
