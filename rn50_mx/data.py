"""Input pipelines (common/dali.py): DALI reads the .rec, decodes and augments; our DataIter hands the batches to MXNet.

    train: readers.mxnet (sharded, shuffled) -> decoders.image_random_crop -> resize to H,W (antialiased, or
           plain bilinear by a scaling warp) -> crop_mirror_normalize (coin-flip mirror, ImageNet mean/std,
           zero 4th channel when C=4)
           (--dali-roi-decode 0 or a decoder cache: decoders.image -> random_resized_crop instead)
    val:   readers.mxnet (sharded, padded) -> decoders.image -> resize shorter side -> centre crop + normalize

One graph serves both devices: `device=cpu` runs every operator on the CPU with no GPU (device_id=None), as CI
and the demo do; `device=gpu` moves decoding to nvJPEG ("mixed") and the rest onto the process's GPU. The
nvJPEG and buffer knobs of config_NF5688M6.sh and config_NF5688M6_common.sh are always passed; DALI applies them on
the GPU only.

DALI 2.x has no MXNet plugin, so the iterator is ours. DALI's prefetch queue prepares the next batches while
the model computes; see Handover for how a batch reaches MXNet on each device.
"""
import contextlib
import ctypes
import io
import math
import os
import re
import sys
import tempfile
import time

import mxnet as mx
from mxnet.base import _LIB, check_call
import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from PIL import Image, UnidentifiedImageError

from . import prep_rec
from .errors import InputError
from .files import write_atomically

MEAN = tuple(255 * m for m in (0.485, 0.456, 0.406))
STD = tuple(255 * s for s in (0.229, 0.224, 0.225))
MIB = 1 << 20
READER = "Reader"
RING = 2  # MXNet buffers per iterator on the GPU (Handover): a batch is written while the previous one is read
DALI_DTYPES = {"float32": types.FLOAT, "float16": types.FLOAT16}


# --- files ----------------------------------------------------------------------------------------------

def rec_and_idx(settings, train):
    """The (.rec, .idx) pair of a split, after checking that both are there: DALI's own errors are stack traces."""
    return readable(*data_paths(settings, train))


def data_paths(settings, train):
    """The (.rec, .idx) paths of a split, as the settings name them; no file is opened."""
    flag = "--data-train" if train else "--data-val"
    rec = settings.data_train if train else settings.data_val
    idx = (settings.data_train_idx if train else settings.data_val_idx) or settings.idx_path(rec)
    if not rec:
        raise InputError(f"{flag}: not set (give a .rec file, or --synthetic 1 for training)")
    return rec, idx


def readable(rec, idx):
    """(rec, idx) after reading a byte of each: a missing or empty file is one line naming it."""
    try:
        with open(rec, "rb") as f:
            if not f.read(1):
                raise InputError(f"{rec}: empty file")
    except OSError as err:
        raise InputError(f"{rec}: cannot read ({err.strerror})") from None
    try:
        with open(idx, "rb") as f:
            if not f.read(1):
                raise InputError(f"{idx}: empty index: it lists no record of {rec}")
    except FileNotFoundError:
        raise InputError(f"{idx}: no index for {rec}; pack the images again to get both files: "
                         f"python -m rn50_mx.prep_rec pack IMAGE_DIR {os.path.splitext(rec)[0]}") from None
    except OSError as err:
        raise InputError(f"{idx}: cannot read ({err.strerror})") from None
    return rec, idx


def check_idx(rec, idx):
    """Every .idx line is `key<TAB>offset` inside the .rec, found before DALI's reader meets it (an assertion).
    `config --check` runs it, which the launchers run before any rank starts: reading ImageNet's 1.28M lines takes
    seconds, which training itself does not spend."""
    entries, bad = prep_rec.read_idx(idx)
    if bad:
        where, _, problem = bad[0]
        raise InputError(f"{idx}: {where}: {problem}; pack the images again (python -m rn50_mx.prep_rec verify "
                         f"{os.path.splitext(rec)[0]} checks a set)")
    size = os.path.getsize(rec)
    outside = next((key for key, offset in entries if not 0 <= offset < size), None)
    if outside is not None:
        raise InputError(f"{idx}: record {outside} starts past the end of {rec} ({size} bytes): the two files are "
                         "not one set")


