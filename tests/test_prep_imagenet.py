"""prep_rec imagenet on a small ImageNet in the official structure (tests/support/imagenet_archives.py): the archives read
in place give the files that packing their extracted tree gives; every layout gives the same files; the odd
files are re-encoded; each bad input is one line."""
import glob
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from tests.support import imagenet_archives as ia
from rn50_mx import prep_rec
from rn50_mx.errors import InputError
from rn50_mx.prep_rec import layouts, tars

from tests.support.prep_rec import assert_one_line_error, cli, file_bytes, read_records
from tests.support.procs import FAULT_STACKS, ended_after

SPLITS = ("train", "val")
FILES = [f"{split}.{ext}" for split in SPLITS for ext in ("lst", "rec", "idx")]


@pytest.fixture(scope="module")
def net():
    return ia.make()


@pytest.fixture(scope="module")
def archives(net, tmp_path_factory):
    """The three official archives; tests must not modify them (copy them first)."""
    return ia.write_archives(net, tmp_path_factory.mktemp("archives"))


@pytest.fixture(scope="module")
def packed(archives, tmp_path_factory):
    """The archives packed through the command line: (OUT_DIR, its stdout)."""
    out = tmp_path_factory.mktemp("packed")
    result = cli("imagenet", archives, out)
    assert result.returncode == 0, result.stderr
    return out, result.stdout


@pytest.fixture
def copy(archives, tmp_path):
    """A copy of the archives that a test may damage."""
    return shutil.copytree(archives, tmp_path / "src")


def extract(archives, dst, net):
    """The usual route's tree: the outer and inner train tars extracted, val sorted into WNID folders by the
    ground truth (as valprep.sh does)."""
    with tarfile.open(os.path.join(archives, ia.TRAIN_TAR)) as outer:
        for member in outer:
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                inner.extractall(dst / "train" / member.name[:-4])
    with tarfile.open(os.path.join(archives, ia.VAL_TAR)) as val:
        val.extractall(dst / "flat")
    for name in os.listdir(dst / "flat"):
        os.makedirs(dst / "val" / net.val_class[name], exist_ok=True)
        os.rename(dst / "flat" / name, dst / "val" / net.val_class[name] / name)
    return dst


def pack_tree(tree, out, **options):
    """`prep_rec pack` of the extracted tree, val labelled by train's folders."""
    train = prep_rec.pack(str(tree / "train"), str(out / "train"), **options)
    classes = {item.path.split("/")[0]: item.label for item in prep_rec.read_lst(str(out / "train.lst"))}
    prep_rec.pack(str(tree / "val"), str(out / "val"), classes=classes, **options)
    return train


def test_archives_give_what_packing_their_extracted_tree_gives(archives, packed, net, tmp_path):
    tree = extract(archives, tmp_path / "tree", net)
    pack_tree(tree, tmp_path / "usual")
    kept = prep_rec.pack_imagenet(archives, str(tmp_path / "kept"), keep_odd_bytes=True, on_found=lambda line: None)
    assert kept[0].notes == ()
    for name in FILES:  # --keep-odd-bytes: the same files, byte for byte
        assert file_bytes(tmp_path / "kept" / name) == file_bytes(tmp_path / "usual" / name), name
    out = packed[0]
    for split in SPLITS:  # by default: the same list and records, but the odd files re-encoded
        assert file_bytes(out / f"{split}.lst") == file_bytes(tmp_path / "usual" / f"{split}.lst")
        ours, usual = read_records(str(out / split)), read_records(str(tmp_path / "usual" / split))
        assert ours[1] == usual[1]
        paths = {item.index: item.path for item in prep_rec.read_lst(str(out / f"{split}.lst"))}
        differ = {paths[key] for key in ours[1] if ours[0][key][1] != usual[0][key][1]}
        assert differ == (set(net.odd) if split == "train" else set())
        assert all(ours[0][key][0] == usual[0][key][0] for key in ours[1])  # headers: same labels and ids


def test_labels_are_the_sorted_wnid_index_not_the_devkit_order(packed, net):
    assert list(net.ids) != sorted(net.ids)  # the devkit lists the classes in another order
    wnids = sorted(net.train)
    for split in SPLITS:
        records, keys = read_records(str(packed[0] / split))
        items = {item.index: item for item in prep_rec.read_lst(str(packed[0] / f"{split}.lst"))}
        for key in keys:
            wnid, name = items[key].path.split("/")
            assert records[key][0].label == wnids.index(wnid) == items[key].label
            assert wnid == (net.val_class[name] if split == "val" else name.split("_")[0])
        expected = sum(map(len, net.train.values())) if split == "train" else len(net.val)
        assert len(keys) == expected and keys != sorted(keys)  # all of them, shuffled


