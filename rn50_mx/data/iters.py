"""The MXNet side: DataIters over DALI pipelines (or synthetic batches), and how a batch reaches MXNet."""
import ctypes
import os
import sys
import tempfile
import time

import mxnet as mx
from mxnet.base import _LIB, check_call
import numpy as np
from nvidia.dali import types

from ..errors import InputError
from .pipeline import READER, build_pipeline, sticks_to_shard
from .records import (BadRecord, check_labels, data_errors, data_paths, index_without, readable, steps_per_epoch,
                      train_samples, val_pads)

RING = 2  # MXNet buffers per iterator on the GPU (Handover): a batch is written while the previous one is read


def input_memory(s, val=True):
    """Device bytes the input holds at most per process: per iterator (train, and val unless val=False), DALI's
    prefetch queue of batches plus the RING MXNet buffers the GPU hand-over copies into (the val ones stay
    between evals). Images at s.input_dtype; labels are 4 bytes a sample."""
    def batch(chw):
        return s.batch_size * (int(np.prod(chw)) * np.dtype(s.input_dtype).itemsize + 4)

    rings = sum(batch(s.image_chw[:1] + hw) for hw in s.train_sizes)  # a ring per training size
    return s.dali_prefetch_queue * batch(s.image_chw) + RING * rings + (
        (s.dali_prefetch_queue + RING) * batch(s.eval_chw) if val else 0)


def batch_shape(s, train=True, hw=None):
    """(batch, C, H, W) or (batch, H, W, C), as settings.input_layout says: of the training images (at `hw`, one of
    the progressive sizes, else IMAGE_SHAPE's), or with train=False of the val images (--val-crop)."""
    c, h, w = s.image_chw if train else s.eval_chw
    h, w = hw or (h, w)
    return (s.batch_size, c, h, w) if s.input_layout == "NCHW" else (s.batch_size, h, w, c)


class Handover:
    """How DALI's outputs (images, labels) become MXNet arrays on ctx.

    CPU (copy=False): DLPack shares DALI's host buffer, no copy. MXNet's CPU engine marks an operation complete
    only after it ran, and each pushed operation holds its input arrays, so the buffer goes back to DALI (the
    chunk's deleter, MXNet 1.9.1 include/mxnet/ndarray.h, Chunk(const TBlob&, int, deleter)) only once nothing
    reads it; DALI's dynamic executor gives every batch its own buffer.

    GPU (copy=True): a copy into one of RING persistent MXNet buffers, as DALI's MXNet plugin did. The buffer is
    reused only after MXNDArrayWaitToWrite (MXNet's readers of it are done: the batch RING steps back, which the
    engine has finished unless the host runs that far ahead). The batch is complete when pipe.run() returns: run()
    without a cuda_stream is host-synchronous (DALI 2.4.0 pipeline.py: "If skipped, the results are
    host-synchronous"); copy_to_external's own ordering only makes DALI wait for the copy before it reuses the
    source. copy_to_external(ptr) without a stream copies on a DALI stream of the tensor's own device and waits
    on the host for the copy (dali/python/backend_impl.cc, CopyToExternalImplGPU: CUDAStreamPool::Get
    (src.device_id()), then AccessOrder::host().wait(copy_order)). So the batch is in the buffer before MXNet is
    given it, whatever the calling thread's current device; and no MXNet array ever points into DALI's memory,
    which NGC's asynchronous engine would hand back while kernels still read it. Passing a stream to run() to
    overlap work would need the copy ordered on it too.

    wait_seconds: time spent waiting for DALI (its run and the copy); engine_seconds: waiting for MXNet's
    readers of a buffer, which is the engine's time, not the input's.
    """

    def __init__(self, s, ctx, copy, train=True):
        self.ctx, self.copy, self.wait_seconds, self.engine_seconds = ctx, copy, 0.0, 0.0
        shapes = [batch_shape(s, train, hw) for hw in (s.train_sizes if train else [None])]
        self.rings = {shape: [[mx.nd.zeros(shape, ctx=ctx, dtype=s.input_dtype), mx.nd.zeros((s.batch_size,), ctx=ctx)]
                              for _ in range(RING)] for shape in (shapes if copy else [])}
        self.count, self.checked = 0, set()

    def arrays(self, images, labels):
        """(data, label) on ctx for one batch of DALI outputs."""
        if not self.copy:
            return share(images).as_in_context(self.ctx), share(labels).reshape((-1,)).as_in_context(self.ctx)
        shape = (len(images), *images.shape()[0])
        if shape not in self.rings:  # a size the schedule does not make: the check against a ring names it
            fits((images, labels), next(iter(self.rings.values()))[0])
        buffers = self.rings[shape][self.count % RING]
        if shape not in self.checked:
            fits((images, labels), buffers)
            self.checked.add(shape)
        self.count += 1
        tic = time.perf_counter()
        for array in buffers:
            wait_for_readers(array)
        toc = time.perf_counter()
        self.engine_seconds += toc - tic
        for output, array in zip((images, labels), buffers):
            output.copy_to_external(data_pointer(array))
        self.wait_seconds += time.perf_counter() - toc
        return buffers


