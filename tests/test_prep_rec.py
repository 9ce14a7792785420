"""prep_rec on real data: the small JPEG tree of conftest, its .rec, and Fashion-MNIST itself."""
import io
import os
import shutil
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from rn50_mx import prep_rec
from rn50_mx.errors import InputError

from tests.support.data import CLASSES, PER_CLASS
from tests.support.prep_rec import assert_one_line_error, cli, file_bytes, read_records
from tests.support.procs import FAULT_STACKS, ROOT, ended_after, py, run


@pytest.fixture
def tree(jpeg_tree, tmp_path):
    """A copy of the JPEG tree that a test may damage."""
    return shutil.copytree(jpeg_tree, tmp_path / "tree")


# --- Fashion-MNIST loader ------------------------------------------------------------------------------

def test_load_fashion_mnist_gives_the_whole_dataset():
    images, labels = prep_rec.load_fashion_mnist("test")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [1000] * 10
    assert 50 < images.mean() < 100  # real pictures: dark background, bright garments


def test_load_fashion_mnist_missing_files_say_how_to_install(tmp_path):
    with pytest.raises(InputError, match="apt-get install dataset-fashion-mnist"):
        prep_rec.load_fashion_mnist("train", root=str(tmp_path))


# --- what pack writes ----------------------------------------------------------------------------------

def test_records_hold_labels_and_original_bytes(small_rec, jpeg_tree):
    records, keys = read_records(small_rec)
    paths = sorted(os.path.join(c, f) for c in CLASSES for f in os.listdir(os.path.join(jpeg_tree, c)))
    assert keys == list(range(len(CLASSES) * PER_CLASS))  # no shuffle: sorted order
    for key in keys:
        header, image = records[key]
        assert (header.flag, header.id, header.id2) == (0, key, 0)
        assert header.label == CLASSES.index(paths[key].split("/")[0])
        assert image == file_bytes(os.path.join(jpeg_tree, paths[key]))
    lst = [line.split("\t") for line in open(small_rec + ".lst").read().splitlines()]
    assert lst == [[str(k), f"{records[k][0].label:f}", paths[k]] for k in keys]


def test_pack_shuffles_reproducibly_and_threads_keep_the_list_order(jpeg_tree, small_rec, tmp_path):
    one = prep_rec.pack(jpeg_tree, str(tmp_path / "one"), workers=1)
    two = prep_rec.pack(jpeg_tree, str(tmp_path / "two"), workers=2)
    assert (one.images, one.classes, one.bytes) == (len(CLASSES) * PER_CLASS, len(CLASSES), two.bytes)
    for ext in ("lst", "rec", "idx"):
        assert file_bytes(tmp_path / f"one.{ext}") == file_bytes(tmp_path / f"two.{ext}")
    shuffled, keys = read_records(str(tmp_path / "one"))
    assert keys != sorted(keys) and sorted(keys) == read_records(small_rec)[1]
    assert shuffled == read_records(small_rec)[0]


def test_image_record_iter_reads_our_records(small_rec):
    it = mx.io.ImageRecordIter(path_imgrec=small_rec + ".rec", path_imgidx=small_rec + ".idx",
                               data_shape=(3, 32, 32), resize=32, batch_size=PER_CLASS, shuffle=False)
    labels = [batch.label[0].asnumpy().tolist() for batch in it]
    assert labels == [[float(c)] * PER_CLASS for c in range(len(CLASSES))]


