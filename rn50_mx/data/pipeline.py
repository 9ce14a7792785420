"""The DALI graph of both splits (common/dali.py's train and val pipes as one function)."""
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

MEAN = tuple(255 * m for m in (0.485, 0.456, 0.406))
STD = tuple(255 * s for s in (0.229, 0.224, 0.225))
MIB = 1 << 20
READER = "Reader"
DALI_DTYPES = {"float32": types.FLOAT, "float16": types.FLOAT16}


def nvjpeg_knobs(s):
    """Decoder arguments that only the GPU ("mixed") decoder uses; the CPU decoder accepts and ignores them."""
    return dict(device_memory_padding=s.dali_nvjpeg_memory_padding * MIB,
                host_memory_padding=s.dali_nvjpeg_memory_padding * MIB,
                hw_decoder_load=s.dali_hw_decoder_load,
                preallocate_width_hint=s.dali_preallocate_width,
                preallocate_height_hint=s.dali_preallocate_height,
                affine=False)


def build_pipeline(s, rec, idx, train, shard, world, seed, device_id, checkpoint=None, sizes=None):
    """The DALI pipeline of one split, reading shard `shard` of `world` first. device_id None runs everything on
    the CPU. With --checkpoint-dir DALI tracks its operators' states (Pipeline.checkpoint()); `checkpoint`, such a
    state, makes the pipeline continue from it. sizes: with --prog-start-side, the train crops' (H, W) of each
    batch (see graph)."""
    pipe = Pipeline(batch_size=s.batch_size, num_threads=s.dali_threads, device_id=device_id, seed=seed,
                    prefetch_queue_depth=s.dali_prefetch_queue, exec_dynamic=True,  # see Handover
                    enable_checkpointing=bool(s.checkpoint_dir), checkpoint=checkpoint)
    with pipe:
        pipe.set_outputs(*graph(s, rec, idx, train, shard, world, gpu=device_id is not None, sizes=sizes))
    return pipe


def graph(s, rec, idx, train, shard, world, gpu, sizes=None):
    """The operators of one split, defined inside a Pipeline: (images, labels on the images' device, labels on
    the host for their check, source info of each sample).

    gpu: decode with nvJPEG ("mixed"), which leaves the images on the GPU for resize and normalize; DALI copies
    the labels to the GPU too, on its stream, within the batch it prefetches.

    sizes: a callable of DALI's BatchInfo giving each sample's [H, W] (float32, batch x 2): the train crop size as
    an argument input of the resize and the crop, so the size changes between batches in the same graph, readers
    and shuffle state. DALI calls it with the pipeline's iteration (prefetching runs ahead; a pipeline restored
    from a checkpoint resumes the count: external_source's docs), so a size is a function of the batch's index.
    """
    c, h, w = s.image_chw if train else s.eval_chw
    if train and sizes is not None:
        size = fn.external_source(source=sizes, batch=True, batch_info=True, dtype=types.FLOAT)
        h, w = size[0], size[1]
    else:
        size = [h, w]
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
        images = stretch(images, h, w, s, size)
    else:
        cached = dict(cache_type="threshold", cache_size=s.dali_cache_size, cache_threshold=0) if cache else {}
        images = fn.decoders.image(jpegs, **cached, **decoder)
        buffers = dict(bytes_per_sample_hint=s.dali_crop_buffer_hint, temp_buffer_hint=s.dali_tmp_buffer_hint, **filt)
        if train:
            images = fn.random_resized_crop(images, size=[h, w], **crop_area, **buffers)
        else:
            images = fn.resize(images, resize_shorter=s.val_resize_side, **buffers)
    mirror = fn.random.coin_flip(probability=0.5) if train else False
    images = fn.crop_mirror_normalize(
        images, mirror=mirror, crop=size, mean=list(MEAN), std=list(STD), pad_output=c == 4,
        dtype=DALI_DTYPES[s.input_dtype], output_layout="CHW" if s.input_layout == "NCHW" else "HWC",
        bytes_per_sample_hint=s.dali_normalize_buffer_hint)
    return images, labels.gpu() if gpu else labels, labels, fn.get_property(jpegs, key="source_info")


def sticks_to_shard(s, train):
    """Whether a reader keeps its first shard; otherwise it takes the next one every epoch (the reference's train
    reader). Val always keeps it; so does a reader whose decoder caches images (common/dali.py)."""
    return not train or s.dali_cache_size > 0 or s.dali_stick_to_shard


def stretch(images, h, w, s, size=None):
    """Each image resized to exactly h x w, its aspect ratio not kept, as the reference's train Resize.

    Without antialiasing the filter is plain bilinear (ImageRecordIter's). DALI's perspective warp with a pure
    scale computes the same values as fn.resize(antialias=False), within 1 level, at about half its CPU cost:
    fn.resize's horizontal pass is scalar code (bench/pipeline.py, "resize alone"). h, w: numbers, or DataNodes
    of each sample's side (size: then the DataNode of both, [H, W]).
    """
    if s.dali_resize_antialias:
        return fn.resize(images, resize_x=w, resize_y=h, bytes_per_sample_hint=s.dali_decoder_buffer_hint)
    return fn.experimental.warp_perspective(
        images, matrix=scale_matrix(images, h, w), size=[h, w] if size is None else size,
        interp_type=types.INTERP_LINEAR, pixel_origin="corner",
        border_mode="replicate", bytes_per_sample_hint=s.dali_decoder_buffer_hint)


def scale_matrix(images, h, w):
    """Per image, the 3x3 map from output to input pixel coordinates (corners at integers): a scale by in/out."""
    shape = images.shape(dtype=types.FLOAT)  # on the CPU for either device: the image sizes only
    zero = shape[0] * 0
    return fn.reshape(fn.stack(shape[1] / w, zero, zero, zero, shape[0] / h, zero, zero, zero, zero + 1),
                      shape=[3, 3])
