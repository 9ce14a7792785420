# shellcheck shell=bash source-path=SCRIPTDIR
# The one-node recipe of config_NF5688M6.sh (1 node x 8 GPUs x 408 = 3264 images per step), shared by NF5688M6,
# NF5488A5 and DGXA100. Source a system file, not this.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"

## System: 8 GPUs per node, 2 sockets with hyperthreading. DGXNSOCKET, DGXSOCKETCORES and DGXHT describe the
## machine only; run_and_time.sh reads the real topology from lscpu to bind ranks to cores.
export DGXNGPU=8
export DGXNSOCKET=2
export DGXHT=2

export BATCHSIZE=408  # per GPU
export LR=10.5
export WARMUP_EPOCHS=2
export NUMEPOCHS=37  # also the horizon of the poly(2) decay
export EVAL_OFFSET=2  # evals after epochs 3, 7, ..., 35, where a run that misses stops (the reference trained
                      # 36-37 unjudged; its comment "epoch no. 39" was wrong)
export WD=5.0e-05
export MOM=0.9

export DALI_CACHE_SIZE=0
export DALI_ROI_DECODE=1  # fused JPEG decode + random crop
export DALI_TMP_BUFFER_HINT=355568328  # 871491 * BATCHSIZE

# NCCL_MAX_RINGS is not a name the NCCL docs list (NCCL_MAX_NRINGS until 2.4, NCCL_MAX_NCHANNELS since), so it
# probably did nothing in the reference; kept as it was. To cap channels, set NCCL_MAX_NCHANNELS (README).
export NCCL_MAX_RINGS=8
export NCCL_BUFFSIZE=2097152  # 2 MiB (NCCL's default is 4 MiB)
export NCCL_NET_GDR_READ=1
export NCCL_COLLNET_ENABLE=0  # no SHARP on one node

export DGXNNODES=1
# minutes for sbatch -t: run.sub runs NEXP trials (default 5) in one job, each within the reference's hour
export WALLTIME=$(( ${NEXP:-5} * 60 + 10 ))
