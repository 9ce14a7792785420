"""Per GPU generation, what MLPerf-tuned NVIDIA MXNet ResNet-50 did in the MLPerf logs and configs: training
images/s per GPU (the self-test's comparison and the recipe's default speed) and the input-pipeline settings the
recipe starts a config from. None of these figures was measured on a GPU by this project.

Images/s per GPU: median epoch throughput / 8 in the result logs, training_results_v1.0 Inspur nf5688m6_mxnet
3,427-3,428 (tests/data/inspur_nf5688m6), training_results_v4.0 NVIDIA eos_ngc24.04_mxnet 7,160-7,172 (v3.1 eos:
about 7,050). Hardware JPEG decoder share: config_NF5688M6.sh 0.7 (v1.0), config_DGXH100_*.sh 0.99 (v4.0); DALI
threads 5 on 8 cores per GPU (NF5688M6), 8 on 14 (DGX H100); prefetch 2 (the recipe's start) and 3 (DGX H100).
Memory: the 80 GB models of both (A100-SXM4-80GB, H100 SXM5 80GB).
"""
from collections import namedtuple

Anchor = namedtuple("Anchor", "key label img_per_s hw_decoder_load prefetch memory_mib")

# memory_mib: the GPU's memory as nvidia-smi's memory.total gives it (the recipe's default --gpu-memory)
ANCHORS = (
    Anchor("H100", "H100 SXM", 7160, 0.99, 3, 81559),
    Anchor("A100", "A100-80GB", 3431, 0.7, 2, 81920),
)
BY_KEY = {a.key: a for a in ANCHORS}
# The per-image scratch of DALI's resize, times the per-GPU batch (v4.0 configs: "871491*batch_size").
TMP_BUFFER_PER_IMAGE = 871491


def for_gpu_names(names):
    """The anchor of the first GPU model among `names` (nvidia-smi's names) that has one, else None."""
    return next((a for a in ANCHORS if any(a.key in name for name in names)), None)


def dali_threads(cores_per_gpu):
    """DALI's CPU threads per GPU to start from: about half the cores, 2 to 8 (the submissions: 5 on 8 cores per
    GPU, 8 on 14). The tuner measures the right number on the machine."""
    return min(8, max(2, cores_per_gpu // 2 + 1))
