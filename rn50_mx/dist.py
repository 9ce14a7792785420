"""Processes and collectives: one small facade over Horovod, with a one-process fallback.

Nothing else in the package imports Horovod. One process per device: on GPUs each rank uses GPU `local_rank`, or
the one GPU it sees, and Horovod reduces with NCCL; on CPUs with Gloo, as Horovod was built. Horovod and NCCL knobs
(HOROVOD_*,
NCCL_*) reach them through the environment untouched: the config files export them and the libraries read them.

Gradients are *summed* across ranks and the optimizer scales them by 1/global batch (as the reference's
optimizer does): Horovod's DistributedTrainer divides its scale by the world size and `trainer.step(batch_size)`
divides by the per-rank batch. Initial parameters, BatchNorm running statistics included, are broadcast from rank 0.

Failures (horovodrun --gloo, Horovod 0.28.1, measured; tests/test_dist.py checks the first and the last):
- a rank dies (SIGKILL, crash, non-zero exit): its peers' Gloo connections reset, so their next collective
  fails ("Horovod has been shut down"), and horovodrun, which watches every rank, prints "Process 1 exit with
  status code 137", stops the others (SIGTERM, then SIGKILL after 5 s) and exits 1 naming the first rank that
  failed (0.4 s after the kill, measured);
- a rank hangs without dying: its peers' collectives give up after HOROVOD_GLOO_TIMEOUT_SECONDS (default 30),
  then as above (a stopped rank with the timeout at 5 s: the job ended in 16 s);
- SIGTERM or Ctrl-C on horovodrun: it stops every rank the same way, within seconds.
Ranks keep the default signal actions on purpose: a SIGTERM ends a rank at once, which is the first case,
whereas a handler that waited for a step boundary (DLE's PartitionSignalHandler) could wait on a peer that is
already gone. A run that is stopped has no run_stop line; MLPerf counts it as not finished either way. Only with
--checkpoint-dir do SIGTERM and SIGUSR1 ask for a stop at a step the ranks agree on (rn50_mx/checkpoint/); a peer
that is gone then fails that agreement's allreduce as above.
"""
import itertools
import sys

import mxnet as mx

from . import standin
from .errors import InputError

HOST = mx.cpu(0)  # small host-side arrays: seeds, counts and barriers, reduced by Horovod's CPU path (MPI or Gloo)


def context(settings, local_rank):
    """The one device of this process, where the model, every batch and every array of the step and the eval
    live: its GPU (gpu_index), or the CPU. train.run makes it the default context as well.

    On the GPU it also becomes the calling thread's current CUDA device. MXNet's engine threads set theirs, but
    a CUDA call made on this thread without a device (DALI's, e.g. a DLPack export without a stream, which waits
    on the legacy stream of the current device: dali/python/backend_impl.cc ToDLMTensor) would open a context on
    GPU 0 from every rank.

    With --standin (python -m rn50_mx.rehearse, and the tests' runs) it is the rank's stand-in device, cpu(1 + local
    rank), whatever the settings' device, with the stand-in build installed first: the one switch between a GPU
    and its rehearsal."""
    if settings.standin != "off":
        return standin.use(settings.standin, local_rank, settings.standin_sm)
    if settings.device != "gpu":
        return mx.cpu()
    index = gpu_index(local_rank, mx.context.num_gpus())
    use_device(index)
    return mx.gpu(index)


def gpu_index(local_rank, visible):
    """The GPU of local rank `local_rank` among `visible` GPUs: the one there is when the process sees exactly one
    (Slurm giving each task its own GPU through CUDA_VISIBLE_DEVICES), else GPU `local_rank` (one process per GPU
    of the node)."""
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise InputError(f"local rank {local_rank} needs GPU {local_rank}, but {visible} are visible "
                         "(one process per GPU, or one GPU per process)")
    return local_rank


def use_device(index):
    """cudaSetDevice(index) on this thread, through DALI's binding (dali/python/backend_impl.cc,
    SetCUDACurrentDevice): DALI's CUDA runtime is the one whose current device DALI's calls consult."""
    from nvidia.dali import backend

    backend.SetCUDACurrentDevice(index)


class Collectives:
    """What both worlds build on their allreduce_sum."""

    def host_sum(self, values):
        """The sum over ranks of a few host integers (seeds, counts, flags), as an int32 array on the host (int32 as
        the reference's MPI reductions); not waited for: read it (asnumpy, asscalar) when the value is needed, as
        checkpoint.Stops reads its own check (allreduce_sum of a few floats) a check period later, so that the allreduce
        overlaps the steps."""
        return self.allreduce_sum(mx.nd.array(values, ctx=HOST, dtype="int32"))


