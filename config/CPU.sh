# shellcheck shell=bash source-path=SCRIPTDIR
# Any x86 CPU machine: the embedded default (Fashion-MNIST, `python -m rn50_mx.prep_rec fashion-mnist DIR`),
# one process, fp32, NCHW. What `make demo` and CI run. The hyperparameters are placeholders until tuned.
export DEVICE=cpu
export DTYPE=float32
export INPUT_LAYOUT=NCHW
export IMAGE_SHAPE=3,32,32
export NUM_CLASSES=10

export BATCHSIZE=64
export LR=4.0  # placeholder, to be tuned
export WARMUP_EPOCHS=1  # placeholder, to be tuned
export NUMEPOCHS=4  # placeholder, to be tuned
export ACCURACY_THRESHOLD=0.80  # placeholder, to be tuned
export EVAL_PERIOD=1  # evaluate after every epoch
export EVAL_OFFSET=0

export DALI_THREADS=2
export KVSTORE=device
export DGXNGPU=1
export DGXNNODES=1
DGXSYSTEM=$(basename "${BASH_SOURCE[0]}" .sh)
export DGXSYSTEM