def count_records(idx):
    """Records listed by an .idx (one line each), without opening the .rec."""
    with open(idx, "rb") as f:
        return sum(1 for line in f if line.strip())


def record_at(idx, offset):
    """The record index (the .idx key) of the record that starts at byte `offset` of the .rec."""
    entries, _ = prep_rec.read_idx(idx)
    return dict((o, key) for key, o in entries).get(offset, f"at byte offset {offset}")


def first_unidentified(rec, idx):
    """Index of the first record whose bytes no decoder can even identify as an image, or None.

    Only for the DALI failures that do not name their sample (a header nvImageCodec cannot parse): reading
    each header is far cheaper than decoding every image, which `prep_rec verify` does.
    """
    records = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
    try:
        for key in records.keys:
            _, image = mx.recordio.unpack(records.read_idx(key))
            try:
                Image.open(io.BytesIO(image)).close()
            except (UnidentifiedImageError, OSError, SyntaxError):
                return key
    finally:
        records.close()
    return None


class BadRecord(InputError):
    """A record that does not decode; `record` is its .idx key."""

    def __init__(self, message, record):
        super().__init__(message)
        self.record = record


def input_error(err, rec, idx):
    """The one-line InputError for a DALI failure that the data caused, or None when the data is not at fault.

    DALI names a sample whose data breaks off mid-decode ("<rec> at index <byte offset>"), but not one whose
    header nvImageCodec cannot parse; that one is searched for.
    """
    text = str(err)
    cause = text.split("encountered:")[-1].strip().splitlines()[0] if "encountered:" in text else text
    cause = re.sub(r'^Assert on ".*" failed: ', "", cause)
    verify = f"check it with: python -m rn50_mx.prep_rec verify {os.path.splitext(rec)[0]}"
    if "fn.decoders." in text:  # the sample's source: "<rec> at index <offset>" (where the wording puts it)
        named = re.search(re.escape(rec) + r" at index (\d+)", text)
        if named:
            record = record_at(idx, int(named.group(1)))
            return BadRecord(f"{rec}: record {record} does not decode (its data breaks off or is corrupt)", record)
        record = first_unidentified(rec, idx)
        if record is None:
            return InputError(f"{rec}: a record does not decode (DALI: {cause}); {verify}")
        return BadRecord(f"{rec}: record {record} is not an image (DALI: {cause})", record)
    if "fn.readers." in text:
        return InputError(f"{rec}: {cause}; {verify}")
    return None


@contextlib.contextmanager
def data_errors(rec, idx):
    """Turn the DALI failures that the data causes into one-line InputErrors; let the others through."""
    try:
        yield
    except RuntimeError as err:
        problem = input_error(err, rec, idx)
        if problem is None:
            raise
        raise problem from None


def check_labels(labels, sources, num_classes, rec, idx):
    """Labels must be class numbers below num_classes; otherwise name the first bad record (via its source)."""
    bad = (labels < 0) | (labels >= num_classes) | (labels != np.floor(labels))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        offset = int(np.asarray(sources[i]).tobytes().decode().rsplit(" at index ", 1)[1])
        raise InputError(f"{rec}: record {record_at(idx, offset)} has label {labels[i]:g}, "
                         f"not a class number in [0, {num_classes})")


def index_without(idx, keys, dest):
    """dest: a copy of the .idx without the records `keys` (written under a temporary name, then renamed)."""
    lines = (f"{key}\t{offset}\n" for key, offset in prep_rec.read_idx(idx)[0] if key not in keys)
    write_atomically(dest, "".join(lines), "the shortened index")
    return dest


