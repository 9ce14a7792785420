"""`--division open`: the closed recipe plus the open-division levers at the values the published open ResNet-50 runs
used, each with its source (docs/open-division.md, "The recipe's open config")."""
import textwrap
from dataclasses import dataclass

# Where the values come from (docs/open-division.md, "What was published").
SOURCES = ("FFCV: libffcv/ffcv-imagenet rn50_configs/rn50_24_epochs.yaml and train_imagenet.py (0.756 top-1 in 24 "
           "epochs); MosaicML: mlcommons/training_results_v2.0 MosaicML/benchmarks/resnet/implementations/"
           "8xA100_80GB-methods/config.yaml (MLPerf v2.0 open, 27 epochs), run with Composer v0.7.0-RC1 (its README)")
# FFCV's 24-epoch run ramps 160 -> 192 px from start_ramp 17 to end_ramp 20 and rounds to the nearest 32 px, so it
# trains epochs 0-18 at 160 and 19-23 at 192; our ramp rounds down and reaches the end size at its end epoch.
FFCV_EPOCHS, FFCV_START_RAMP, FFCV_SWITCH = 24, 17, 19
# MosaicML's EMA: update_interval 20ba and no half_life, so Composer v0.7.0-RC1's default (EMAHparams: "100ba").
EMA_EVERY, EMA_HALF_LIFE = 20, 100


@dataclass(frozen=True)
class Lever:
    """One open-division lever as the config sets it: its exports (variable, value, comment), what it does in
    words, and where the values come from."""
    name: str
    exports: tuple
    words: str
    source: str


def levers(num_epochs):
    """The open config's levers for a closed recipe of horizon `num_epochs` (NUMEPOCHS)."""
    start = round(FFCV_START_RAMP * num_epochs / FFCV_EPOCHS)
    end = max(start, round(FFCV_SWITCH * num_epochs / FFCV_EPOCHS))
    decay = round(0.5 ** (EMA_EVERY / EMA_HALF_LIFE), 4)
    return [
        Lever("progressive resizing", (
            ("IMAGE_SHAPE", "4,192,192", "the END training size: max_res 192 (yaml line 15); replaces 224"),
            ("RN50_PROG_START_SIDE", 160, "min_res 160 (yaml line 16)"),
            ("RN50_PROG_STEP", 32, "multiples of 32 (get_resolution, train_imagenet.py line 184)"),
            ("RN50_PROG_START_EPOCH", start, f"last epoch (0-based) at 160: start_ramp {FFCV_START_RAMP} of "
                                             f"{FFCV_EPOCHS} (yaml line 17), scaled"),
            ("RN50_PROG_END_EPOCH", end, f"first epoch at 192: FFCV's switch, epoch {FFCV_SWITCH} of {FFCV_EPOCHS}, "
                                         "scaled"),
            ("RN50_NORMCONV", 0, "the ramp is refused with NormConv on (it counts the pixels of one H,W)"),
            ("DALI_ROI_DECODE", 1, "the ramp needs the fused decode + crop (and no DALI_CACHE_SIZE)")),
            f"160 px to epoch {start}, 192 from epoch {end} (0-based, of NUMEPOCHS {num_epochs}); costs NormConv "
            "(RN50_NORMCONV=0: NVIDIA's fused conv-BN units off, speed cost not measured here; to keep them drop "
            "the IMAGE_SHAPE, RN50_PROG_* and RN50_NORMCONV lines)",
            f"FFCV: 160 -> 192 over epochs {FFCV_START_RAMP} -> 20 of {FFCV_EPOCHS} rounded to the nearest 32 px, "
            f"so 192 from epoch {FFCV_SWITCH}; ours rounds down, so its end epoch is that switch, scaled"),
        Lever("eval resolution", (
            ("RN50_VAL_CROP", 256, "validation resolution 256 (yaml line 30)"),
            ("VAL_RESIZE", 256, "the shorter side for a 224 crop, scaled with the crop: 293 px (FFCV: 256 / (224/256) "
                                "= 292.6)")),
            "centre crop 256 of a 293 px resize",
            "FFCV: validation resolution 256 and DEFAULT_CROP_RATIO 224/256 (the centre crop's share of the shorter side)"),
        Lever("flip averaging", (
            ("RN50_EVAL_FLIP", 1, "lr_tta true (yaml line 29)"),),
            "each val image's softmax averaged with its mirror's (two forwards per eval)",
            "FFCV: lr_tta; its val_loop sums the two logits, train_imagenet.py lines 403-404"),
        Lever("weight EMA", (
            ("RN50_EMA_EVERY", EMA_EVERY, "ema update_interval 20ba"),
            ("RN50_EMA_DECAY", decay, f"0.5 ** ({EMA_EVERY} / {EMA_HALF_LIFE}), our decay per update")),
            f"decay {decay} every {EMA_EVERY} steps: a half-life of {EMA_HALF_LIFE} steps (MosaicML's steps were "
            "2048 images)",
            f"MosaicML: ema update_interval 20ba and no half_life, so Composer v0.7.0-RC1's default "
            f"{EMA_HALF_LIFE}ba, composer/algorithms/hparams.py EMAHparams"),
        Lever("label smoothing", (
            ("LABELSMOOTHING", 0.08, "the closed rules allow 0 or 0.1"),),
            "0.08 (closed: 0.1)",
            "MosaicML: label_smoothing 0.08, with a binary cross-entropy loss there, softmax cross-entropy here"),
    ]


