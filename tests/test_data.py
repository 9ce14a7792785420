"""The input pipeline on real JPEGs packed in real .rec files, on the CPU device (what CI and the demo run)."""
import dataclasses
import gc
import io
import math
import os
import shutil

import cv2
import mxnet as mx
import numpy as np
import pytest
from nvidia.dali.pipeline import Pipeline
from PIL import Image

from tests.support.data import one_per_class
from rn50_mx import data
from rn50_mx.config import Settings
from rn50_mx.errors import InputError


def settings_for(prefix, **changes):
    """Small settings on a packed PREFIX; dataclasses.replace skips config's NCHW-on-CPU rule on purpose:
    the pipeline itself makes both layouts on any device."""
    s = Settings(data_train=prefix + ".rec", data_val=prefix + ".rec", batch_size=4, image_shape="3,32,32",
                 num_classes=3, dali_threads=1)
    return dataclasses.replace(s, **changes)


def rec_labels(prefix):
    """The label of each record, in record order, read with mxnet.recordio."""
    records = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r")
    labels = [mx.recordio.unpack(records.read_idx(key))[0].label for key in records.keys]
    records.close()
    return labels


def rewrite_rec(src, dest, change):
    """A copy of the .rec/.idx at src with record k replaced by change(k, header, image) -> (header, image)."""
    records = mx.recordio.MXIndexedRecordIO(src + ".idx", src + ".rec", "r")
    out = mx.recordio.MXIndexedRecordIO(dest + ".idx", dest + ".rec", "w")
    for key in records.keys:
        header, image = mx.recordio.unpack(records.read_idx(key))
        out.write_idx(key, mx.recordio.pack(*change(key, header, image)))
    out.close()
    records.close()
    return dest


def with_bad_records(src, dest, keys, damage):
    """A copy of the .rec at src whose records `keys` do not decode: cut in half ("truncated": DALI names the
    sample) or replaced by bytes that are no image ("not_an_image": DALI cannot name it)."""
    def spoil(key, header, image):
        if key in keys:
            image = image[:len(image) // 2] if damage == "truncated" else b"not a jpeg" * 20
        return header, image

    return rewrite_rec(src, dest, spoil)


def valid_labels(it):
    """Labels of the real (non-pad) samples of one epoch of an iterator."""
    it.reset()
    return [label for batch in it for label in batch.label[0].asnumpy()[:it.batch_size - batch.pad]]


@pytest.fixture(scope="module")
def unique_rec(tmp_path_factory):
    """21 images, one per class, packed in order: the label of a sample says which record it is."""
    return one_per_class(str(tmp_path_factory.mktemp("unique")), 21, seed=3)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("channels", [3, 4])
def test_shapes_dtypes_layouts(small_rec, layout, dtype, channels):
    s = settings_for(small_rec, input_layout=layout, dtype=dtype, image_shape=f"{channels},32,24")
    train, val = data.make_iters(s, 0, 1, 1, mx.cpu())
    shape = (4, channels, 32, 24) if layout == "NCHW" else (4, 32, 24, channels)
    for it in (train, val):
        assert it.provide_data[0].shape == shape and it.provide_data[0].layout == layout
        assert it.provide_data[0].dtype == np.dtype(dtype)
        assert it.provide_label[0].shape == (4,)
        batch = it.next()
        x = batch.data[0]
        assert x.shape == shape and x.dtype == np.dtype(dtype) and x.context == mx.cpu()
        assert batch.label[0].shape == (4,) and batch.label[0].dtype == np.float32
        x = x.asnumpy().astype(np.float32)
        if channels == 4:
            assert not np.any(x[:, 3] if layout == "NCHW" else x[..., 3]), "the padded channel is zero"
        rgb = x[:, :3] if layout == "NCHW" else x[..., :3]
        assert rgb.std() > 0.1 and np.isfinite(rgb).all(), "normalized pixels, not a blank"


def test_non_fused_decode_path(small_rec):
    """--dali-roi-decode 0: decoders.image + random_resized_crop gives the same kind of batch."""
    train, _ = data.make_iters(settings_for(small_rec, dali_roi_decode=False), 0, 1, 1, mx.cpu())
    batch = train.next()
    assert batch.data[0].shape == (4, 3, 32, 32) and batch.data[0].asnumpy().std() > 0.1


def test_val_labels_equal_rec_labels(small_rec):
    _, val = data.make_iters(settings_for(small_rec), 0, 1, 1, mx.cpu())
    assert valid_labels(val) == rec_labels(small_rec)
    assert val.num_samples == 21 and val.steps_per_epoch == 6


def test_train_labels_come_from_the_rec(small_rec):
    train, _ = data.make_iters(settings_for(small_rec), 0, 1, 1, mx.cpu())
    labels = [label for batch in train for label in batch.label[0].asnumpy()]
    assert len(labels) == 6 * 4 and set(labels) == set(rec_labels(small_rec))


@pytest.mark.parametrize("batch", [4, 5])
def test_two_shards_see_each_val_image_once(unique_rec, batch):
    """world=2: shards of 10 and 11 images, padded by repeating the last one; pad marks exactly the repeats."""
    s = settings_for(unique_rec, num_classes=21, batch_size=batch)
    vals = [data.make_iters(s, rank, 2, rank, mx.cpu())[1] for rank in (0, 1)]
    assert vals[0].steps_per_epoch == vals[1].steps_per_epoch == math.ceil(11 / batch)
    assert vals[0].num_samples == vals[1].num_samples == 21
    seen = valid_labels(vals[0]) + valid_labels(vals[1])
    assert sorted(seen) == list(range(21))
    assert sum(vals[0].pads) == vals[0].steps_per_epoch * batch - 10
    assert sum(vals[1].pads) == vals[1].steps_per_epoch * batch - 11
    vals[0].reset()
    vals[0].next()  # a partly read eval: reset must still start the next one at the shard's first image
    assert valid_labels(vals[0]) == list(range(10))


def test_fixed_seed_gives_the_same_batches(small_rec):
    def first_batches(seed):
        train, _ = data.make_iters(settings_for(small_rec), 0, 1, seed, mx.cpu())
        return [(b.data[0].asnumpy(), b.label[0].asnumpy()) for b, _ in zip(train, range(3))]

    a, b, c = first_batches(5), first_batches(5), first_batches(6)
    assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, c))


