"""Where ImageNet's images are in SRC, in each layout users download or make, and what labels them.

  archives     the official ILSVRC2012_img_train.tar (a tar of 1,000 class tars), ILSVRC2012_img_val.tar (flat)
               and ILSVRC2012_devkit_t12.tar.gz (meta.mat, the val ground truth), read in place
  kaggle       ILSVRC/Data/CLS-LOC/train/<WNID>/, a flat ILSVRC/Data/CLS-LOC/val/, LOC_val_solution.csv
  extracted    train/<WNID>/, a flat val/, and the devkit (its .tar.gz, or extracted)
  folders      train/<class>/ and val/<class>/
Each gives an Entry per image, with the WNID (class folder) it belongs to; the devkit, when there, also gives
the number of classes and each class's train image count to check against. The devkit's readme: meta.mat's
`synsets` with ILSVRC2012_ID 1-1000 are the leaf classes; the ground truth holds one ILSVRC2012_ID per val
image, in ascending order of file name.
"""
import csv
import io
import multiprocessing
import os
import signal
from collections import namedtuple
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Optional

import scipy.io

from ..errors import InputError
from ..files import read_bytes, regular_input
from . import tars
from .folders import image_entries, image_files, list_classes, size_of
from .records import progress_bar

TRAIN_TAR, VAL_TAR, DEVKIT = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "ILSVRC2012_devkit_t12.tar.gz"
DEVKIT_DIR = "ILSVRC2012_devkit_t12"
META, GROUND_TRUTH = "data/meta.mat", "data/ILSVRC2012_validation_ground_truth.txt"
KAGGLE = "ILSVRC/Data/CLS-LOC"
KAGGLE_VAL, KAGGLE_SYNSETS = "LOC_val_solution.csv", "LOC_synset_mapping.txt"

# An image: class folder (WNID), file name, and where its bytes are: `path` is a file of its own (offset None)
# or an archive holding them at [offset, offset + size).
Entry = namedtuple("Entry", "wnid name path offset size")


@dataclass
class Found:
    """What a layout found in SRC: its one-line description, the images, and what the devkit says of them."""
    layout: str
    train: list
    val: list
    classes: Optional[int] = None  # the devkit's (or Kaggle's synset list's) number of classes
    train_counts: Optional[dict] = None  # {WNID: train images} of meta.mat
    where: dict = None  # {WNID: the archive member or folder holding the class}, for messages


# --- finding the layout ---------------------------------------------------------------------------------

def has_images(folder):
    return os.path.isdir(folder) and any(image_entries(folder))


def has_folders(folder):
    return os.path.isdir(folder) and any(entry.is_dir() for entry in os.scandir(folder))


def devkit_in(src):
    """The devkit in SRC: its .tar.gz, or the folder it extracts to, or None."""
    for path in (os.path.join(src, DEVKIT), os.path.join(src, DEVKIT_DIR)):
        if os.path.exists(path):
            return path
    return None


def requirements(src):
    """{layout: [(what it needs, present?)]}, in the order the layouts are tried."""
    isfile, isdir, join = os.path.isfile, os.path.isdir, os.path.join
    return {
        "archives": [(name, isfile(join(src, name))) for name in (TRAIN_TAR, VAL_TAR, DEVKIT)],
        "kaggle": [(f"{KAGGLE}/train/", isdir(join(src, KAGGLE, "train"))),
                   (f"{KAGGLE}/val/ (flat)", has_images(join(src, KAGGLE, "val"))),
                   (KAGGLE_VAL, isfile(join(src, KAGGLE_VAL)))],
        "extracted": [("train/", isdir(join(src, "train"))), ("val/ (flat)", has_images(join(src, "val"))),
                      (f"{DEVKIT} or {DEVKIT_DIR}/", devkit_in(src) is not None)],
        "folders": [("train/", isdir(join(src, "train"))), ("val/<class>/", has_folders(join(src, "val")))],
    }


