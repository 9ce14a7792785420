# rn50-mx in NVIDIA's MXNet container. The base image brings MXNet, Horovod (MPI and NCCL), OpenMPI and CUDA; this
# adds a newer DALI, the rn50_mx package, mlperf-logging and the launch scripts.
#   docker build -t rn50-mx .    then    CONT=rn50-mx ./run_with_docker.sh   (README)
#
# Base: NGC MXNet 22.11-py3, the newest release whose notes we could read that lists MXNet (1.9.1), DALI (1.18.0)
# and Horovod (0.24.2) together, with CUDA 11.8, NCCL 2.15.5 and Python 3.8. NGC published its last MXNet
# containers in 2023 (public Dockerfiles use 23.03-py3 and 23.04-py3; we have not checked what those ship), and
# DALI 1.39 is the last DALI with the MXNet plugin. The v1.0 submission used 21.04-py3 (MXNet 1.8, NCCL 2.9.6).
# Another base: docker build --build-arg FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:<tag> .
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:22.11-py3
FROM ${FROM_IMAGE_NAME}

WORKDIR /workspace/rn50
COPY setup.py ./
COPY rn50_mx/ rn50_mx/
# --no-deps keeps the image's MXNet, Horovod and numpy; mlperf-logging is pinned as in setup.py. DALI is replaced:
# rn50_mx hands DALI's batches to MXNet without a copy, which needs the dynamic executor (DALI >= 1.44; the
# image's 1.18 recycles output buffers while MXNet may still read them) and reads GPU image shapes on the CPU.
# 1.48 is the newest CUDA 11 build we expect to still install on the image's Python 3.8 (not built here).
RUN pip install --no-cache-dir --no-deps . \
 && pip install --no-cache-dir "mlperf-logging==4.1.68" "tqdm==4.67.1" \
 && pip install --no-cache-dir --extra-index-url https://pypi.nvidia.com "nvidia-dali-cuda110==1.48.0"
COPY run_and_time.sh ./
COPY config/ config/

# The runtime settings of the reference's image (spec §4). Dropped: MXNET_USE_TENSORRT=0 (TensorRT inference only).
# MXNET_CUDNN_AUTOTUNE_DEFAULT=0: cuDNN's heuristic picks the convolution algorithms, so no autotuning runs
# inside the timed region (the first eval batch is a new shape). SHARP_COLL_*: used only when SHARP is enabled.
ENV MXNET_UPDATE_ON_KVSTORE=0 \
    MXNET_EXEC_ENABLE_ADDTO=1 \
    MXNET_ASYNC_GPU_ENGINE=1 \
    MXNET_GPU_WORKER_NTHREADS=1 \
    MXNET_GPU_COPY_NTHREADS=1 \
    MXNET_CUDNN_AUTOTUNE_DEFAULT=0 \
    HOROVOD_ENABLE_ASYNC_COMPLETION=1 \
    HOROVOD_BATCH_D2D_MEMCOPIES=1 \
    HOROVOD_GROUPED_ALLREDUCES=1 \
    OMPI_MCA_btl=^openib \
    OMP_NUM_THREADS=1 \
    OPENCV_FOR_THREADS_NUM=1 \
    SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD=0 \
    SHARP_COLL_LOCK_ON_COMM_INIT=1