def reference_val_image(jpeg_bytes, side, crop):
    """What the val pipeline computes, in PIL/NumPy: shorter side to `side`, centre crop, normalize (CHW).

    DALI keeps the exact scale side/shorter on both axes and rounds only the output size (subpixel_scale), so
    the source box is the output size divided by that scale, centred; PIL needs the edge pixels repeated to
    sample just past the border as DALI does. DALI's centre crop starts at floor((size - crop) / 2 + 0.5).
    """
    image = Image.open(io.BytesIO(jpeg_bytes)).convert("RGB")
    width, height = image.size
    scale = side / min(width, height)
    size = (round(width * scale), round(height * scale))
    margin = 2
    padded = Image.fromarray(np.pad(np.asarray(image), ((margin, margin), (margin, margin), (0, 0)), mode="edge"))
    box = ((width - size[0] / scale) / 2 + margin, (height - size[1] / scale) / 2 + margin,
           (width + size[0] / scale) / 2 + margin, (height + size[1] / scale) / 2 + margin)
    pixels = np.asarray(padded.resize(size, Image.BILINEAR, box=box), dtype=np.float32)
    top, left = (int(np.floor((n - crop) / 2 + 0.5)) for n in pixels.shape[:2])
    pixels = pixels[top:top + crop, left:left + crop]
    return ((pixels - np.array(data.MEAN)) / np.array(data.STD)).transpose(2, 0, 1)


def test_val_numbers_equal_a_pil_reference(small_rec):
    """Both decoders are libjpeg-turbo (identical pixels) and both resize filters are the antialiased triangle
    filter; what remains is that each rounds its resized pixels to uint8 on its own: at most 1 level, i.e.
    1/std after normalizing."""
    s = settings_for(small_rec, batch_size=21, image_shape="3,32,32")
    _, val = data.make_iters(s, 0, 1, 1, mx.cpu())
    ours = val.next().data[0].asnumpy()
    records = mx.recordio.MXIndexedRecordIO(small_rec + ".idx", small_rec + ".rec", "r")
    side = round(256 * 32 / 224)
    for key in records.keys:
        _, jpeg = mx.recordio.unpack(records.read_idx(key))
        reference = reference_val_image(jpeg, side, 32)
        np.testing.assert_allclose(ours[key], reference, rtol=0, atol=1.001 / min(data.STD))
    records.close()


