"""MLPerf Training log lines (`:::MLLOG {...}`) through the official `mlperf_logging.mllog`.

Only rank 0 writes, except `init_start`, which every rank writes as the reference does (train_imagenet.py and result
logs). The keys and their order follow the NF5688M6 log; `python -m mlperf_logging.compliance_checker --usage training
--ruleset 1.0.0 LOG` accepts what this module writes.
"""
import logging
import os
import sys

from mlperf_logging import mllog
from mlperf_logging.mllog import constants as K

from .config import open_levers
from .errors import InputError
from .files import crc32, lock_file

_logger = mllog.get_mllogger()
_rank = 0
_file_lock = None  # the descriptor that owns the log file while this process writes it


# --- the log file: one run's story, owned by its writer ------------------------------------------------------

def log_mark(path):
    """What a log holds now, to know it again: its path, size and CRC-32 (continued_log checks them)."""
    size = os.path.getsize(path)
    return {"path": os.path.abspath(path), "size": size, "crc": crc32(path, size)}


def new_log(path):
    """Open `path` for a log that must hold one run only: created, or an existing empty file; an existing log is
    refused, never appended to. The returned descriptor holds an exclusive lock on the file for as long as it is
    open (the process's life), so that a second writer is refused instead of interleaving its lines."""
    fd = lock_file(path)
    if os.fstat(fd).st_size:
        os.close(fd)
        raise InputError(f"{path}: exists and holds a log; a log holds one run only: give a new file name "
                         "(or remove the old log)")
    return fd


def continued_log(path, mark, whose):
    """Open `path` to append a resumed run's lines to the log of the run it resumes (`whose`, which held `mark`,
    log_mark's, at its checkpoint): the file must begin with those very bytes, so that it stays one run's story;
    locked as new_log's. A last line cut short (a writer killed mid-line) is ended first: the appended lines start
    on lines of their own."""
    if not os.path.isfile(path):
        raise not_that_log(path, mark, whose, "it does not exist")
    fd = lock_file(path)
    size = os.fstat(fd).st_size
    why = (f"it has {size} bytes" if size < mark["size"] else
           f"its first {mark['size']} bytes differ" if crc32(path, mark["size"]) != mark["crc"] else None)
    if why:
        os.close(fd)
        raise not_that_log(path, mark, whose, why)
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.pwrite(fd, b"\n", size)
    return fd


def not_that_log(path, mark, whose, why):
    return InputError(f"{path}: not the MLPerf log of the run being resumed ({why}; {whose} was written when "
                      f"{mark['path']} had {mark['size']} bytes): a resumed run appends to its run's log; give "
                      "that file")


def configure(rank, filename="", resumes=None):
    """Log from this process only when it is rank 0; also write to `filename` when given, owned by this process
    until it exits (new_log): a new (or empty) file, never one holding another run; or, when `resumes` =
    (checkpoint folder, log_mark of the log at that checkpoint), the log of the run resumed, continued."""
    global _rank, _file_lock
    _rank = rank
    if filename and rank == 0:
        if resumes:
            _file_lock = continued_log(filename, resumes[1], resumes[0])
        else:
            _file_lock = new_log(filename)
        mllog.config(filename=filename)
        for handler in _logger.logger.handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handleError = unwritable(filename)
    mllog.config(default_stack_offset=2)


def unwritable(filename):
    """A log handler's handleError that stops the run. Python's logging prints a traceback for a line it cannot
    write and carries on, so a full disk left a log without run_stop and a run that exited 0."""
    def stop(record):
        err = sys.exc_info()[1]
        raise InputError(f"{filename}: cannot write the MLPerf log ({getattr(err, 'strerror', None) or err}); the "
                         "run stops: its log would not hold the whole run")
    return stop


def is_rank0():
    return _rank == 0


def start(key, value=None, metadata=None, every_rank=False):
    if _rank == 0 or every_rank:
        _logger.start(key, value, metadata)


def end(key, value=None, metadata=None):
    if _rank == 0:
        _logger.end(key, value, metadata)


def event(key, value=None, metadata=None):
    if _rank == 0:
        _logger.event(key, value, metadata)


def submission(s):
    """The submission_* keys and cache_clear that the reference's launcher writes before each trial."""
    event(K.SUBMISSION_BENCHMARK, K.RESNET)
    event(K.SUBMISSION_ORG, s.submission_org)
    event(K.SUBMISSION_DIVISION, s.submission_division)
    event(K.SUBMISSION_STATUS, K.ONPREM)
    event(K.SUBMISSION_PLATFORM, f"{s.dgxnnodes}x{s.dgxsystem}")
    event(K.CACHE_CLEAR, s.cache_cleared)


def hyperparameter_events(s):
    """(key, value) of the optimizer keys the closed-division rules check (training_1.0.0/closed_resnet*.yaml): what
    `hyperparameters` logs, and what rn50_mx.recipe hands to the compliance checker before a run."""
    factor = s.batch_factor(0)  # steps per update of the first epoch: 1 but with --batch-schedule (batch_change)
    events = [(K.MODEL_BN_SPAN, s.batch_size), (K.GLOBAL_BATCH_SIZE, s.global_batch * factor),
              (K.GRADIENT_ACCUMULATION_STEPS, factor)]
    if s.is_lars:
        return events + [
            (K.OPT_NAME, K.LARS),
            (K.LARS_EPSILON, s.lars_eps),
            (K.LARS_OPT_WEIGHT_DECAY, s.wd),
            (K.LARS_OPT_MOMENTUM, s.mom),
            (K.LARS_OPT_BASE_LEARNING_RATE, s.lr),
            (K.LARS_OPT_END_LR, s.end_lr),
            (K.LARS_OPT_LR_DECAY_POLY_POWER, 2),
            (K.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS, s.warmup_epochs),
            (K.LARS_OPT_LR_DECAY_STEPS, s.num_epochs),
        ]
    # the 1.0.0 rules name the SGD keys sgd_opt_* (closed_resnet_sgd.yaml); mllog has no constants for them
    return events + [
        (K.OPT_NAME, K.SGD),
        ("sgd_opt_base_learning_rate", s.lr),
        ("sgd_opt_end_learning_rate", s.end_lr),
        ("sgd_opt_learning_rate_decay_poly_power", 2),
        ("sgd_opt_learning_rate_decay_steps", s.num_epochs),
        ("sgd_opt_weight_decay", s.wd),
        ("sgd_opt_momentum", s.mom),
        (K.OPT_LR_WARMUP_EPOCHS, s.warmup_epochs),
    ]


def hyperparameters(s):
    """Log the optimizer keys of `hyperparameter_events`, then the value of each open-division lever the run turns
    on under its setting's name (config.open_levers; the open rules check no hyperparameter)."""
    for key, value in hyperparameter_events(s) + list(open_levers(s).items()):
        event(key, value)


def batch_change(s, epoch):
    """With --batch-schedule, at the start of 0-based `epoch` whose factor differs from the epoch before: the images
    per update from then on and the steps they sum, under the keys the first epoch's were logged with (the open
    rules count neither key; timing.py reads the first global_batch_size)."""
    factor = s.batch_factor(epoch)
    for key, value in ((K.GLOBAL_BATCH_SIZE, s.global_batch * factor), (K.GRADIENT_ACCUMULATION_STEPS, factor)):
        event(key, value, metadata={K.EPOCH_NUM: epoch + 1})