def dali_records(prefix):
    """[(label, image bytes)] of every record as DALI's fn.readers.mxnet delivers them (CPU, in file order),
    after checking that DALI's decoder makes an RGB image of each."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=PER_CLASS, num_threads=1, device_id=None)
    def read():
        jpegs, labels = fn.readers.mxnet(path=[prefix + ".rec"], index_path=[prefix + ".idx"],
                                         random_shuffle=False, name="reader")
        return jpegs, labels, fn.decoders.image(jpegs, device="cpu")

    pipe = read()
    pipe.build()
    assert pipe.epoch_size("reader") == len(CLASSES) * PER_CLASS
    seen = []
    for _ in range(len(CLASSES)):
        jpegs, labels, images = pipe.run()
        for i in range(PER_CLASS):
            assert np.array(images[i]).shape[2] == 3
            seen.append((np.array(labels[i]).item(), np.array(jpegs[i]).tobytes()))
    return seen


def test_dali_mxnet_reader_reads_our_records(small_rec):
    records, keys = read_records(small_rec)
    assert dali_records(small_rec) == [(records[k][0].label, records[k][1]) for k in keys]


def test_same_records_as_im2rec(jpeg_tree, tmp_path):
    pytest.importorskip("cv2", reason="mxnet.tools.im2rec imports cv2 (opencv-python-headless)")
    im2rec = [sys.executable, "-m", "mxnet.tools.im2rec"]
    subprocess.run([*im2rec, "--list", "--recursive", tmp_path / "im2rec", jpeg_tree], check=True,
                   capture_output=True)
    ours = prep_rec.pack(jpeg_tree, str(tmp_path / "ours"))
    from_list = prep_rec.pack(jpeg_tree, str(tmp_path / "from_list"), list_file=str(tmp_path / "im2rec.lst"))
    assert ours.bytes == from_list.bytes
    subprocess.run([*im2rec, "--pass-through", "--num-thread", "2", tmp_path / "im2rec", jpeg_tree],
                   check=True, capture_output=True)
    for ext in ("lst", "rec", "idx"):  # the same list, records and index, byte for byte
        assert file_bytes(tmp_path / f"ours.{ext}") == file_bytes(tmp_path / f"im2rec.{ext}")
        assert file_bytes(tmp_path / f"from_list.{ext}") == file_bytes(tmp_path / f"im2rec.{ext}")


def test_classes_from_another_list_keeps_train_labels(jpeg_tree, small_rec, tmp_path):
    val = tmp_path / "val"
    for name in CLASSES[1:]:
        shutil.copytree(os.path.join(jpeg_tree, name), val / name)
    result = cli("pack", val, tmp_path / "val_packed", "--classes-from", small_rec + ".lst")
    assert result.returncode == 0, result.stderr
    assert "14 images, 2 classes" in result.stdout
    labels = {header.label for header, _ in read_records(str(tmp_path / "val_packed"))[0].values()}
    assert labels == {1.0, 2.0}


def test_a_jpeg_holding_the_magic_word_reads_whole(tree, tmp_path):
    """mxnet's writer splits a record where the payload holds the RecordIO magic at a 4-byte boundary."""
    magic = (0xCED7230A).to_bytes(4, "little")
    photo = Image.open(tree / CLASSES[0] / "img000.jpg")
    for pad in range(4):
        buf = io.BytesIO()
        photo.save(buf, "JPEG", quality=90, comment=b"#" * pad + magic)
        data = buf.getvalue()
        if (24 + data.index(magic)) % 4 == 0:  # 24 = IRHeader size
            break
    (tree / CLASSES[0] / "img000.jpg").write_bytes(data)
    prep_rec.pack(str(tree), str(tmp_path / "m"), shuffle=False)
    offsets = [int(line.split("\t")[1]) for line in open(tmp_path / "m.idx").read().splitlines()[:2]]
    assert offsets[1] - offsets[0] == (24 + len(data) + 3) // 4 * 4 + 12  # two part headers, magic dropped
    assert read_records(str(tmp_path / "m"))[0][0][1] == data == dali_records(str(tmp_path / "m"))[0][1]
    assert prep_rec.verify(str(tmp_path / "m")).problems == ()


# --- verify ------------------------------------------------------------------------------------------------

def test_verify_passes_good_records(small_rec):
    summary = prep_rec.verify(small_rec, num_classes=len(CLASSES), workers=2)
    assert (summary.images, summary.classes, summary.problems) == (len(CLASSES) * PER_CLASS, len(CLASSES), ())
    assert prep_rec.verify(small_rec, num_classes=2).problems[0][2] == "label 2 is not a class number below 2"


