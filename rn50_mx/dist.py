"""Processes and collectives: one small facade over Horovod, with a one-process fallback.

Nothing else in the package imports Horovod. Gradients are *summed* across ranks and the optimizer scales them by
1/global batch (spec §10.1): Horovod's DistributedTrainer divides its scale by the world size and
`trainer.step(batch_size)` divides by the per-rank batch.
"""
import itertools
import sys

import mxnet as mx

from .errors import InputError


class Single:
    """One process: every collective is the identity."""
    rank, local_rank, size = 0, 0, 1

    def allreduce_sum(self, array):
        return array

    def broadcast_params(self, params):
        pass

    def barrier(self):
        pass

    def trainer(self, params, optimizer, optimizer_params):
        return mx.gluon.Trainer(params, optimizer, optimizer_params, kvstore=None)


class Horovod:
    """One process per device; Gloo on CPU, NCCL on GPU, as Horovod was built."""

    def __init__(self, hvd):
        self.hvd = hvd
        hvd.init()
        self.rank, self.local_rank, self.size = hvd.rank(), hvd.local_rank(), hvd.size()

    def allreduce_sum(self, array):
        return self.hvd.allreduce(array, average=False, name=f"sum{next(_names)}")

    def broadcast_params(self, params):
        self.hvd.broadcast_parameters(params, root_rank=0)

    def barrier(self):
        """An allreduce every rank must reach (the reference avoids MPI_Barrier for the same reason)."""
        self.allreduce_sum(mx.nd.ones(1)).wait_to_read()

    def trainer(self, params, optimizer, optimizer_params):
        return self.hvd.DistributedTrainer(params, optimizer, optimizer_params)


_names = itertools.count()  # Horovod matches collectives across ranks by name


def init(settings):
    """Horovod when --kv-store horovod asks for it and it is installed; otherwise one process."""
    if settings.kv_store != "horovod":
        return Single()
    try:
        import horovod.mxnet as hvd
    except ImportError:
        print("rn50_mx: --kv-store horovod but Horovod is not installed: running as one process", file=sys.stderr)
        return Single()
    try:
        return Horovod(hvd)
    except ValueError as err:
        raise InputError(f"--kv-store horovod: {err}") from None