def fits(outputs, buffers):
    """Each DALI output has its buffer's size and dtype (checked on host metadata, once per iterator): copy_to_external
    writes the output's bytes to a raw pointer, knowing nothing of the buffer behind it (DALI's own MXNet plugin
    asserted the shapes before the same copy)."""
    for name, output, array in zip(("images", "labels"), outputs, buffers):
        shapes, dtype = output.shape(), np.dtype(types.to_numpy_type(output.dtype))
        size = sum(int(np.prod(shape)) for shape in shapes)
        if size != array.size or dtype != array.dtype:
            raise InputError(f"DALI's {name} ({len(shapes)} samples of {shapes[0] if shapes else '?'}, {dtype}) do "
                             f"not fit the {array.shape} {np.dtype(array.dtype)} buffer they are copied into")


def share(tensor_list):
    """A DALI host output as an mx.nd on cpu(0) without a copy (DLPack)."""
    return mx.nd.from_dlpack(tensor_list.as_tensor().__dlpack__())


def data_pointer(array):
    """The address of an MXNet array's memory (MXNet's C API MXNDArrayGetData; allocated by then)."""
    pointer = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return pointer


def wait_for_readers(array):
    """Block until every operation that reads `array` is done: MXNet's NDArray::WaitToWrite, from its C API (the
    Python NDArray has only wait_to_read, which waits for the writers)."""
    check_call(_LIB.MXNDArrayWaitToWrite(array.handle))


class BatchIter(mx.io.DataIter):
    """MXNet's DataIter protocol over `len(pads)` batches per epoch; subclasses make the arrays.

    wait_seconds: time spent waiting for data since the last reset() (subclasses count it).
    """

    def __init__(self, s, pads, num_samples, ctx, train=True):
        super().__init__(s.batch_size)
        self.pads, self.num_samples, self.context = pads, num_samples, ctx
        self.provide_data = [mx.io.DataDesc("data", batch_shape(s, train), np.dtype(s.input_dtype), s.input_layout)]
        self.provide_label = [mx.io.DataDesc("softmax_label", (s.batch_size,), np.float32, "N")]
        self.position, self.wait_seconds = 0, 0.0

    @property
    def steps_per_epoch(self):
        return len(self.pads)

    def open(self):
        """Ready to read (the first data access: after run_start); returns self."""
        return self

    def reset(self):
        self.position, self.wait_seconds = 0, 0.0

    def state(self):
        """(what a checkpoint keeps of this iterator as a dict for JSON, the bytes of its pipeline's state or None)."""
        return {"position": self.position}, None

    def restore(self, state, pipeline_state):
        """Continue from a `state()` of an iterator of the same settings."""
        self.position = state["position"]

    def next(self):
        if self.position == len(self.pads):
            raise StopIteration
        data, label = self.produce()
        pad = self.pads[self.position]
        self.position += 1
        desc = self.provide_data[0]
        return mx.io.DataBatch(data=[data], label=[label], pad=pad, provide_label=self.provide_label,
                               provide_data=[mx.io.DataDesc(desc.name, data.shape, desc.dtype, desc.layout)])

    def produce(self):
        raise NotImplementedError