def find(src, workers=1, progress=None):
    """The Found of the first complete layout in SRC; an InputError saying what is missing when none is."""
    if not os.path.isdir(src):
        raise InputError(f"{src}: no such directory")
    needs = requirements(src)
    for layout, need in needs.items():
        if all(present for _, present in need):
            return READERS[layout](src, workers, progress)
    started = [(sum(not present for _, present in need), layout) for layout, need in needs.items()
               if any(present for _, present in need)]
    if not started:
        raise InputError(f"{src}: no ImageNet here: expected {TRAIN_TAR}, {VAL_TAR} and {DEVKIT}; or Kaggle's "
                         f"{KAGGLE}/ and {KAGGLE_VAL}; or train/ and val/ folders")
    layout = min(started)[1]
    missing = [what for what, present in needs[layout] if not present]
    raise InputError(f"{src}: incomplete ImageNet ({layout} layout): missing {', '.join(missing)}")


# --- the devkit and the val labels ---------------------------------------------------------------------

def devkit(path):
    """({ILSVRC2012_ID: WNID} of the leaf classes, {WNID: num_train_images}, [ground-truth ID per val image],
    ground-truth file name) of the devkit's .tar.gz or folder."""
    if os.path.isdir(path):
        files = {name: read_bytes(os.path.join(path, name)) for name in (META, GROUND_TRUTH)}
    else:
        files = tars.small_files(path, (META, GROUND_TRUTH))
    meta = f"{path}/{META}"
    try:
        synsets = scipy.io.loadmat(io.BytesIO(files[META]), squeeze_me=True)["synsets"]
        leaves = synsets[synsets["num_children"] == 0]
        ids = {int(i): str(w) for i, w in zip(leaves["ILSVRC2012_ID"], leaves["WNID"])}
        counts = {str(w): int(n) for w, n in zip(leaves["WNID"], leaves["num_train_images"])}
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise InputError(f"{meta}: not the devkit's meta.mat (a struct array `synsets` with ILSVRC2012_ID, WNID, "
                         f"num_children, num_train_images): {err}") from None
    truth_name = f"{path}/{GROUND_TRUTH}"
    truth = []
    for number, line in enumerate(files[GROUND_TRUTH].decode("ascii", "replace").splitlines(), 1):
        text = line.strip()
        if not text.isdigit() or int(text) not in ids:
            raise InputError(f"{truth_name}:{number}: {text[:40]!r} is not the ILSVRC2012_ID of a class of meta.mat")
        truth.append(int(text))
    return ids, counts, truth, truth_name


def label_by_truth(names, ids, truth, truth_name, val_name):
    """{val file name: WNID}: the sorted names paired with the ground truth's lines."""
    if len(names) != len(truth):
        raise InputError(f"{truth_name}: {len(truth)} lines, but {val_name} holds {len(names)} images")
    return {name: ids[i] for name, i in zip(sorted(names), truth)}


def label_by_kaggle_csv(path):
    """{val file name: WNID} of LOC_val_solution.csv: ImageId, then a PredictionString whose first token is
    the WNID."""
    labels = {}
    try:
        with open(regular_input(path), newline="", encoding="utf-8-sig") as f:  # Excel and others write a byte-order mark
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise InputError(f"{path}: cannot read as CSV ({err})") from None
    if not rows or rows[0][:2] != ["ImageId", "PredictionString"]:
        got = ",".join(rows[0]) if rows else ""
        raise InputError(f"{path}: expected the header 'ImageId,PredictionString', got {got!r}")
    for number, row in enumerate(rows[1:], 2):
        if len(row) != 2 or not row[0] or not row[1].split():
            raise InputError(f"{path}:{number}: expected 'ImageId,WNID ...', got {','.join(row)[:80]!r}")
        labels[row[0] + ".JPEG"] = row[1].split()[0]
    return labels


def kaggle_classes(src):
    """The number of classes of LOC_synset_mapping.txt ('WNID words' per line), if it is there."""
    path = os.path.join(src, KAGGLE_SYNSETS)
    if not os.path.isfile(path):
        return None
    return len([line for line in read_bytes(path).decode("utf-8", "replace").splitlines() if line.strip()])


# --- the layouts ---------------------------------------------------------------------------------------

def folder_entries(root):
    """Entries of root's class folders (train/<WNID>/...), and {WNID: folder}."""
    entries, where = [], {}
    for wnid in list_classes(root):
        where[wnid] = os.path.join(root, wnid)
        entries += [Entry(wnid, f.name, f.path, None, size_of(f)) for f in image_files(where[wnid])]
    return entries, where