class Single(Collectives):
    """One process: every collective is the identity."""
    rank, local_rank, size = 0, 0, 1

    def allreduce_sum(self, array):
        return array

    def broadcast_params(self, params):
        pass

    def barrier(self):
        pass

    def average_in_place(self, arrays):
        pass

    def trainer(self, params, optimizer, optimizer_params):
        return mx.gluon.Trainer(params, optimizer, optimizer_params, kvstore=None)


class Horovod(Collectives):
    """One process per device; Gloo on CPU, NCCL on GPU, as Horovod was built."""

    def __init__(self, hvd, num_groups):
        self.hvd, self.num_groups = hvd, num_groups
        hvd.init()
        self.rank, self.local_rank, self.size = hvd.rank(), hvd.local_rank(), hvd.size()

    def allreduce_sum(self, array):
        """The element-wise sum over ranks (a new array); every rank must call it, in the same order."""
        return self.hvd.allreduce(array, average=False, name=f"sum{next(_names)}")

    def broadcast_params(self, params):
        """Rank 0's values into every rank's `params` (a ParameterDict: `net.collect_params()` holds the
        BatchNorm running mean and variance too, so they are broadcast with the weights), as one grouped sum to
        which the other ranks add zeros (exact: x + 0 = x). Not Horovod's broadcast: in 0.28.1 it reads the
        op's name after handing the op to the background thread (common/operations.cc, EnqueueTensorBroadcast,
        `LOG(TRACE) << "Enqueued " << name` after AddToTensorQueue), which may have completed it, and MXNet then
        freed the name with the op: a rank crashed at start-up (SIGSEGV, the stack in that line), once in about 120
        launches here."""
        arrays = [params[name].data() for name in sorted(params.keys())]
        if self.rank != 0:
            for array in arrays:
                array[:] = 0
        self.hvd.grouped_allreduce_(arrays, average=False, name=f"params{next(_names)}")

    def barrier(self):
        """An allreduce every rank must reach (the reference avoids MPI_Barrier for the same reason)."""
        self.host_sum([1]).wait_to_read()

    def average_in_place(self, arrays):
        """Each array replaced by its mean over ranks, in one grouped allreduce (NVIDIA's v4.0 code averages the
        BatchNorm running statistics so before each eval)."""
        self.hvd.grouped_allreduce_(arrays, average=True, name=f"mean{next(_names)}")

    def trainer(self, params, optimizer, optimizer_params):
        """Each step allreduces the gradients in `num_groups` grouped calls (the reference: 1), priorities
        descending so that the first layers' gradients, which the next forward needs first, go first."""
        return self.hvd.DistributedTrainer(params, optimizer, optimizer_params, num_groups=self.num_groups)


def check_world(settings, d):
    """Stops this rank when the ranks that met are not the DGXNNODES x DGXNGPU the config asks for: tasks that a
    launcher started but that did not meet (Horovod built with Gloo only under srun: its Gloo controller without
    horovodrun's rendezvous assumes one process, horovod/common/gloo/gloo_context.cc) each see a world of one and
    would otherwise run as independent full trainings. Every rank computes the same comparison, so all of them
    stop, before run_start."""
    expected = settings.world_size
    local_size = d.hvd.local_size()
    if d.size == expected and local_size == settings.dgxngpu:
        return
    d.hvd.shutdown()
    raise InputError(f"rank {d.rank}: {d.size} rank(s) met ({local_size} on this node), but DGXNNODES x DGXNGPU = "
                     f"{settings.dgxnnodes} x {settings.dgxngpu} = {expected} ({settings.dgxngpu} per node): "
                     "start one task per device, and under srun use --mpi=pmix with Horovod built with MPI")


_names = itertools.count()  # Horovod matches collectives across ranks by name


def init(settings):
    """Horovod when --kv-store horovod asks for it and it is installed; otherwise one process."""
    if settings.kv_store != "horovod":
        return Single()
    try:
        import horovod.mxnet as hvd
    except ImportError:
        if settings.world_size > 1:
            raise InputError("--kv-store horovod: Horovod is not installed, and one process cannot stand for "
                             f"{settings.dgxnnodes} node(s) x {settings.dgxngpu} processes") from None
        print("rn50_mx: --kv-store horovod but Horovod is not installed: running as one process", file=sys.stderr)
        return Single()
    try:
        d = Horovod(hvd, settings.horovod_num_groups)
    except ValueError as err:
        raise InputError(f"--kv-store horovod: {err}") from None
    check_world(settings, d)
    if settings.device == "gpu" and settings.standin == "off":
        try:
            gpu_index(d.local_rank, mx.context.num_gpus())
        except InputError as err:
            raise InputError(f"rank {d.rank}: {err}") from None
    return d