def test_odd_files_are_re_encoded_as_rgb_and_listed(packed, net):
    out, stdout = packed
    lines = stdout.strip().splitlines()
    assert lines[0].endswith(f"the official archives {ia.TRAIN_TAR}, {ia.VAL_TAR} and {ia.DEVKIT}, read in place")
    assert len(lines) == 3 and "2 odd files re-encoded as RGB JPEG" in lines[2]
    for path, kind in net.odd.items():
        assert f"{path} ({kind})" in lines[2]
    records, _ = read_records(str(out / "train"))
    by_path = {item.path: records[item.index][1] for item in prep_rec.read_lst(str(out / "train.lst"))}
    for path in net.odd:
        with Image.open(io.BytesIO(by_path[path])) as img:
            assert (img.format, img.mode) == ("JPEG", "RGB")
    grey = f"{ia.ODD['grey'][:9]}/{ia.ODD['grey']}"
    assert by_path[grey] == net.train[grey[:9]][ia.ODD["grey"]]  # grayscale JPEG: bytes kept
    assert Image.open(io.BytesIO(by_path[grey])).mode == "L"


@pytest.mark.parametrize("layout", ["kaggle", "extracted", "class_folders"])
def test_every_layout_gives_the_same_files(layout, packed, net, tmp_path):
    src = getattr(ia, f"write_{layout}")(net, tmp_path / "src")
    seen = []
    prep_rec.pack_imagenet(src, str(tmp_path / "out"), classes=len(net.train), on_found=seen.append)
    assert len(seen) == 1 and seen[0].startswith(src)
    for name in FILES:
        assert file_bytes(tmp_path / "out" / name) == file_bytes(packed[0] / name), name


def test_dali_and_image_record_iter_read_the_result(packed, net):
    from nvidia.dali import fn, pipeline_def, types

    prefix = str(packed[0] / "train")
    count = sum(map(len, net.train.values()))

    @pipeline_def(batch_size=count, num_threads=1, device_id=None)
    def read():
        jpegs, labels = fn.readers.mxnet(path=[prefix + ".rec"], index_path=[prefix + ".idx"], random_shuffle=False)
        return fn.decoders.image(jpegs, device="cpu", output_type=types.RGB), labels

    pipe = read()
    pipe.build()
    images, labels = pipe.run()
    assert all(np.array(images[i]).shape[2] == 3 for i in range(count))
    records, keys = read_records(prefix)
    assert [np.array(labels[i]).item() for i in range(count)] == [records[k][0].label for k in keys]
    it = mx.io.ImageRecordIter(path_imgrec=prefix + ".rec", path_imgidx=prefix + ".idx", data_shape=(3, 32, 32),
                               resize=32, batch_size=count, shuffle=False)
    assert next(iter(it)).label[0].asnumpy().tolist() == [records[k][0].label for k in keys]
    assert prep_rec.verify(prefix, num_classes=len(net.train)).problems == ()


# --- bad input: one line naming the archive or member, nothing written ---------------------------------------

def cut(path, keep):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep(len(data))])


def rewrite_class_tar(src, wnid, change):
    """The train tar again, with class tar `wnid` replaced by change(its bytes)."""
    path = os.path.join(src, ia.TRAIN_TAR)
    with tarfile.open(path) as outer:
        classes = {m.name: outer.extractfile(m).read() for m in outer}
    classes[f"{wnid}.tar"] = change(classes[f"{wnid}.tar"])
    ia.write(path, ia.tar_bytes(classes))


def drop_one_image(data):
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar}
    return ia.tar_bytes(dict(list(files.items())[1:]))


def rename_class(src, net):
    path = os.path.join(src, ia.TRAIN_TAR)
    with tarfile.open(path) as outer:
        classes = {m.name: outer.extractfile(m).read() for m in outer}
    classes["n09999999.tar"] = classes.pop(f"{ia.WNIDS[0]}.tar")
    ia.write(path, ia.tar_bytes(classes))


