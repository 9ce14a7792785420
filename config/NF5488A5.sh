# shellcheck shell=bash source-path=SCRIPTDIR
# Inspur NF5488A5: 8x A100-SXM4-80GB on NVSwitch, 2x AMD EPYC 7713 (64 cores). Inspur ran it with exactly
# the NF5688M6 config; only the CPUs differ.
source "$(dirname "${BASH_SOURCE[0]}")/NF5688M6.sh"

export DGXSOCKETCORES=64
DGXSYSTEM=$(basename "${BASH_SOURCE[0]}" .sh)
export DGXSYSTEM
