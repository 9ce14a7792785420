# rn50-mx in NVIDIA's MXNet container. The base image brings MXNet, Horovod (MPI and NCCL), OpenMPI and CUDA; this
# adds a newer DALI, the rn50_mx package, mlperf-logging and the launch scripts.
#   docker build -t rn50-mx .    then    CONT=rn50-mx ./run_with_docker.sh   (README)
# The CPU image, on a base made from Debian's packages that brings what NVIDIA's does for the CPU (bookworm's Python
# 3.11 in /opt/venv, MXNet 1.9.1, numpy, Horovod with Gloo and Open MPI): `make image-cpu` (docs/container.md) runs
#   docker build --build-arg FROM_IMAGE_NAME=<that base> --build-arg IMAGE_PYTHON=3.11 --build-arg EXPECT_GPU= ...
#
# Base: NGC MXNet 24.04-py3, the image of NVIDIA's MLPerf Training v4.0 ResNet-50 results on H100 and H200
# (training_results_v4.0 NVIDIA/benchmarks/resnet/implementations/eos_ngc24.04_mxnet/Dockerfile). NVIDIA's release
# notes for its neighbours 24.05 and 24.06 say: for Hopper (H100) and earlier GPUs (A100, V100, T4), compute
# capability 6.0 and later; MXNet 1.9.1, Ubuntu 22.04 with Python 3.10, CUDA 12.4.1, cuDNN 9, NCCL 2.21.5,
# Horovod 0.28, DALI 1.37.1; driver 545 or later (data-centre GPUs: R470, R525, R535 too). 24.05-py3 and 24.06-py3
# take the same pins (the same Python): docker build --build-arg FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:24.06-py3 .
# The 22.xx images (Python 3.8, CUDA 11) are for Ampere and older only, and no DALI >= 1.44 installs there from PyPI.
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/mxnet:24.04-py3
FROM ${FROM_IMAGE_NAME}
# The Python the pins in constraints.txt were resolved for (tests/test_image.py); the build stops on another one.
ARG IMAGE_PYTHON=3.10

# numactl: run_and_time.sh binds each rank to its GPU's NUMA node and a share of its cores with it; without it the
# ranks run unbound (slower, said in one line). Whether the base has it is not public (NVIDIA's v4.0 run binds through
# the image's bindpcie, training_results_v4.0 eos_ngc24.04_mxnet/run_and_time.sh:187): installed unless it is there.
# Not pinned: one Dockerfile builds on Ubuntu's and on Debian's base, each with its own release of it.
# hadolint ignore=DL3008
RUN command -v numactl >/dev/null || { apt-get update && apt-get install -y --no-install-recommends numactl \
      && rm -rf /var/lib/apt/lists/*; }

WORKDIR /workspace/rn50
COPY setup.py constraints.txt ./
COPY rn50_mx/ rn50_mx/
# --no-deps keeps the image's MXNet, Horovod and numpy (constraints.txt's 1.23.5 when a dependency asks for
# numpy: MXNet 1.9.1 needs numpy < 1.24). The packages added, rn50_mx's own dependencies and DALI, and all they
# pull in, take their versions from constraints.txt, the one pin file, and come from PyPI. DALI is replaced:
# rn50_mx hands DALI's batches to MXNet without a copy on the CPU and with one copy into its own buffers on
# the GPU, which needs the dynamic executor (DALI >= 1.44; the image's own, 1.37.1 in 24.05, recycles output
# buffers while MXNet may still read them) and reads GPU image shapes on the CPU. 2.4.0 is the CPU stack's DALI too.
RUN python -c "import sys; v = '%d.%d' % sys.version_info[:2]; sys.exit(None if v == '${IMAGE_PYTHON}' else \
      'this base has Python ' + v + ', the pins in constraints.txt are for ${IMAGE_PYTHON}: resolve them for it')" \
 && pip install --no-cache-dir --no-deps . \
 && grep -iE "^(mlperf-logging|tqdm|pillow|scipy|optuna|matplotlib|nvidia-dali-cuda120)==" constraints.txt > /tmp/image-pins.txt \
 && pip install --no-cache-dir -c constraints.txt -r /tmp/image-pins.txt
COPY run_and_time.sh ./
COPY config/ config/

# The build fails here when the stack cannot run the GPU path: MXNet without CUDA, cuDNN or NCCL, Horovod without
# NCCL, DALI older than 1.44 or without the dynamic executor, a module of rn50_mx that does not import (a missing
# package, or one that needs a newer Python than the image's). No GPU is needed: it reads versions and build
# features, and lists the GPU architectures libmxnet.so has kernels for (cuobjdump). The CUDA compat library
# stands in for the driver that `docker build` does not have. CHECK_STACK=0 skips it (say why in an issue). On the
# CPU base, EXPECT_GPU is empty: the same check in its CPU form (the stack table, every module imports).
ARG CHECK_STACK=1
ARG EXPECT_GPU=--expect-gpu
RUN if [ "$CHECK_STACK" = 1 ]; then \
      LD_LIBRARY_PATH="/usr/local/cuda/compat/lib:${LD_LIBRARY_PATH:-}" \
        python -m rn50_mx.selftest --stack-only ${EXPECT_GPU}; \
    fi

# The runtime settings of the reference's image (the v1.0 submission's Dockerfile). Dropped: MXNET_USE_TENSORRT=0
# (TensorRT inference only).
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