HEADER = """## OPEN DIVISION (--division open): starting values from the published open runs, NOT MLPerf-closed. Runs of this
## config are logged as submission_division open, checked with the open ruleset and scored by rn50_mx.timing among
## open runs only, never in a closed score. The values come from other stacks (PyTorch, SGD, their own schedules);
## with LARS and poly(2) here their effect on ImageNet is not measured. The horizon above is the closed recipe's:
## `python -m rn50_mx.search --mode open` is how to shorten it (MosaicML cut 84 -> 27 epochs, FFCV trained 24, both
## with other optimizers and schedules); rescale RN50_PROG_*_EPOCH with NUMEPOCHS. docs/open-division.md.
"""
RULE = "## " + "-" * 113 + "\n"


def comment(text, mark="#"):
    """`text` as shell comment lines of at most 120 columns."""
    return "".join(f"{mark} {line}\n" for line in textwrap.wrap(text, 118 - len(mark)))


def config_block(num_epochs):
    """The open block appended to the closed recipe's config: SUBMISSION_DIVISION and each lever's exports under a
    comment saying what it does and where its values come from."""
    parts = ["\n", RULE, HEADER, comment(SOURCES, "##"), RULE, "export SUBMISSION_DIVISION=open\n"]
    for lever in levers(num_epochs):
        parts.append(comment(f"{lever.name}: {lever.words}. {lever.source}."))
        parts += [f"export {env}={value}  # {note}\n" for env, value, note in lever.exports]
    return "".join(parts)


def mark(text):
    """The closed config's text with a line under its first saying it is open (the block at the end says how)."""
    first, rest = text.split("\n", 1)
    return f"{first}\n# OPEN DIVISION: the closed recipe below plus the open-division block at the end\n{rest}"


def describe_lines(num_epochs):
    """The recipe's words for the open config: that it is open, then one line per lever with its source."""
    return ["division: OPEN: open-division starting values, not MLPerf-closed; runs are logged, checked and scored "
            "as open (SUBMISSION_DIVISION=open); the epochs, minutes and RCP checker above are the closed recipe's",
            *(f"  {lever.name}: {lever.words} ({lever.source})" for lever in levers(num_epochs)),
            f"  horizon: the closed recipe's NUMEPOCHS {num_epochs}; `python -m rn50_mx.search --mode open` is how "
            "to shorten it (MosaicML 84 -> 27 epochs, FFCV 24, with other optimizers and schedules; LARS/poly(2) with "
            "these levers on ImageNet: not measured)"]
