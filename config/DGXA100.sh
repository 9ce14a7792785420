# shellcheck shell=bash source-path=SCRIPTDIR
# NVIDIA DGX A100: 8x A100-SXM4 on NVSwitch, 2x AMD EPYC 7742 (64 cores). Same recipe as NF5688M6.
source "$(dirname "${BASH_SOURCE[0]}")/A100x8_1node_common.sh"

export DALI_THREADS=6
export DALI_PREFETCH_QUEUE=5
# DALI_HW_DECODER_LOAD: not set by the reference's DGXA100 config, so 0 (no hardware JPEG decoding).

export DGXSOCKETCORES=64
DGXSYSTEM=$(basename "${BASH_SOURCE[0]}" .sh)
export DGXSYSTEM