class DaliIter(BatchIter):
    """Batches of a DALI pipeline, with its errors turned into one-line InputErrors.

    pipe: built by build(idx, 0, 0), its reader not yet initialised (no file read): open() is the first data
    access and sizes the epoch. build(index, attempt, epochs) builds another that reads the .rec through `index`,
    starting from the shard of epoch `epochs`. skip: a record that does not decode is left out instead (see
    skip_record); `skipped` lists their keys, `index` is the .idx in use.
    """

    def __init__(self, s, build, pipe, ctx, rec, idx, train, rank, world, sizes=None):
        super().__init__(s, None, None, ctx, train)
        self.build, self.pipe, self.rec, self.idx, self.skip = build, pipe, rec, idx, train and s.skip_bad_records
        self.num_classes, self.index, self.skipped, self.epochs, self.scratch = s.num_classes, idx, [], 0, None
        self.settings, self.train, self.rank, self.world = s, train, rank, world
        self.handover = Handover(s, ctx, copy=s.device == "gpu", train=train)  # a rehearsal copies too
        self.built_epochs = 0  # the `epochs` argument the pipeline in use was built with
        self.sizes = sizes  # with --prog-start-side: the schedule of the train crops' size the pipeline reads

    def open(self):
        """The files checked, then the reader's metadata (DALI reads the .idx now) sizes the epoch: train steps as
        the reference, val reading each image once across ranks. Settings that size the run before run_start
        (--num-examples) are checked against the .idx here, in one line naming it."""
        s, world = self.settings, self.world
        readable(self.rec, self.idx)
        with data_errors(self.rec, self.idx):
            meta = self.pipe.reader_meta(READER)
        n = meta["epoch_size"]
        if n < world:
            raise InputError(f"{self.rec}: {n} records for {world} processes")
        if not self.train:
            self.pads = val_pads(n, self.rank, world, s.batch_size, meta["epoch_size_padded"] // world)
        elif s.num_examples > n:  # the reader would run into the next epoch's images
            raise InputError(f"{self.idx}: lists {n} records, fewer than the {s.num_examples} train images an "
                             "epoch takes (--num-examples, NUMEXAMPLES)")
        else:
            n = s.num_examples or n
            self.pads = [0] * steps_per_epoch(s, world, n)  # every sample is a real image: the reader runs on
            if self.sizes:
                self.sizes.steps = len(self.pads)
        self.num_samples = n
        return self

    def reset(self):
        """Finish a partly read epoch first, so that the next one starts at the shard boundary again."""
        while 0 < self.position < len(self.pads):
            self.next()
        self.epochs += self.position == len(self.pads)
        super().reset()

    def skip_record(self, bad):
        """DALI cannot step over a sample, and a failed pipeline is spent: build a new one on a copy of the index
        without the bad records (in a scratch folder; the data stay untouched). It begins again the shard this
        epoch reads, shuffled anew; the epoch keeps its number of steps. Its shards are cut on fewer records than
        the other ranks' readers cut them, which moves their edges by at most a record per record skipped."""
        if bad.record in self.skipped:  # cannot happen: the search for an unnamed record reads `index`
            raise bad
        self.skipped.append(bad.record)
        print(f"rn50_mx: {bad}; skipped ({len(self.skipped)} so far on this process)", file=sys.stderr)
        self.leave_out_skipped()
        if self.sizes:  # the new pipeline counts its batches from 0 again
            self.sizes.base = self.epochs * len(self.pads) + self.position
        self.pipe = self.build(self.index, len(self.skipped), self.epochs)
        self.built_epochs = self.epochs

    def state(self):
        """The position, the records skipped so far and the pipeline's own state (DALI's checkpoint: reader
        position and shuffle buffer, every random operator's generator)."""
        return ({"position": self.position, "epochs": self.epochs, "skipped": self.skipped,
                 "built_epochs": self.built_epochs, "built_step": self.sizes.base if self.sizes else 0},
                self.pipe.checkpoint())

    def restore(self, state, pipeline_state):
        """Continue from a `state()`: the pipeline is rebuilt exactly as the one that was saved (index without the
        skipped records, seed, first shard), since DALI's state restored into a pipeline with another shard, batch
        or shuffle buffer yields other data without a word, then restored from `pipeline_state`."""
        self.position, self.epochs, self.built_epochs = state["position"], state["epochs"], state["built_epochs"]
        self.skipped = list(state["skipped"])
        if self.sizes:
            self.sizes.base = state.get("built_step", 0)
        if self.skipped:
            self.leave_out_skipped()
        self.pipe = self.build(self.index, len(self.skipped), self.built_epochs, pipeline_state)

    def leave_out_skipped(self):
        """Read through a copy of the .idx without the skipped records, in a scratch folder (the data stay
        untouched)."""
        self.scratch = self.scratch or tempfile.TemporaryDirectory(prefix="rn50_mx_idx_")
        self.index = index_without(self.idx, set(self.skipped), os.path.join(self.scratch.name, "kept.idx"))

    def produce(self):
        tic = time.perf_counter()
        while True:
            try:
                with data_errors(self.rec, self.index):
                    images, labels, host_labels, sources = self.pipe.run()
                break
            except BadRecord as bad:
                if not self.skip:
                    raise
                self.skip_record(bad)
        shapes = host_labels.shape()
        check_labels(shapes, np.asarray(host_labels.as_tensor()).reshape(-1), sources, self.num_classes, self.rec,
                     self.index)
        self.wait_seconds += time.perf_counter() - tic
        before = self.handover.wait_seconds
        arrays = self.handover.arrays(images, labels)
        self.wait_seconds += self.handover.wait_seconds - before
        return arrays


class SizeSchedule:
    """The train crops' [H, W] of each batch DALI makes (config.Settings.train_hw of the batch's epoch), given the
    pipeline's batch count: DALI's iteration counts the batches since the pipeline was built (`base` steps into the
    run), so prefetched batches and a pipeline restored from a checkpoint get their own epoch's size. `steps`, the
    batches of an epoch, is set when the iterator opens (no batch is made before)."""

    def __init__(self, s):
        self.settings, self.steps, self.base = s, None, 0

    def __call__(self, info):
        epoch = (self.base + info.iteration) // self.steps
        return np.tile(np.float32(self.settings.train_hw(epoch)), (self.settings.batch_size, 1))


class SyntheticIter(BatchIter):
    """The same batches every step, made once on the device: no I/O, the ceiling the real pipeline aims at."""

    def __init__(self, s, steps, num_samples, ctx, seed):
        super().__init__(s, [0] * steps, num_samples, ctx)
        rng = np.random.RandomState(seed)
        images = rng.standard_normal(batch_shape(s)).astype(s.input_dtype)
        if s.image_chw[0] == 4:  # the padded channel is zero, as DALI's pad_output makes it
            images[(slice(None), 3) if s.input_layout == "NCHW" else (Ellipsis, 3)] = 0
        self.data = mx.nd.array(images, ctx=ctx, dtype=s.input_dtype)
        self.label = mx.nd.array(rng.randint(0, s.num_classes, s.batch_size), ctx=ctx, dtype=np.float32)

    def produce(self):
        return self.data, self.label


def dali_iter(s, train, rank, world, seed, ctx):
    """The iterator of one split, built and not opened: no data file is read until its open()."""
    rec, idx = data_paths(s, train)
    if s.dali_cache_size and s.device != "gpu":
        raise InputError("--dali-cache-size: the decoded-image cache is a GPU decoder feature (--device gpu)")

    sizes = SizeSchedule(s) if train and s.prog_start_side else None

    def build(index, attempt, epochs, checkpoint=None):
        """attempt > 0: after a skipped record, with another shuffle than the pipeline that failed, from the shard
        this rank reads in epoch `epochs` (0-based); `checkpoint`: a saved state of such a pipeline."""
        shard = rank if sticks_to_shard(s, train) else (rank + epochs) % world
        pipe = build_pipeline(s, rec, index, train, shard, world, seed + attempt,
                              ctx.device_id if ctx.device_type == "gpu" else None, checkpoint, sizes)
        with data_errors(rec, index):
            pipe.build()
        return pipe

    return DaliIter(s, build, build(idx, 0, 0), ctx, rec, idx, train, rank, world, sizes)


def build_iters(settings, rank, world, seed, ctx):
    """(train_iter, val_iter) of one process, built and not opened: set-up, which touches no data file, for before
    run_start (open_iters comes after). val_iter is None without --data-val or with --synthetic.

    seed: this rank's seed (crop, flip and shuffle draws).
    """
    if settings.synthetic:
        n = train_samples(settings)
        return SyntheticIter(settings, steps_per_epoch(settings, world, n), n, ctx, seed), None
    train = dali_iter(settings, True, rank, world, seed, ctx)
    val = dali_iter(settings, False, rank, world, seed, ctx) if settings.data_val else None
    return train, val


def open_iters(iters):
    """Each iterator of build_iters opened: the first data access (after run_start)."""
    return tuple(it and it.open() for it in iters)


def make_iters(settings, rank, world, seed, ctx):
    """(train_iter, val_iter) of build_iters, opened: for a use outside the timed run."""
    return open_iters(build_iters(settings, rank, world, seed, ctx))
