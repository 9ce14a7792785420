# shellcheck shell=bash source-path=SCRIPTDIR
# NVIDIA DGX A100: 8x A100-SXM4 on NVSwitch, 2x AMD EPYC 7742 (64 cores). Same recipe as NF5688M6.
source "$(dirname "${BASH_SOURCE[0]}")/A100x8_1node_common.sh"

export DALI_THREADS=6
export DALI_PREFETCH_QUEUE=5
# The reference's DGXA100 config sets no DALI_HW_DECODER_LOAD: its training decoder (decoders.image_random_crop,
# hw_decoder_load not passed) ran at DALI's own default of the time, 0.65 (ImageDecoderAttr in DALI 1.x's
# dali/operators/decoder/image_decoder.cc); rn50_mx gives one share to both decoders.
export DALI_HW_DECODER_LOAD=0.65

export DGXSOCKETCORES=64
DGXSYSTEM=$(basename "${BASH_SOURCE[0]}" .sh)
export DGXSYSTEM