def flat_entries(folder, files, labels, label_source):
    """Entries of the image files of a flat val folder, each labelled by labels[file name]."""
    entries = []
    for f in files:
        if f.name not in labels:
            raise InputError(f"{f.path}: not listed in {label_source}")
        entries.append(Entry(labels[f.name], f.name, f.path, None, size_of(f)))
    if len(entries) != len(labels):
        raise InputError(f"{label_source}: lists {len(labels)} val images, but {folder} holds {len(entries)}")
    return entries


def read_archives(src, workers, progress):
    """The three archives, read in place; the class tars' headers are read by up to `workers` processes."""
    train_path, val_path = os.path.join(src, TRAIN_TAR), os.path.join(src, VAL_TAR)
    ids, counts, truth, truth_name = devkit(os.path.join(src, DEVKIT))
    fd, size = tars.open_archive(val_path)
    try:
        val = tars.members(fd, 0, size, val_path)
    finally:
        os.close(fd)
    labels = label_by_truth([m.name for m in val], ids, truth, truth_name, val_path)
    val = [Entry(labels[m.name], m.name, val_path, m.offset, m.size) for m in val]
    fd, size = tars.open_archive(train_path)
    try:
        classes = tars.members(fd, 0, size, train_path)
    finally:
        os.close(fd)
    where = {os.path.splitext(outer.name)[0]: f"{train_path}: member {outer.name}" for outer in classes}
    for outer in classes:
        if not outer.name.endswith(".tar") or "/" in outer.name:
            raise InputError(f"{train_path}: member {outer.name}: expected a class tar <WNID>.tar")
    train = []
    with progress_bar(len(classes), "index train", progress, unit="tar") as bar, \
            worker_map(partial(tars.class_members, train_path), workers) as mapped:
        for outer, inner in zip(classes, mapped(classes)):
            wnid = os.path.splitext(outer.name)[0]
            train += [Entry(wnid, m.name, train_path, m.offset, m.size) for m in inner]
            bar.update()
    return Found(f"{src}: the official archives {TRAIN_TAR}, {VAL_TAR} and {DEVKIT}, read in place",
                 train, val, len(ids), counts, where)


def read_kaggle(src, workers, progress):
    root = os.path.join(src, KAGGLE)
    train, where = folder_entries(os.path.join(root, "train"))
    val_dir = os.path.join(root, "val")
    val = flat_entries(val_dir, image_files(val_dir), label_by_kaggle_csv(os.path.join(src, KAGGLE_VAL)),
                       os.path.join(src, KAGGLE_VAL))
    return Found(f"{src}: Kaggle's layout ({KAGGLE}/train/<WNID>/, flat {KAGGLE}/val/, {KAGGLE_VAL})",
                 train, val, kaggle_classes(src), None, where)


def read_extracted(src, workers, progress):
    kit = devkit_in(src)
    ids, counts, truth, truth_name = devkit(kit)
    train, where = folder_entries(os.path.join(src, "train"))
    val_dir = os.path.join(src, "val")
    files = image_files(val_dir)
    val = flat_entries(val_dir, files, label_by_truth([f.name for f in files], ids, truth, truth_name, val_dir),
                       truth_name)
    return Found(f"{src}: extracted archives (train/<WNID>/, flat val/, {os.path.basename(kit)})",
                 train, val, len(ids), counts, where)


def read_folders(src, workers, progress):
    kit = devkit_in(src)
    ids, counts = devkit(kit)[:2] if kit else ({}, None)
    train, where = folder_entries(os.path.join(src, "train"))
    val = folder_entries(os.path.join(src, "val"))[0]
    return Found(f"{src}: class folders train/<class>/ and val/<class>/", train, val, len(ids) or None, counts,
                 where)


@contextmanager
def worker_map(fn, workers):
    """map(fn, ...) in order on up to `workers` processes, one per core at most: tarfile parses each header in
    Python (about 30 us; 40 s for ImageNet's 1.28 million on one core), which threads would do one at a time.
    The processes are forked: spawned ones would import the caller's main script again (and mxnet), and MXNet
    stops its engine's threads around a fork. They leave Ctrl-C to this process."""
    processes = min(workers, os.cpu_count() or 1)
    if processes <= 1:
        yield lambda items: map(fn, items)
        return
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"),
                             initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
        yield lambda items: pool.map(fn, items, chunksize=4)


READERS = {"archives": read_archives, "kaggle": read_kaggle, "extracted": read_extracted, "folders": read_folders}
