# shellcheck shell=bash source-path=SCRIPTDIR
# Inspur NF5688M6: 8x A100-SXM4-80GB on NVSwitch, 2x Xeon Platinum 8358 (32 cores). The v1.0 submission
# (config_NF5688M6.sh).
source "$(dirname "${BASH_SOURCE[0]}")/A100x8_1node_common.sh"

export DALI_THREADS=5
export DALI_PREFETCH_QUEUE=15
export DALI_HW_DECODER_LOAD=0.7  # share of JPEGs (train and val) for the A100 hardware decoder

export DGXSOCKETCORES=32
DGXSYSTEM=$(basename "${BASH_SOURCE[0]}" .sh)
export DGXSYSTEM
