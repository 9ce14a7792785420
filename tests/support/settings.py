"""Settings shared by the tests: the launchers' tiny variables (launch, trial and Slurm tests, bench/slurm.py), the
small settings object of the unit tests and the open-division lever tests' settings."""
import os

from rn50_mx.config import Settings
from rn50_mx.rehearse.stages import CYCLE_MS
from tests.support.data import TINY_CLASSES

# The depth of the tests' trainings (--num-layers): one bottleneck a stage, ResNet-50's code on a network that trains
# in half the CPU (a 2-epoch run of runs.FLAGS: 1.9 CPU-seconds against 3.5 at 50, and 2.45 at 26). What they assert is
# about runs (a stop, a resume, a log, a launch), not the network: test_model and test_optim build ResNet-50 itself.
SHRUNK_LAYERS = 14
# config/CPU.sh shrunk to a few seconds per trial; the threshold is reached at the first eval.
TINY = {"NUM_CLASSES": str(len(TINY_CLASSES)), "RN50_NUM_LAYERS": str(SHRUNK_LAYERS), "BATCHSIZE": "4",
        "NUMEPOCHS": "1", "WARMUP_EPOCHS": "0", "DALI_THREADS": "1", "ACCURACY_THRESHOLD": "0.0",
        "OMP_NUM_THREADS": "1"}
# The same without dropping the page cache before each trial (the probes and trial tests run many).
TINY_KEEP_CACHES = {**TINY, "CLEAR_CACHES": "0"}
# Horovod ranks that a launcher starts (run_and_time.sh's horovodrun, run.sub's srun), polling Horovod's cycle every
# CYCLE_MS as procs.gloo_ranks' ranks do: Horovod reads HOROVOD_CYCLE_TIME itself, so no code path changes, but at
# its default a rank waiting for its peer spins (under srun's MPI most of all): test_slurm.py alone, the machine's
# busy CPU 76 CPU-seconds against 65 with it (two runs each, side by side, quiet).
HOROVOD = {"KVSTORE": "horovod", "HOROVOD_CYCLE_TIME": str(CYCLE_MS)}


def small_settings(rec_prefix, **changes):
    """config/CPU.sh shrunk to conftest's 21-image small_rec: 3 classes at 32x32, batch 4, one DALI thread."""
    return Settings(**{"data_train": rec_prefix + ".rec", "num_classes": 3, "image_shape": "3,32,32", "batch_size": 4,
                       "dali_threads": 1, "seed": 1, **changes})


# The open-division lever tests' run (test_open, test_progressive): the three_classes set at 32x32, logged as open.
OPEN = dict(num_classes=3, image_shape="3,32,32", num_layers=SHRUNK_LAYERS, batch_size=4, dali_threads=1,
            min_random_area=1.0, seed=3, submission_division="open")


def open_settings(three_classes, **changes):
    return Settings(data_train=os.path.join(three_classes, "train.rec"),
                    data_val=os.path.join(three_classes, "val.rec"), **dict(OPEN, **changes))


# The run conftest's stopped_checkpoints stops after its first epoch: synthetic, seconds; a resume gives the same flags.
STOPPED_RUN = ["--synthetic", "1", "--num-examples", "8", "--batch-size", "4", "--num-epochs", "2", "--warmup-epochs",
               "0", "--eval-offset", "0", "--image-shape", "3,32,32", "--num-classes", "3", "--accuracy-threshold",
               "1.0", "--num-layers", str(SHRUNK_LAYERS)]