def test_verify_catches_a_truncated_jpeg(tree, tmp_path):
    victim = tree / CLASSES[1] / "img002.jpg"
    victim.write_bytes(file_bytes(victim)[:-200])
    prep_rec.pack(str(tree), str(tmp_path / "t"), shuffle=False)
    result = cli("verify", tmp_path / "t")
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and "1 BAD" in lines[-1]
    assert f"record {PER_CLASS + 2} at offset" in lines[0] and "truncated" in lines[0]


def test_verify_catches_a_corrupted_idx(small_rec, tmp_path):
    prefix = str(tmp_path / "c")
    shutil.copy(small_rec + ".rec", prefix + ".rec")
    lines = open(small_rec + ".idx").read().splitlines()
    key, offset = lines[3].split("\t")
    lines[3] = f"{key}\t{int(offset) + 4}"   # points into the middle of a record
    with open(prefix + ".idx", "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")   # and the last record is no longer indexed
    bad = prep_rec.verify(prefix).problems
    assert [problem.split(" (")[0] for _, _, problem in bad] == [
        "no record starts here", "the .rec has bytes here that no record of the .idx covers"]
    assert bad[0][:2] == (3, int(offset) + 4)


# --- bad input and interruptions -----------------------------------------------------------------------

def test_missing_or_empty_source_is_one_line(tmp_path):
    assert_one_line_error(cli("pack", tmp_path / "nowhere", tmp_path / "out"), tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("pack", tmp_path / "empty", tmp_path / "out"), tmp_path / "empty")
    assert not list(tmp_path.glob("out*"))


def test_class_folder_without_images_is_one_line(tree, tmp_path):
    (tree / "dress").mkdir()
    (tree / "dress" / "notes.txt").write_text("no pictures here")
    assert_one_line_error(cli("pack", tree, tmp_path / "out"), tree / "dress")


@pytest.mark.parametrize("kind", ["web page", "link to /dev/zero"])
def test_non_image_file_is_one_line_or_skipped(tree, tmp_path, kind):
    """A file that is not an image, or a device named like one (/dev/zero never ends: the pack read it until memory
    ran out): refused in one line, or skipped with --skip-bad."""
    bad = tree / CLASSES[0] / "zzz.jpg"
    if kind == "web page":
        bad.write_text("<html>404 not found</html>")
    else:
        bad.symlink_to("/dev/zero")
    assert_one_line_error(cli("pack", tree, tmp_path / "out", "--workers", 2), bad)
    assert not list(tmp_path.glob("out*"))
    result = cli("pack", tree, tmp_path / "out", "--skip-bad")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert str(bad) in result.stderr and "1 bad files skipped" in result.stdout
    assert len(read_records(str(tmp_path / "out"))[1]) == len(CLASSES) * PER_CLASS


def test_unreadable_file_is_one_line(tree, small_rec, tmp_path):
    """Mode 0 stops other users; root reads any mode (CI runs as root), so there a listed path that is a directory
    stands for the file that cannot be read."""
    locked = tree / CLASSES[2] / "img000.jpg"
    if os.geteuid() == 0:
        locked.unlink()
        locked.mkdir()
    else:
        locked.chmod(0)
    assert_one_line_error(cli("pack", tree, tmp_path / "out", "--list", small_rec + ".lst"), locked)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_pack_leaves_nothing_complete(jpeg_tree, small_rec, tmp_path, sig):
    """The last listed 'image' is a FIFO that never delivers, so the pack is mid-way when it is killed."""
    os.mkfifo(tmp_path / "stuck.jpg")
    lst = tmp_path / "stuck.lst"
    lst.write_text(open(small_rec + ".lst").read() + f"99\t0.000000\t{tmp_path / 'stuck.jpg'}\n")
    out = tmp_path / "out" / "train"
    proc = subprocess.Popen([sys.executable, "-m", "rn50_mx.prep_rec", "pack", jpeg_tree, out, "--list", lst,
                             "--workers", "1"], stderr=subprocess.PIPE, text=True, env={**os.environ, **FAULT_STACKS})
    while not (out.parent.exists() and any(name.endswith(".tmp") for name in os.listdir(out.parent))):
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    stderr = ended_after(proc, sig)[1]
    assert proc.returncode != 0
    left = sorted(os.listdir(out.parent))
    assert not {"train.rec", "train.idx", "train.lst"} & set(left)
    if sig == signal.SIGTERM:  # cleaned up, with one line
        assert left == [] and stderr.strip() == "prep_rec: interrupted"