@pytest.mark.parametrize("side", [32, 128])
def test_train_resize_without_antialias_is_plain_bilinear(unique_rec, side):
    """With the crop area fixed at 1 and any aspect ratio allowed every crop is the whole image, so a train sample
    is the image stretched to side x side (down from 40-96 pixels, or up), maybe mirrored: OpenCV's bilinear
    resize, ImageRecordIter's filter, gives the same pixels to 1 level (an antialiased resize does not, going
    down). The label tells which record a shuffled sample is."""
    s = settings_for(unique_rec, batch_size=21, image_shape=f"3,{side},{side}", num_classes=21,
                     min_random_area=1.0, min_random_aspect_ratio=0.2, max_random_aspect_ratio=5.0,
                     dali_resize_antialias=False)
    train, _ = data.make_iters(s, 0, 1, 1, mx.cpu())
    batch = train.next()
    records = mx.recordio.MXIndexedRecordIO(unique_rec + ".idx", unique_rec + ".rec", "r")
    mirrored = 0
    for x, label in zip(batch.data[0].asnumpy(), batch.label[0].asnumpy()):
        _, jpeg = mx.recordio.unpack(records.read_idx(int(label)))
        image = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
        pixels = cv2.resize(image, (side, side), interpolation=cv2.INTER_LINEAR).astype(np.float32)
        reference = ((pixels - np.array(data.MEAN)) / np.array(data.STD)).transpose(2, 0, 1)
        flipped = np.abs(x - reference[..., ::-1]).max() < np.abs(x - reference).max()
        mirrored += flipped
        np.testing.assert_allclose(x, reference[..., ::-1] if flipped else reference, rtol=0,
                                   atol=1.001 / min(data.STD))
    records.close()
    assert 0 < mirrored < 21, "the coin flip mirrors some samples, not all"


def test_a_batch_outlives_later_batches(small_rec):
    """The batches reach MXNet without a copy, and MXNet reads them asynchronously: a batch must not change while
    the pipeline goes on producing (it would with an executor that recycles output buffers)."""
    train, _ = data.make_iters(settings_for(small_rec, dali_prefetch_queue=1), 0, 1, 1, mx.cpu())
    assert train.pipe.exec_dynamic, "asked for, not left to DALI's default (1.51+; the Docker image has 1.48)"
    first = train.next().data[0]
    kept = first.asnumpy().copy()
    for _ in range(4):
        train.next()
    np.testing.assert_array_equal(first.asnumpy(), kept)


def test_a_cpu_batch_reaches_mxnet_without_a_synchronous_copy(small_rec, monkeypatch):
    """Images and labels share DALI's host buffers: nd.array's copy waits for the engine to take its write, which
    on the CPU engine's one worker queue waits for the operations queued before it (a step-wide sync)."""
    train, _ = data.make_iters(settings_for(small_rec), 0, 1, 1, mx.cpu())
    copies = []
    real = mx.nd.NDArray._sync_copyfrom
    monkeypatch.setattr(mx.nd.NDArray, "_sync_copyfrom", lambda self, src: (copies.append(self.shape), real(self, src)))
    batch = train.next()
    assert copies == []
    assert batch.label[0].shape == (4,) and batch.label[0].dtype == np.float32
    assert set(batch.label[0].asnumpy()) <= set(rec_labels(small_rec))


def test_the_gpu_handover_copies_into_a_ring_after_the_readers_are_done(small_rec, monkeypatch):
    """The GPU's hand-over run on the CPU: each batch is copied into one of RING persistent MXNet arrays, each
    reused only after MXNDArrayWaitToWrite, with the same values as the shared batches of the same seed; an
    engine operation pushed on a buffer before its turn comes back reads the batch it was given."""
    s = settings_for(small_rec)
    shared, _ = data.make_iters(s, 0, 1, 1, mx.cpu())
    copied, _ = data.make_iters(s, 0, 1, 1, mx.cpu())
    copied.handover = data.Handover(s, mx.cpu(), copy=True)
    waited = []
    real_wait = data.wait_for_readers
    monkeypatch.setattr(data.iters, "wait_for_readers", lambda array: (waited.append(array), real_wait(array))[1])
    (only,) = copied.handover.rings.values()  # one size: one ring
    ring = [buffers[0] for buffers in only]
    sums = []
    for step in range(2 * data.RING + 1):
        a, b = shared.next(), copied.next()
        assert b.data[0] is ring[step % data.RING]
        np.testing.assert_array_equal(a.data[0].asnumpy(), b.data[0].asnumpy())
        np.testing.assert_array_equal(a.label[0].asnumpy(), b.label[0].asnumpy())
        sums.append((a.data[0].asnumpy().astype(np.float64).sum(), b.data[0].astype("float64").sum()))
    assert [w.handle.value for w in waited[::2]] == [ring[k % data.RING].handle.value for k in range(2 * data.RING + 1)]
    for expected, read in sums:
        assert read.asscalar() == pytest.approx(expected, rel=1e-5)