BAD = {  # name: (how to damage the copy of the archives, what the line names, what it says)
    "truncated train tar": (lambda src, net: cut(os.path.join(src, ia.TRAIN_TAR), lambda n: n // 2),
                            ia.TRAIN_TAR, "truncated tar"),
    "truncated val tar": (lambda src, net: cut(os.path.join(src, ia.VAL_TAR), lambda n: n // 2 + 100),
                          ia.VAL_TAR, "truncated tar"),
    "class tar that is not a tar": (lambda src, net: rewrite_class_tar(src, ia.WNIDS[2], lambda d: b"<html>" * 300),
                                    f"member {ia.WNIDS[2]}.tar", "not a tar"),
    "unknown WNID": (rename_class, "member n09999999.tar", "unknown WNID n09999999"),
    "a class one image short": (lambda src, net: rewrite_class_tar(src, ia.WNIDS[3], drop_one_image),
                                f"member {ia.WNIDS[3]}.tar", "meta.mat says"),
    "ground truth one line short": (
        lambda src, net: ia.write_devkit(net, os.path.join(src, ia.DEVKIT), ia.ground_truth(net)[:-2]),
        "ILSVRC2012_validation_ground_truth.txt", "lines, but"),
    "ground truth with an unknown class": (
        lambda src, net: ia.write_devkit(net, os.path.join(src, ia.DEVKIT), b"9\n" + ia.ground_truth(net)[2:]),
        "ILSVRC2012_validation_ground_truth.txt:1", "not the ILSVRC2012_ID of a class"),
    "devkit that is not a gzip": (lambda src, net: cut(os.path.join(src, ia.DEVKIT), lambda n: 100),
                                  ia.DEVKIT, "cannot read as a tar"),
    "val archive missing": (lambda src, net: os.remove(os.path.join(src, ia.VAL_TAR)),
                            "src", f"archives layout): missing {ia.VAL_TAR}"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_archives_are_one_line_and_write_nothing(case, copy, net, tmp_path):
    damage, names, says = BAD[case]
    damage(copy, net)
    result = cli("imagenet", copy, tmp_path / "out")
    assert_one_line_error(result, names)
    assert says in result.stderr
    assert not (tmp_path / "out").exists()


def test_kaggle_csv_and_folder_must_agree(net, tmp_path):
    src = ia.write_kaggle(net, tmp_path / "kaggle")
    csv = os.path.join(src, "LOC_val_solution.csv")
    with open(csv) as f:
        rows = f.read().splitlines()
    with open(csv, "w") as f:
        f.write("\n".join(rows[:-1]) + "\n")
    result = cli("imagenet", src, tmp_path / "out", "--classes", len(net.train))
    assert_one_line_error(result, "ILSVRC/Data/CLS-LOC/val/" + rows[-1].split(",")[0])
    assert "not listed in" in result.stderr
    with open(csv, "w") as f:
        f.write("\n".join(rows[:-1] + [rows[-1].replace(rows[-1].split(",")[1][:9], "n09999999")]) + "\n")
    result = cli("imagenet", src, tmp_path / "out", "--classes", len(net.train))
    assert_one_line_error(result, "n09999999")
    assert "which train does not have" in result.stderr
    result = cli("imagenet", src, tmp_path / "out")  # no devkit or synset list: 1,000 classes expected
    assert_one_line_error(result, "train has 5 classes, expected 1000")


def test_nothing_there_and_md5_are_one_line(archives, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("imagenet", tmp_path / "empty", tmp_path / "out"), "no ImageNet here")
    result = cli("imagenet", archives, tmp_path / "out", "--check-md5")
    assert_one_line_error(result, ia.TRAIN_TAR)
    assert "not the official 1d675b47d978889d74fa0da5fadfb00e" in result.stderr
    assert not (tmp_path / "out").exists()


def test_interrupted_run_leaves_nothing_complete(net, tmp_path):
    """A train image that is a FIFO never delivers, so the run is inside train's records when it is stopped."""
    src = ia.write_extracted(net, tmp_path / "src")
    stuck = os.path.join(src, "train", ia.WNIDS[0], sorted(net.train[ia.WNIDS[0]])[0])
    os.remove(stuck)
    os.mkfifo(stuck)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "rn50_mx.prep_rec", "imagenet", src, out, "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **FAULT_STACKS})
    while not glob.glob(str(out / "train.rec.*.tmp")):  # the writer's own temporary name (files.temp_name)
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    stdout, stderr = ended_after(proc, signal.SIGTERM)
    assert proc.returncode == 130 and stderr.strip() == "prep_rec: interrupted", (proc.returncode, stderr[-3000:])
    assert sorted(os.listdir(out)) == ["val.idx", "val.lst", "val.rec"]  # val was complete; train is not there
    assert f"val.rec: {len(net.val)} images" in stdout and prep_rec.verify(str(out / "val")).problems == ()


def test_verify_passes_a_one_pixel_jpeg(tmp_path):
    """verify decoded JPEGs at 1/8 scale, which is 0x0 for an image under 8 pixels: a good image called bad."""
    for size in ((1, 1), (7, 3)):
        os.makedirs(tmp_path / "tiny" / "dot", exist_ok=True)
        Image.new("RGB", size, (200, 10, 10)).save(tmp_path / "tiny" / "dot" / f"{size[0]}.jpg")
    prep_rec.pack(str(tmp_path / "tiny"), str(tmp_path / "tiny_rec"))
    assert prep_rec.verify(str(tmp_path / "tiny_rec")).problems == ()


@pytest.mark.parametrize("progressive", [False, True])
def test_jpeg_components_agree_with_pillow(progressive):
    """The marker walk that finds CMYK JPEGs tells what Pillow's full header parse tells, past a large EXIF
    segment and in progressive files too."""
    from rn50_mx.prep_rec.images import jpeg_components

    picture = ia.fashion_picture()(0)
    for mode in ("RGB", "L", "CMYK"):
        out = io.BytesIO()
        picture.convert(mode).save(out, "JPEG", progressive=progressive, exif=b"Exif\0\0" + b"x" * 60000)
        with Image.open(io.BytesIO(out.getvalue())) as img:
            assert jpeg_components(out.getvalue()) == len(img.getbands()) == {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    assert jpeg_components(b"\xff\xd8\xff\xe0\x00") is None


def test_a_tar_holding_two_members_of_one_name_is_one_line(tmp_path):
    """Two val members of one name took the second's label and both were packed: refused, naming the archive."""
    path = tmp_path / "ILSVRC2012_img_val.tar"
    with tarfile.open(path, "w") as tar:
        for data in (b"first", b"second"):
            info = tarfile.TarInfo("ILSVRC2012_val_00000001.JPEG")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fd, size = tars.open_archive(str(path))
    try:
        with pytest.raises(InputError, match=r"ILSVRC2012_img_val\.tar: holds two members named "
                                             r"'ILSVRC2012_val_00000001\.JPEG'"):
            tars.members(fd, 0, size, str(path))
    finally:
        os.close(fd)


def test_a_devkit_member_larger_than_a_devkit_file_is_refused_before_it_is_read(tmp_path):
    """The devkit's members were read whole whatever their size (a small archive holding a 3 GB member took 3 GB of
    memory): the header's size is checked first."""
    path = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    huge = tars.SMALL_FILE_LIMIT + 1
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("ILSVRC2012_devkit_t12/data/meta.mat")
        info.size = huge
        tar.addfile(info, io.BytesIO(bytes(huge)))
    with pytest.raises(InputError, match=r"member 'ILSVRC2012_devkit_t12/data/meta\.mat' has \d+ bytes, more than"):
        tars.small_files(str(path), ("meta.mat",))


def test_kaggle_s_csv_with_a_byte_order_mark_is_read(tmp_path):
    """A CSV saved with a byte-order mark was refused with "expected the header 'ImageId,PredictionString'" although
    its header reads exactly that."""
    path = tmp_path / "LOC_val_solution.csv"
    path.write_text("\ufeffImageId,PredictionString\nILSVRC2012_val_00000001,n01751748 1 2 3 4\n", encoding="utf-8")
    assert layouts.label_by_kaggle_csv(str(path)) == {"ILSVRC2012_val_00000001.JPEG": "n01751748"}
    path.write_text("Image,Prediction\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"expected the header 'ImageId,PredictionString', got 'Image,Prediction'"):
        layouts.label_by_kaggle_csv(str(path))


def test_an_unwritable_output_is_refused_before_any_archive_is_read(tmp_path):
    """The outputs are owned before the archives are read (with --check-md5 a 155 GB read): here the archives are
    FIFOs, which a read would wait on forever; the old order read them first."""
    src = tmp_path / "raw"
    src.mkdir()
    for name in ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "ILSVRC2012_devkit_t12.tar.gz"):
        os.mkfifo(src / name)
    try:
        result = subprocess.run([sys.executable, "-m", "rn50_mx.prep_rec", "imagenet", str(src), "/proc/rn50/out"],
                                capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the archives were read before the output was checked")
    assert_one_line_error(result, "/proc/rn50/out: cannot create")