def test_a_stop_as_the_record_writer_opens_is_the_one_line(jpeg_tree, tmp_path):
    """SIGTERM just after MXNet's record writer made its .rec and before it opened its .idx, where the test above
    can land (it signals once the .rec.tmp is there): MXIndexedRecordIO, left marked open without its .idx file,
    printed a traceback from its __del__ after the one line. Here the writer's own creation sends the SIGTERM (a
    sitecustomize), so the stop lands there every time."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, signal\n"
        "from mxnet import recordio\n"
        "made = recordio.MXRecordIO.open\n"
        "def open_then_stop(self):\n"
        "    made(self)\n"
        "    if self.flag == 'w':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "recordio.MXRecordIO.open = open_then_stop\n")
    out = tmp_path / "out" / "train"
    result = run(py("rn50_mx.prep_rec", "pack", jpeg_tree, out), env={"PYTHONPATH": f"{site}:{ROOT}"})
    assert (result.returncode, result.stderr.strip()) == (130, "prep_rec: interrupted"), result.stderr[-2000:]
    assert os.listdir(out.parent) == []


# --- the imagenet and fashion-mnist commands ---------------------------------------------------------------

def test_imagenet_labels_val_by_train_classes(jpeg_tree, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(jpeg_tree, raw / "train")
    shutil.copytree(os.path.join(jpeg_tree, CLASSES[2]), raw / "val" / CLASSES[2])
    train, val = prep_rec.pack_imagenet(str(raw), str(tmp_path / "out"), classes=3)
    assert (train.images, train.classes, val.images, val.classes) == (21, 3, 7, 1)
    assert {h.label for h, _ in read_records(str(tmp_path / "out" / "val"))[0].values()} == {2.0}
    shutil.copytree(os.path.join(jpeg_tree, CLASSES[0]), raw / "val" / "sweater")
    result = cli("imagenet", raw, tmp_path / "again", "--classes", 3)
    assert_one_line_error(result, raw / "val" / "sweater")
    assert not (tmp_path / "again").exists() or not os.listdir(tmp_path / "again")


def test_fashion_mnist_is_deterministic_and_keeps_dataset_labels(tmp_path):
    kw = dict(size=16, train_per_class=3, val_per_class=2, progress=False)
    train, val = prep_rec.make_fashion_mnist(str(tmp_path / "a"), **kw)
    assert (train.images, train.classes, val.images, val.classes) == (30, 10, 20, 10)
    prep_rec.make_fashion_mnist(str(tmp_path / "b"), **kw)
    for name in ("train.rec", "train.idx", "train.lst", "val.rec", "val.idx", "val.lst"):
        assert file_bytes(tmp_path / "a" / name) == file_bytes(tmp_path / "b" / name)
    assert sorted(os.listdir(tmp_path / "a")) == sorted(os.listdir(tmp_path / "b"))
    for split, prefix in (("train", "train"), ("test", "val")):
        _, labels = prep_rec.load_fashion_mnist(split)
        for item in prep_rec.read_lst(str(tmp_path / "a" / f"{prefix}.lst")):
            folder, name = item.path.split("/")
            assert item.label == labels[int(name[:5])] == prep_rec.FASHION_MNIST_CLASSES.index(folder)
        assert not prep_rec.verify(str(tmp_path / "a" / prefix), num_classes=10).problems
    assert prep_rec.make_fashion_mnist(str(tmp_path / "a"), **kw) is None  # complete: skipped
    result = cli("fashion-mnist", tmp_path / "a", "--size", 16, "--train-per-class", 3, "--val-per-class", 2)
    assert result.returncode == 0 and "already complete" in result.stdout