def test_train_epoch_accounting_is_the_same_on_every_rank(small_rec):
    s = settings_for(small_rec)
    trains = [data.make_iters(s, rank, 2, rank, mx.cpu())[0] for rank in (0, 1)]
    expected = math.ceil(21 // 2 / 4)
    assert data.steps_per_epoch(s, 2) == expected
    for train in trains:
        assert train.steps_per_epoch == expected and train.num_samples == 21
        for _ in range(2):
            train.reset()
            batches = list(train)
            assert len(batches) == expected
            assert all(b.pad == 0 and b.data[0].shape[0] == 4 for b in batches)
            assert train.wait_seconds > 0


def test_synthetic_iterator(small_rec):
    s = settings_for(small_rec, synthetic=True, num_examples=100, image_shape="4,32,32", dtype="float16")
    train, val = data.make_iters(s, 1, 2, 1, mx.cpu())
    assert val is None and train.steps_per_epoch == math.ceil(50 / 4) and train.num_samples == 100
    batches = list(train)
    assert len(batches) == train.steps_per_epoch
    x = batches[0].data[0]
    assert x.shape == (4, 4, 32, 32) and x.dtype == np.float16 and x.context == mx.cpu()
    assert not x[:, 3].asnumpy().any() and batches[0].label[0].shape == (4,)
    assert all(b.data[0] is x for b in batches), "allocated once"


@pytest.mark.parametrize("damage", ["truncated", "not_an_image"])
def test_a_record_that_does_not_decode_is_named(small_rec, tmp_path, damage):
    """DALI names a sample whose data breaks mid-decode (by byte offset, mapped to the record index); a header it
    cannot parse comes with no name, and the .rec is searched for it."""
    bad = with_bad_records(small_rec, str(tmp_path / "bad"), {5}, damage)
    _, val = data.make_iters(settings_for(bad), 0, 1, 1, mx.cpu())
    expected = "does not decode" if damage == "truncated" else "is not an image"
    with pytest.raises(InputError, match=rf"bad\.rec: record 5 {expected}") as err:
        list(val)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "not_an_image"])
def test_train_skips_and_counts_bad_records_when_asked(unique_rec, tmp_path, capfd, damage):
    """With --skip-bad-records training goes on without record 5 and says so; its epochs keep their steps and
    the record never appears (the label of a sample is its record). Val still stops: the score counts all."""
    bad = with_bad_records(unique_rec, str(tmp_path / "bad"), {5}, damage)
    index = open(bad + ".idx").read()
    s = settings_for(bad, num_classes=21, skip_bad_records=True)
    train, val = data.make_iters(s, 0, 1, 1, mx.cpu())
    epochs = [valid_labels(train) for _ in range(3)]
    assert all(len(epoch) == 4 * math.ceil(21 / 4) for epoch in epochs), "every epoch keeps its steps"
    labels = sum(epochs, [])
    assert train.skipped == [5] and 5 not in labels and len(set(labels)) == 20
    assert "bad.rec: record 5" in capfd.readouterr().err
    with pytest.raises(InputError, match=r"bad\.rec: record 5"):
        list(val)
    scratch = train.scratch.name
    assert open(bad + ".idx").read() == index and os.path.isfile(os.path.join(scratch, "kept.idx"))
    del train
    gc.collect()
    assert not os.path.exists(scratch), "the shortened index goes with the iterator"


@pytest.mark.timeout(120)
def test_skipping_finds_each_unnamed_bad_record_once(unique_rec, tmp_path, capfd):
    """Two records that DALI cannot even identify: each failure is searched for in the index in use, which no
    longer lists the records already skipped (searching the original one found the first again, forever)."""
    bad = with_bad_records(unique_rec, str(tmp_path / "bad"), {5, 12}, "not_an_image")
    train, _ = data.make_iters(settings_for(bad, num_classes=21, skip_bad_records=True), 0, 1, 1, mx.cpu())
    labels = [label for _ in range(3) for label in valid_labels(train)]
    assert sorted(train.skipped) == [5, 12] and not {5, 12} & set(labels) and len(set(labels)) == 19
    assert capfd.readouterr().err.count("skipped (") == 2


