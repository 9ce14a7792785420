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
COPY setup.py constraints.txt ./
COPY rn50_mx/ rn50_mx/
# --no-deps keeps the image's MXNet, Horovod and numpy (kept below 1.24, which MXNet 1.9.1 needs, when a dependency
# asks for numpy). The packages added, rn50_mx's own dependencies and DALI, take their versions from constraints.txt,
# the one pin file (its Python 3.8 lines where they differ; their dependencies resolve for 3.8). DALI is replaced:
# rn50_mx hands DALI's batches to MXNet without a copy, which needs the dynamic executor (DALI >= 1.44; the image's
# 1.18 recycles output buffers while MXNet may still read them) and reads GPU image shapes on the CPU. 1.48 is the
# newest CUDA 11 build we expect to still install on Python 3.8 (not built here: NVIDIA's index is not reachable).
RUN pip install --no-cache-dir --no-deps . \
 && grep -iE "^(mlperf-logging|tqdm|pillow|scipy|nvidia-dali-cuda110)==" constraints.txt > /tmp/image-pins.txt \
 && echo "numpy<1.24" > /tmp/image-cap.txt \
 && pip install --no-cache-dir --extra-index-url https://pypi.nvidia.com -c /tmp/image-cap.txt -r /tmp/image-pins.txt
COPY run_and_time.sh ./
COPY config/ config/

# The build fails here when the stack cannot run the GPU path: MXNet without CUDA, cuDNN or NCCL, Horovod without
# NCCL, DALI older than 1.44 or without the dynamic executor, a module of rn50_mx that does not import (a missing
# package, or one that needs a newer Python than the image's). No GPU is needed: it reads versions and build features. The CUDA compat library
# stands in for the driver that `docker build` does not have. CHECK_STACK=0 skips it (say why in an issue).
ARG CHECK_STACK=1
RUN if [ "$CHECK_STACK" = 1 ]; then \
      LD_LIBRARY_PATH="/usr/local/cuda/compat/lib:${LD_LIBRARY_PATH:-}" python -m rn50_mx.selftest --stack-only --expect-gpu; \
    fi

# The runtime settings of the reference's image (spec §4). Dropped: MXNET_USE_TENSORRT=0 (TensorRT inference only).
# MXNET_CUDNN_AUTOTUNE_DEFAULT=1 (the reference: 0): cuDNN times its convolution algorithms on the first run of each
# shape and keeps the fastest. Every shape of the run is seen before run_start: val batches are padded to the train
# batch, and the warm-up runs two training steps and two eval forwards (train.warm_up). Autotuning therefore costs
# the timed region nothing, and heuristics (0) can only pick the same algorithms or slower ones.
# SHARP_COLL_*: used only when SHARP is enabled.
ENV MXNET_UPDATE_ON_KVSTORE=0 \
    MXNET_EXEC_ENABLE_ADDTO=1 \
    MXNET_ASYNC_GPU_ENGINE=1 \
    MXNET_GPU_WORKER_NTHREADS=1 \
    MXNET_GPU_COPY_NTHREADS=1 \
    MXNET_CUDNN_AUTOTUNE_DEFAULT=1 \
    HOROVOD_ENABLE_ASYNC_COMPLETION=1 \
    HOROVOD_BATCH_D2D_MEMCOPIES=1 \
    HOROVOD_GROUPED_ALLREDUCES=1 \
    OMPI_MCA_btl=^openib \
    OMP_NUM_THREADS=1 \
    OPENCV_FOR_THREADS_NUM=1 \
    SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD=0 \
    SHARP_COLL_LOCK_ON_COMM_INIT=1
