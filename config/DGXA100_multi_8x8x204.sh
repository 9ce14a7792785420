# shellcheck shell=bash source-path=SCRIPTDIR
# 8 NVIDIA DGX A100 nodes (64 GPUs, InfiniBand): 8 nodes x 8 GPUs x 204 = 13056 images per step. Submit run.sub.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"

## System: 8 GPUs per node, 2 sockets with hyperthreading. DGXNSOCKET, DGXSOCKETCORES and DGXHT describe the
## machine only; run_and_time.sh reads the real topology from lscpu to bind ranks to cores.
export DGXNGPU=8
export DGXNSOCKET=2
export DGXHT=2

export BATCHSIZE=204  # per GPU
export LR=12.8
export WARMUP_EPOCHS=9
export NUMEPOCHS=48
export EVAL_OFFSET=0  # evals after epochs 1, 5, ..., 45; a run that misses at 45 stops there (none judges 46-48)
export WD=2.5e-05
export MOM=0.94

export DALI_PREFETCH_QUEUE=3
export DALI_CACHE_SIZE=12288  # MB per pipeline: decoded images are cached after the first epoch
export DALI_ROI_DECODE=0  # the reference left it at its default 0: the cache takes the decode-then-crop path
export DALI_TMP_BUFFER_HINT=44446041  # the reference's value (its comment says 871491 * batch, which is 177784164)
# DALI_THREADS and DALI_HW_DECODER_LOAD: not set by the reference, so its defaults 3 and 0, which are ours too.
# NCCL_MAX_RINGS, NCCL_BUFFSIZE, NCCL_NET_GDR_READ, NCCL_COLLNET_ENABLE: not set by the reference (NCCL defaults).

export DGXSOCKETCORES=64  # 2x AMD EPYC 7742 per node
export DGXNNODES=8
# minutes for sbatch -t: run.sub runs NEXP trials (default 5) in one job, each within the reference's 40 minutes
export WALLTIME=$(( ${NEXP:-5} * 40 + 10 ))
DGXSYSTEM=$(basename "${BASH_SOURCE[0]}" .sh)
export DGXSYSTEM
