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
