"""Launcher settings shared by the launch, trial and Slurm tests and bench/slurm.py."""
from tests.support.data import TINY_CLASSES

# config/CPU.sh shrunk to a few seconds per trial; the threshold is reached at the first eval.
TINY = {"NUM_CLASSES": str(len(TINY_CLASSES)), "BATCHSIZE": "4", "NUMEPOCHS": "1", "WARMUP_EPOCHS": "0", "DALI_THREADS": "1",
        "ACCURACY_THRESHOLD": "0.0"}
# The same without dropping the page cache before each trial (the probes and trial tests run many).
TINY_KEEP_CACHES = {**TINY, "CLEAR_CACHES": "0"}