# --- epoch accounting (common/dali.py, get_rec_iter) ------------------------------------------------------------------

def train_samples(settings):
    """Images per train epoch: --num-examples, or every record of the train .rec."""
    if settings.num_examples:
        return settings.num_examples
    if settings.synthetic and not settings.data_train:
        raise InputError("--synthetic: give --num-examples (or --data-train) to size the epoch")
    return count_records(rec_and_idx(settings, True)[1])


def steps_per_epoch(settings, world, num_samples=None):
    """Train steps per epoch, the same on every rank: ceil(floor(N / world) / batch), as the reference."""
    n = num_samples if num_samples is not None else train_samples(settings)
    if n < world:
        raise InputError(f"{settings.data_train or '--num-examples'}: {n} train images for {world} processes")
    if n // world < settings.batch_size:
        raise InputError(f"--batch-size={settings.batch_size}: larger than the {n // world} train images of each of "
                         f"the {world} processes ({settings.data_train or '--num-examples'})")
    return math.ceil(n // world / settings.batch_size)


def shard_range(n, rank, world):
    """[begin, end) of a rank's records: DALI's readers cut shard i at floor(i * n / world)."""
    return n * rank // world, n * (rank + 1) // world


def val_pads(n, rank, world, batch, padded_shard):
    """Padding of each val batch of a rank. With pad_last_batch DALI repeats a shard's last image up to
    `padded_shard` (the same on every rank) and rounds up to whole batches: those repeats are the pad."""
    begin, end = shard_range(n, rank, world)
    batches = math.ceil(padded_shard / batch)
    return [batch - min(batch, max(0, end - begin - k * batch)) for k in range(batches)]


# --- pipelines ------------------------------------------------------------------------------------------

def nvjpeg_knobs(s):
    """Decoder arguments that only the GPU ("mixed") decoder uses; the CPU decoder accepts and ignores them."""
    return dict(device_memory_padding=s.dali_nvjpeg_memory_padding * MIB,
                host_memory_padding=s.dali_nvjpeg_memory_padding * MIB,
                hw_decoder_load=s.dali_hw_decoder_load,
                preallocate_width_hint=s.dali_preallocate_width,
                preallocate_height_hint=s.dali_preallocate_height,
                affine=False)


def build_pipeline(s, rec, idx, train, shard, world, seed, device_id, checkpoint=None):
    """The DALI pipeline of one split, reading shard `shard` of `world` first. device_id None runs everything on
    the CPU. With --checkpoint-dir DALI tracks its operators' states (Pipeline.checkpoint()); `checkpoint`, such a
    state, makes the pipeline continue from it."""
    pipe = Pipeline(batch_size=s.batch_size, num_threads=s.dali_threads, device_id=device_id, seed=seed,
                    prefetch_queue_depth=s.dali_prefetch_queue, exec_dynamic=True,  # see Handover
                    enable_checkpointing=bool(s.checkpoint_dir), checkpoint=checkpoint)
    with pipe:
        pipe.set_outputs(*graph(s, rec, idx, train, shard, world, gpu=device_id is not None))
    return pipe


def graph(s, rec, idx, train, shard, world, gpu):
    """The operators of one split, defined inside a Pipeline: (images, labels on the images' device, labels on
    the host for their check, source info of each sample).

    gpu: decode with nvJPEG ("mixed"), which leaves the images on the GPU for resize and normalize; DALI copies
    the labels to the GPU too, on its stream, within the batch it prefetches.
    """
    c, h, w = s.image_chw
    cache = train and s.dali_cache_size > 0  # common/dali.py: the cache sits on the plain decoder, readers skip hits
    crop_area = dict(random_area=[s.min_random_area, s.max_random_area],
                     random_aspect_ratio=[s.min_random_aspect_ratio, s.max_random_aspect_ratio],
                     num_attempts=s.dali_num_attempts)
    decoder = dict(device="mixed" if gpu else "cpu", output_type=types.RGB,
                   bytes_per_sample_hint=s.dali_decoder_buffer_hint, **nvjpeg_knobs(s))
    jpegs, labels = fn.readers.mxnet(
        path=[rec], index_path=[idx], name=READER, shard_id=shard, num_shards=world,
        random_shuffle=train, initial_fill=s.dali_initial_fill, dont_use_mmap=s.dali_dont_use_mmap,
        # val: each eval reads this rank's shard once, the last image repeated up to whole batches
        stick_to_shard=sticks_to_shard(s, train), pad_last_batch=not train,
        skip_cached_images=cache,
        # building opens no file: the reader reads the .idx and opens the .rec on its first use (reader_meta or
        # run), as the submission's readers (common/dali.py); set-up comes before run_start, data access after
        lazy_init=True)
    filt = dict(antialias=s.dali_resize_antialias)  # DALI's linear filter; antialiased unless turned off
    if train and s.dali_roi_decode and not cache:
        images = fn.decoders.image_random_crop(jpegs, **crop_area, **decoder)
        images = stretch(images, h, w, s)
    else:
        cached = dict(cache_type="threshold", cache_size=s.dali_cache_size, cache_threshold=0) if cache else {}
        images = fn.decoders.image(jpegs, **cached, **decoder)
        buffers = dict(bytes_per_sample_hint=s.dali_crop_buffer_hint, temp_buffer_hint=s.dali_tmp_buffer_hint, **filt)
        if train:
            images = fn.random_resized_crop(images, size=[h, w], **crop_area, **buffers)
        else:
            images = fn.resize(images, resize_shorter=round(s.val_resize * h / 224), **buffers)
    mirror = fn.random.coin_flip(probability=0.5) if train else False
    images = fn.crop_mirror_normalize(
        images, mirror=mirror, crop=[h, w], mean=list(MEAN), std=list(STD), pad_output=c == 4,
        dtype=DALI_DTYPES[s.dtype], output_layout="CHW" if s.input_layout == "NCHW" else "HWC",
        bytes_per_sample_hint=s.dali_normalize_buffer_hint)
    return images, labels.gpu() if gpu else labels, labels, fn.get_property(jpegs, key="source_info")


def sticks_to_shard(s, train):
    """Whether a reader keeps its first shard; otherwise it takes the next one every epoch (the reference's train
    reader). Val always keeps it; so does a reader whose decoder caches images (common/dali.py)."""
    return not train or s.dali_cache_size > 0 or s.dali_stick_to_shard


def stretch(images, h, w, s):
    """Each image resized to exactly h x w, its aspect ratio not kept, as the reference's train Resize.

    Without antialiasing the filter is plain bilinear (ImageRecordIter's). DALI's perspective warp with a pure
    scale computes the same values as fn.resize(antialias=False), within 1 level, at about half its CPU cost:
    fn.resize's horizontal pass is scalar code (bench/pipeline.py, "resize alone").
    """
    if s.dali_resize_antialias:
        return fn.resize(images, resize_x=w, resize_y=h, bytes_per_sample_hint=s.dali_decoder_buffer_hint)
    return fn.experimental.warp_perspective(
        images, matrix=scale_matrix(images, h, w), size=[h, w], interp_type=types.INTERP_LINEAR, pixel_origin="corner",
        border_mode="replicate", bytes_per_sample_hint=s.dali_decoder_buffer_hint)


def scale_matrix(images, h, w):
    """Per image, the 3x3 map from output to input pixel coordinates (corners at integers): a scale by in/out."""
    shape = images.shape(dtype=types.FLOAT)  # on the CPU for either device: the image sizes only
    zero = shape[0] * 0
    return fn.reshape(fn.stack(shape[1] / w, zero, zero, zero, shape[0] / h, zero, zero, zero, zero + 1),
                      shape=[3, 3])


# --- iterators ------------------------------------------------------------------------------------------

def input_memory(s, val=True):
    """Device bytes the input holds at most per process: per iterator (train, and val unless val=False), DALI's
    prefetch queue of batches plus the RING MXNet buffers the GPU hand-over copies into (the val ones stay
    between evals). Images at s.dtype; labels are 4 bytes a sample."""
    c, h, w = s.image_chw
    batch = s.batch_size * (c * h * w * np.dtype(s.dtype).itemsize + 4)
    return (2 if val else 1) * (s.dali_prefetch_queue + RING) * batch


def batch_shape(s):
    """(batch, C, H, W) or (batch, H, W, C), as settings.input_layout says."""
    c, h, w = s.image_chw
    return (s.batch_size, c, h, w) if s.input_layout == "NCHW" else (s.batch_size, h, w, c)


class Handover:
    """How DALI's outputs (images, labels) become MXNet arrays on ctx.

    CPU (copy=False): DLPack shares DALI's host buffer, no copy. MXNet's CPU engine marks an operation complete
    only after it ran, and each pushed operation holds its input arrays, so the buffer goes back to DALI (the
    chunk's deleter, MXNet 1.9.1 include/mxnet/ndarray.h, Chunk(const TBlob&, int, deleter)) only once nothing
    reads it; DALI's dynamic executor gives every batch its own buffer.

    GPU (copy=True): a copy into one of RING persistent MXNet buffers, as DALI's MXNet plugin did. The buffer is
    reused only after MXNDArrayWaitToWrite (MXNet's readers of it are done: the batch RING steps back, which the
    engine has finished unless the host runs that far ahead). copy_to_external(ptr) without a stream copies on
    a DALI stream of the tensor's own device, after DALI's work on the batch, and waits on the host for the copy
    (DALI dali/python/backend_impl.cc, CopyToExternalImplGPU: CUDAStreamPool::Get(src.device_id()), then
    AccessOrder::host().wait(copy_order)). So the batch is complete before MXNet is given it, on any stream,
    whatever the calling thread's current device; and no MXNet array ever points into DALI's memory, which
    NGC's asynchronous engine would hand back while kernels still read it.

    wait_seconds: time spent waiting for DALI (its run and the copy); engine_seconds: waiting for MXNet's
    readers of a buffer, which is the engine's time, not the input's.
    """

    def __init__(self, s, ctx, copy):
        self.ctx, self.copy, self.wait_seconds, self.engine_seconds = ctx, copy, 0.0, 0.0
        shapes = ((batch_shape(s), s.dtype), ((s.batch_size,), "float32"))
        self.ring = [[mx.nd.zeros(shape, ctx=ctx, dtype=dtype) for shape, dtype in shapes]
                     for _ in range(RING if copy else 0)]
        self.count = 0

    def arrays(self, images, labels):
        """(data, label) on ctx for one batch of DALI outputs."""
        if not self.copy:
            return share(images).as_in_context(self.ctx), share(labels).reshape((-1,)).as_in_context(self.ctx)
        buffers = self.ring[self.count % RING]
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

    def __init__(self, s, pads, num_samples, ctx):
        super().__init__(s.batch_size)
        self.pads, self.num_samples, self.context = pads, num_samples, ctx
        self.provide_data = [mx.io.DataDesc("data", batch_shape(s), np.dtype(s.dtype), s.input_layout)]
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
        return mx.io.DataBatch(data=[data], label=[label], pad=pad,
                               provide_data=self.provide_data, provide_label=self.provide_label)

    def produce(self):
        raise NotImplementedError


class DaliIter(BatchIter):
    """Batches of a DALI pipeline, with its errors turned into one-line InputErrors.

    pipe: built by build(idx, 0, 0), its reader not yet initialised (no file read): open() is the first data
    access and sizes the epoch. build(index, attempt, epochs) builds another that reads the .rec through `index`,
    starting from the shard of epoch `epochs`. skip: a record that does not decode is left out instead (see
    skip_record); `skipped` lists their keys, `index` is the .idx in use.
    """

    def __init__(self, s, build, pipe, ctx, rec, idx, train, rank, world):
        super().__init__(s, None, None, ctx)
        self.build, self.pipe, self.rec, self.idx, self.skip = build, pipe, rec, idx, train and s.skip_bad_records
        self.num_classes, self.index, self.skipped, self.epochs, self.scratch = s.num_classes, idx, [], 0, None
        self.settings, self.train, self.rank, self.world = s, train, rank, world
        self.handover = Handover(s, ctx, copy=ctx.device_type == "gpu")
        self.built_epochs = 0  # the `epochs` argument the pipeline in use was built with

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
        self.pipe = self.build(self.index, len(self.skipped), self.epochs)
        self.built_epochs = self.epochs

    def state(self):
        """The position, the records skipped so far and the pipeline's own state (DALI's checkpoint: reader
        position and shuffle buffer, every random operator's generator)."""
        return ({"position": self.position, "epochs": self.epochs, "skipped": self.skipped,
                 "built_epochs": self.built_epochs}, self.pipe.checkpoint())

    def restore(self, state, pipeline_state):
        """Continue from a `state()`: the pipeline is rebuilt exactly as the one that was saved (index without the
        skipped records, seed, first shard), since DALI's state restored into a pipeline with another shard, batch
        or shuffle buffer yields other data without a word, then restored from `pipeline_state`."""
        self.position, self.epochs, self.built_epochs = state["position"], state["epochs"], state["built_epochs"]
        self.skipped = list(state["skipped"])
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
        check_labels(np.asarray(host_labels.as_tensor()).reshape(-1), sources, self.num_classes, self.rec, self.index)
        self.wait_seconds += time.perf_counter() - tic
        before = self.handover.wait_seconds
        arrays = self.handover.arrays(images, labels)
        self.wait_seconds += self.handover.wait_seconds - before
        return arrays


class SyntheticIter(BatchIter):
    """The same batches every step, made once on the device: no I/O, the ceiling the real pipeline aims at."""

    def __init__(self, s, steps, num_samples, ctx, seed):
        super().__init__(s, [0] * steps, num_samples, ctx)
        rng = np.random.RandomState(seed)
        images = rng.standard_normal(batch_shape(s)).astype(s.dtype)
        if s.image_chw[0] == 4:  # the padded channel is zero, as DALI's pad_output makes it
            images[(slice(None), 3) if s.input_layout == "NCHW" else (Ellipsis, 3)] = 0
        self.data = mx.nd.array(images, ctx=ctx, dtype=s.dtype)
        self.label = mx.nd.array(rng.randint(0, s.num_classes, s.batch_size), ctx=ctx, dtype=np.float32)

    def produce(self):
        return self.data, self.label


def dali_iter(s, train, rank, world, seed, ctx):
    """The iterator of one split, built and not opened: no data file is read until its open()."""
    rec, idx = data_paths(s, train)
    if s.dali_cache_size and s.device != "gpu":
        raise InputError("--dali-cache-size: the decoded-image cache is a GPU decoder feature (--device gpu)")

    def build(index, attempt, epochs, checkpoint=None):
        """attempt > 0: after a skipped record, with another shuffle than the pipeline that failed, from the shard
        this rank reads in epoch `epochs` (0-based); `checkpoint`: a saved state of such a pipeline."""
        shard = rank if sticks_to_shard(s, train) else (rank + epochs) % world
        pipe = build_pipeline(s, rec, index, train, shard, world, seed + attempt,
                              ctx.device_id if ctx.device_type == "gpu" else None, checkpoint)
        with data_errors(rec, index):
            pipe.build()
        return pipe

    return DaliIter(s, build, build(idx, 0, 0), ctx, rec, idx, train, rank, world)


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
