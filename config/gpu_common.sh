# shellcheck shell=bash source-path=SCRIPTDIR
# Shared by every GPU config (NF5688M6, NF5488A5, DGXA100, DGXA100_multi_8x8x204 and those `python -m rn50_mx.recipe`
# writes, any GPU and node count): the GPU path, the fixed part of the LARS recipe and the runtime knobs; the machine
# (GPUs per node, sockets) is the system file's. Values are the
# reference's (config_NF5688M6.sh and config_NF5688M6_common.sh). Source a system file, not this.

## How rn50_mx runs on these machines (the reference passed these as fixed flags in run_and_time.sh)
export DEVICE=gpu
export DTYPE=float16
export INPUT_LAYOUT=NHWC
export IMAGE_SHAPE=4,224,224  # RGB plus one zero channel, the reference's padded input

## Training recipe: the parts every config shares
export NUMEXAMPLES=1281167  # ImageNet's train images, a constant as in the submission: no data read before run_start
export OPTIMIZER=sgdwfastlars
export KVSTORE=horovod
export LRSCHED=pow2
export LARSETA=0.001
export LABELSMOOTHING=0.1
export EVAL_PERIOD=4
# NETWORK=resnet-v1b-stats-fl: its NormConv units are RN50_NORMCONV (default 1, where MXNet has the operators).

## DALI
export DALI_DONT_USE_MMAP=0  # 0 for local disks (/raid), 1 for lustre
export DALI_NVJPEG_MEMPADDING=256  # MiB
export DALI_PREALLOCATE_WIDTH=5980  # HW JPEG decoder preallocation hints
export DALI_PREALLOCATE_HEIGHT=6430
export DALI_DECODER_BUFFER_HINT=1315942  # 1196311 * 1.1 bytes
export DALI_CROP_BUFFER_HINT=165581  # 150528 * 1.1
export DALI_NORMALIZE_BUFFER_HINT=441549  # 401408 * 1.1

## Horovod (gradients: one fused NCCL allreduce per step)
export HOROVOD_CYCLE_TIME=0.1  # ms between background cycles
export HOROVOD_FUSION_THRESHOLD=67108864  # 64 MiB: holds the ~51 MB of fp16 gradients
export HOROVOD_NUM_NCCL_STREAMS=2  # the reference's common file said 1, every config 2
export MXNET_HOROVOD_NUM_GROUPS=1  # gradients in one grouped allreduce call per step
# Horovod 0.28.1's stall check (horovod/common/stall_inspector.cc, run by rank 0 in each cycle of its background loop,
# controller.cc:139-150): every HOROVOD_STALL_CHECK_TIME_SECONDS it names on stderr the ranks that have not submitted
# a tensor the others have (stall_inspector.cc:42-108): a rank whose training thread is stuck (a reader, a data worker)
# while Horovod's own thread still cycles, which rn50_mx's progress watchdog on rank 0 cannot name. Past
# HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (obeyed only above the check time: stall_inspector.cc:35-40, horovodrun --help's
# "--stall-check-shutdown-time-seconds ... Shutdown will only take place if this value is greater than the warning
# time") it shuts Horovod down on every rank, whose waiting collectives then fail ("Horovod has been shut down"): the
# job ends, exit 1, with no `stalled` line and no requeue. Neither acts when a rank's Horovod thread is blocked too (a
# stopped process, a hung NCCL kernel: rank 0's own coordination waits). So the shutdown is a backstop only, at twice
# the watchdog's floor (RN50_STALL_SECONDS, 600 s by default; rn50_mx refuses a shutdown at or below it): the
# watchdog's verdict (every thread's stack, exit 79, run.sub's requeue) comes first (docs/reliability.md).
export HOROVOD_STALL_CHECK_TIME_SECONDS=60
export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=1200

## MXNet. MXNET_ENABLE_CUDA_GRAPHS is read by stock MXNet 1.9.1 too (src/executor/cuda_graphs.h): GPU op segments
## of blocks hybridized with static_alloc/static_shape run conventionally once, then are captured and replayed;
## train.warm_up runs both graphs twice before run_start. The CUDNN_NHWC_BN knobs exist in NGC MXNet only.
export MXNET_OPTIMIZER_AGGREGATION_SIZE=54  # tensors per multi-tensor optimizer call (--optimizer-aggregation-size)
export MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD=999
export MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD=999
export MXNET_ENABLE_CUDA_GRAPHS=1
export MXNET_CUDNN_NHWC_BN_HEURISTIC_FWD=1
export MXNET_CUDNN_NHWC_BN_HEURISTIC_BWD=1
export MXNET_CUDNN_NHWC_BN_ADD_HEURISTIC_FWD=0  # the reference's common file said 1, every config 0
export MXNET_CUDNN_NHWC_BN_ADD_HEURISTIC_BWD=0
# The reference's and NVIDIA's v4.0 24.04 configs set it; in NVIDIA's public MXNet fork it widens NormConvolution's
# cuDNN support below cuDNN 8.0.4 (cudnn_norm_convolution-inl.h), inert after that: kept as they run it.
export MXNET_EXTENDED_NORMCONV_SUPPORT=1

## MPI and NCCL
export OMPI_MCA_btl="^openib"  # no openib BTL (the reference: avoids a Horovod/NCCL deadlock at 96 nodes)
export NCCL_SOCKET_IFNAME=""