def test_after_a_skip_the_reader_stays_in_step_with_the_other_ranks(unique_rec, tmp_path):
    """Rank 0 of 2 reads shard 0 (records 0-9) in epoch 1 and shard 1 (10-20) in epoch 2, as the other rank's
    reader moves on too. A bad record met in epoch 2 must not send its new pipeline back to shard 0: it begins
    shard 1 again (so 10-14 come twice), then moves on to shard 0 in epoch 3."""
    bad = with_bad_records(unique_rec, str(tmp_path / "bad"), {15}, "truncated")
    s = settings_for(bad, num_classes=21, skip_bad_records=True, dali_initial_fill=1, batch_size=5)
    train, _ = data.make_iters(s, 0, 2, 1, mx.cpu())
    epochs = [[int(label) for label in valid_labels(train)] for _ in range(3)]
    train.reset()  # the third epoch is counted when the next one begins
    assert train.skipped == [15] and train.epochs == 3
    assert sorted(epochs[0]) == list(range(10)), epochs
    assert all(label >= 10 for label in epochs[1]), epochs
    assert any(label < 10 for label in epochs[2]) and 15 not in epochs[2], epochs


def test_after_a_skip_the_progressive_sizes_still_follow_the_epochs(unique_rec, tmp_path):
    """A bad record in epoch 1 of a 32 -> 48 -> 64 px ramp rebuilds the pipeline mid-epoch, and the new one counts
    its batches from 0: the iterator's base step keeps each epoch at its own size (a base of 0 would train the start
    of epoch 2 at 32 px)."""
    bad = with_bad_records(unique_rec, str(tmp_path / "bad"), {9}, "truncated")
    s = settings_for(bad, num_classes=21, skip_bad_records=True, image_shape="3,64,64", prog_start_side=32,
                     prog_end_epoch=2, prog_step=16, submission_division="open")
    train, _ = data.make_iters(s, 0, 1, 1, mx.cpu())
    shapes = []
    for _ in range(3):
        train.reset()
        shapes.append({tuple(batch.data[0].shape[2:]) for batch in train})
    assert train.skipped == [9] and shapes == [{(32, 32)}, {(48, 48)}, {(64, 64)}], shapes


def test_a_label_outside_the_classes_is_named(small_rec, tmp_path):
    bad = rewrite_rec(small_rec, str(tmp_path / "labels"),
                      lambda key, header, image: (header._replace(label=7.0) if key == 9 else header, image))
    _, val = data.make_iters(settings_for(bad), 0, 1, 1, mx.cpu())
    with pytest.raises(InputError, match=r"labels\.rec: record 9 has label 7, not a class number in \[0, 3\)"):
        list(val)


def test_missing_idx_says_how_to_make_it(small_rec, tmp_path):
    shutil.copy(small_rec + ".rec", tmp_path / "lonely.rec")
    s = settings_for(str(tmp_path / "lonely"))
    with pytest.raises(InputError, match=r"lonely\.idx: no index .* python -m rn50_mx\.prep_rec pack"):
        data.make_iters(s, 0, 1, 1, mx.cpu())


def test_missing_rec_is_one_line(tmp_path):
    s = settings_for(str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match=r"nowhere\.rec: cannot read"):
        data.make_iters(s, 0, 1, 1, mx.cpu())


def test_built_iterators_read_no_file_until_opened(small_rec, tmp_path):
    """build_iters makes both pipelines while the data are not there (the readers initialise lazily, as the
    submission's); open_iters, the first data access, reads them once they are (the old code read the files to
    build)."""
    folder = tmp_path / "later"
    iters = data.build_iters(settings_for(str(folder / "small")), 0, 1, 1, mx.cpu())
    folder.mkdir()
    for ext in (".rec", ".idx"):
        shutil.copy(small_rec + ext, folder / ("small" + ext))
    train, val = data.open_iters(iters)
    assert train.num_samples == val.num_samples == 21 and val.steps_per_epoch == 6
    assert sorted(valid_labels(val)) == sorted(rec_labels(small_rec))
    assert len(list(train)) == train.steps_per_epoch == 6


