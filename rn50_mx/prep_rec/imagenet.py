"""`imagenet SRC OUT_DIR`: ImageNet (ILSVRC2012) as downloaded -> OUT_DIR/{train,val}.{lst,rec,idx}, checked.

SRC may hold any layout of layouts.py; nothing is extracted. Labels are the sorted-WNID index (n01440764 = 0),
as im2rec, torchvision and the MLPerf reference use. The records follow the order `pack` gives the extracted
tree (val sorted into WNID folders) with the same seed, so the archives and their extracted tree give the same
.lst and the same records. ImageNet's odd files, a PNG named .JPEG and CMYK JPEGs (told by their bytes), are
re-encoded as RGB JPEG at quality 100 as the MLPerf reference's preprocessing does, unless keep_odd_bytes; every
other file's bytes are kept.
"""
import contextlib
import dataclasses
import hashlib
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ..errors import InputError
from ..files import os_error, owned, read_bytes, refuse_existing, regular_input
from ..mlperf_rules import IMAGENET_CLASSES
from . import layouts, tars
from .folders import IM2REC_SEED, shuffled
from .images import as_rgb_jpeg, checked, odd_kind
from .records import Item, progress_bar, write_records

# The official archives' checksums (image-net.org; torchvision's datasets/imagenet.py lists the same).
MD5 = {layouts.TRAIN_TAR: "1d675b47d978889d74fa0da5fadfb00e", layouts.VAL_TAR: "29b22e2961454d5413ddabcf34fc5622",
       layouts.DEVKIT: "fa75699e90414af021442c21a62c3abf"}


def check(found, src, expected_classes):
    """The counts and classes agree with the devkit (or `expected_classes`), before anything is written."""
    counts = Counter(entry.wnid for entry in found.train)
    classes = found.classes or expected_classes
    if len(counts) != classes:
        raise InputError(f"{src}: train has {len(counts)} classes, expected {classes}"
                         f"{'' if found.classes else ' (--classes)'}")
    if found.train_counts is not None:
        for wnid in sorted(set(found.where) | set(counts)):
            if wnid not in found.train_counts:
                raise InputError(f"{found.where[wnid]}: unknown WNID {wnid} (not a class of meta.mat)")
            if counts[wnid] != found.train_counts[wnid]:
                raise InputError(f"{found.where[wnid]}: {counts[wnid]} images, but meta.mat says "
                                 f"{found.train_counts[wnid]}")
    for entry in found.val:
        if entry.wnid not in counts:
            raise InputError(f"{entry.path}: val image {entry.name} is of class {entry.wnid}, which train does "
                             f"not have")


def check_md5(src, progress):
    """Each official archive's MD5, read in parallel: an InputError naming the first that differs."""
    paths = [regular_input(os.path.join(src, name)) for name in MD5]
    with progress_bar(sum(map(os.path.getsize, paths)), "md5", progress, unit="B") as bar:
        lock = threading.Lock()

        def md5(path):
            digest = hashlib.md5()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    digest.update(block)
                    with lock:
                        bar.update(len(block))
            return digest.hexdigest()

        with ThreadPoolExecutor(len(paths)) as pool:
            for path, got in zip(paths, pool.map(md5, paths)):
                want = MD5[os.path.basename(path)]
                if got != want:
                    raise InputError(f"{path}: MD5 {got}, not the official {want}")


class Reader:
    """fetch(item) for write_records: one image's bytes from its file or archive, odd files re-encoded (and
    noted) unless keep_odd_bytes. Archives stay open for the whole run; os.pread lets threads share them."""

    def __init__(self, entries, keep_odd_bytes):
        self.entries, self.keep_odd_bytes, self.noted = entries, keep_odd_bytes, []
        self.fds = {path: tars.open_archive(path)[0] for path in {e.path for e in entries if e.offset is not None}}

    def name(self, entry):
        return f"{entry.path}: member {entry.wnid}/{entry.name}" if entry.offset is not None else entry.path

    def __call__(self, item):
        entry = self.entries[item.index]
        if entry.offset is None:
            data = read_bytes(entry.path)
        else:
            data = tars.read_member(self.fds[entry.path], entry, self.name(entry))
        data = checked(data, self.name(entry))
        kind = odd_kind(data)
        if kind and not self.keep_odd_bytes:
            data = as_rgb_jpeg(data, self.name(entry))
            self.noted.append(f"{item.path} ({kind})")
        return data

    def close(self):
        for fd in self.fds.values():
            os.close(fd)


def pack_split(entries, labels, out_prefix, *, shuffle, seed, keep_odd_bytes, **options):
    """Write one split's entries as pack would write their extracted class folders: sorted by (WNID, file name),
    numbered, labelled by `labels`, shuffled with `seed` unless not `shuffle`."""
    entries = sorted(entries, key=lambda e: (e.wnid, e.name))
    items = [Item(i, labels[e.wnid], f"{e.wnid}/{e.name}") for i, e in enumerate(entries)]
    items = shuffled(items, seed) if shuffle else items
    reader = Reader(entries, keep_odd_bytes)
    try:
        summary = write_records(items, out_prefix, reader, size=lambda item: entries[item.index].size, **options)
    finally:
        reader.close()
    return dataclasses.replace(summary, notes=tuple(sorted(reader.noted)))


def pack_imagenet(src, out_dir, *, classes=IMAGENET_CLASSES, md5=False, keep_odd_bytes=False,
                  shuffle=True, seed=IM2REC_SEED, workers=8, progress=None, skip_bad=False, on_found=print,
                  on_split=None, force=False):
    """SRC -> OUT_DIR/{val,train}.{lst,rec,idx} (val first: the small one). on_found gets the line saying which
    layout SRC holds, on_split each split's Summary when it is written. Returns the (train, val) Summaries.
    Both outputs are owned before any archive is read (with --check-md5 a 155 GB read): an unwritable OUT_DIR or a
    second writer is one line at once."""
    with owned_outputs(out_dir, force):
        if md5 and not all(os.path.isfile(os.path.join(src, name)) for name in MD5):
            raise InputError(f"{src}: --check-md5 checks the official archives {', '.join(MD5)}, which are not all here")
        if md5:
            check_md5(src, progress)
        found = layouts.find(src, workers, progress)
        on_found(found.layout)
        check(found, src, classes)
        labels = {wnid: label for label, wnid in enumerate(sorted({e.wnid for e in found.train}))}
        options = dict(shuffle=shuffle, seed=seed, keep_odd_bytes=keep_odd_bytes, workers=workers,
                       progress=progress, skip_bad=skip_bad, force=force)
        summaries = []
        for split in ("val", "train"):
            summaries.append(pack_split(getattr(found, split), labels, os.path.join(out_dir, split), **options))
            if on_split:
                on_split(summaries[-1])
        return summaries[::-1]


@contextlib.contextmanager
def owned_outputs(out_dir, force):
    """OUT_DIR/val.rec and train.rec owned (rn50_mx/files.py) for the duration, and neither replacing an existing set
    unasked: checked before any reading. An OUT_DIR made here is removed again when the packing fails with it empty."""
    made = not os.path.isdir(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise os_error(out_dir, err, "create") from None
    try:
        with contextlib.ExitStack() as outputs:
            for split in ("val", "train"):
                rec = os.path.join(out_dir, split) + ".rec"
                outputs.enter_context(owned(rec))
                refuse_existing(rec, force, "packed set")
            yield
    except BaseException:
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)
        raise