def test_more_train_images_than_the_idx_lists_is_one_line_naming_it(small_rec):
    """--num-examples (NUMEXAMPLES) sizes the schedule before run_start; the .idx is its judge after it."""
    train, _ = data.make_iters(settings_for(small_rec, num_examples=21), 0, 1, 1, mx.cpu())
    assert train.num_samples == 21
    with pytest.raises(InputError, match=r"small\.idx: lists 21 records, fewer than the 22 train images an epoch "
                                         r"takes \(--num-examples, NUMEXAMPLES\)"):
        data.make_iters(settings_for(small_rec, num_examples=22), 0, 1, 1, mx.cpu())


def test_decoder_cache_needs_the_gpu(small_rec):
    with pytest.raises(InputError, match="dali-cache-size"):
        data.make_iters(settings_for(small_rec, dali_cache_size=64), 0, 1, 1, mx.cpu())


@pytest.mark.parametrize("train, roi, cache, antialias", [(True, True, 0, True), (True, True, 0, False),
                                                          (True, False, 0, True), (True, False, 64, True),
                                                          (False, True, 0, True)])
def test_gpu_graphs_are_valid_dali_graphs(small_rec, train, roi, cache, antialias):
    """No GPU here, so nothing runs; defining the graph still makes DALI check every operator, argument name and
    argument type of the "mixed"/GPU variants (building the pipeline would need CUDA)."""
    s = settings_for(small_rec, device="gpu", dtype="float16", input_layout="NHWC", image_shape="4,224,224",
                     dali_roi_decode=roi, dali_cache_size=cache, dali_resize_antialias=antialias,
                     dali_hw_decoder_load=0.7, dali_preallocate_width=5980, dali_preallocate_height=6430)
    for gpu in (True, False):
        with Pipeline(batch_size=4, num_threads=1, device_id=0 if gpu else None, exec_dynamic=True):
            images, labels, host_labels, sources = data.graph(s, s.data_train, small_rec + ".idx", train, 1, 8,
                                                              gpu=gpu)
        device = "gpu" if gpu else "cpu"
        assert images.device == labels.device == device and host_labels.device == sources.device == "cpu"


def test_input_memory_is_the_queue_and_the_ring_per_iterator():
    """NF5688M6: 408 images of 4x224x224 float16 (401,408 bytes) and a float32 label each, DALI's queue of 15
    and the 2 MXNet buffers, for train and val: 5.57 GB (the held batches of the old hand-over doubled it)."""
    s = Settings(batch_size=408, image_shape="4,224,224", dtype="float16", dali_prefetch_queue=15)
    assert data.input_memory(s) == 2 * (15 + data.RING) * 408 * (401408 + 4)
    assert data.input_memory(s, val=False) == data.input_memory(s) // 2


def test_records_with_several_labels_are_refused_in_one_line(small_rec, tmp_path):
    """GPU review 3, F5: a .rec whose records carry two labels each (IRHeader flag 2, im2rec --pack-label) gives
    DALI labels of shape (2,), twice the label buffer the GPU hand-over copies into without a size check: refused on
    either device, naming the record, before any copy."""
    prefix = rewrite_rec(small_rec, str(tmp_path / "two_labels"),
                         lambda key, header, image: (mx.recordio.IRHeader(2, [header.label, 0.0], key, 0), image))
    train, _ = data.make_iters(settings_for(prefix, data_val=""), 0, 1, 1, mx.cpu())
    with pytest.raises(InputError, match=r"two_labels\.rec: record \d+ carries 2 labels; training takes one"):
        train.next()


def test_the_hand_over_refuses_a_buffer_its_batch_does_not_fill(small_rec):
    """copy_to_external writes a DALI output's bytes to a raw pointer: each output's size and dtype are compared with
    the buffer it goes to, once per iterator (a batch larger than its buffer would be written past it)."""
    s = settings_for(small_rec)
    train, _ = data.make_iters(s, 0, 1, 1, mx.cpu())
    train.handover = data.Handover(s.replace(image_shape="3,64,64"), mx.cpu(), copy=True)
    with pytest.raises(InputError, match=r"DALI's images \(4 samples of \(3, 32, 32\), float32\) do not fit the "
                                         r"\(4, 3, 64, 64\) float32 buffer"):
        train.next()
