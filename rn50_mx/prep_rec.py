"""Pack image class folders into the MXNet RecordIO files the reference trains from (spec §6).

    python -m rn50_mx.prep_rec pack SRC_DIR OUT_PREFIX     class folders -> OUT_PREFIX.{lst,rec,idx}
    python -m rn50_mx.prep_rec imagenet RAW_DIR OUT_DIR    RAW_DIR/{train,val} -> OUT_DIR/{train,val}.{lst,rec,idx}
    python -m rn50_mx.prep_rec fashion-mnist OUT_DIR       the embedded default dataset, packed like ImageNet
    python -m rn50_mx.prep_rec verify PREFIX               checks PREFIX.idx/.rec record by record

The files are those of `im2rec.py --list --recursive` followed by `im2rec.py --pass-through`:
  PREFIX.lst  one line per record, in record order: `index<TAB>label<TAB>class/file.jpg` (label printed as %f)
  PREFIX.rec  RecordIO written by mxnet.recordio; record = IRHeader(flag=0, label, id=index, id2=0) followed by
              the original file bytes, unchanged (no decode, resize or re-encode)
  PREFIX.idx  `index<TAB>byte offset` of each record in the .rec
Labels: one class per sub-folder of SRC_DIR; the folders in sorted order get 0..K-1, the order in which im2rec's
sorted os.walk first sees them (only the files directly inside a class folder are packed). `index` numbers the
images in sorted folder/file order; the records follow that list shuffled as im2rec does (random.seed(100)).
The three files are written under `.tmp` names and renamed at the end (the .idx last), so an interrupted run
never leaves a .rec/.idx pair that looks complete.
"""
import argparse
import ctypes
import gzip
import io
import json
import os
import random
import signal
import struct
import sys
import tempfile
import time
from collections import deque, namedtuple
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from itertools import islice

import mxnet as mx
from mxnet.base import _LIB, MXNetError, check_call
import numpy as np
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from .errors import InputError, run_cli

PROG = "prep_rec"
IMAGE_EXTS = (".jpeg", ".jpg", ".png")
IMAGE_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG SOI marker, PNG signature
RECORD_MAGIC = 0xCED7230A
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# Fashion-MNIST's classes in its label order; the digit prefix makes sorted folder order = label order.
FASHION_MNIST_CLASSES = ("0_t-shirt_top", "1_trouser", "2_pullover", "3_dress", "4_coat",
                         "5_sandal", "6_shirt", "7_sneaker", "8_bag", "9_ankle_boot")

Item = namedtuple("Item", "index label path")  # one .lst line; path is relative to the source folder


@dataclass(frozen=True)
class Summary:
    """What pack or verify saw in PREFIX.rec. problems: for pack, the line of each bad file left out with
    skip_bad; for verify, (index, byte offset, problem) of each bad record."""
    prefix: str
    images: int
    classes: int
    bytes: int
    seconds: float
    problems: tuple = ()

    def line(self, note):
        return (f"{self.prefix}.rec: {self.images} images, {self.classes} classes, {self.bytes} bytes in "
                f"{self.seconds:.1f} s ({self.images / max(self.seconds, 1e-9):.0f} images/s){note}")


# --- Fashion-MNIST -------------------------------------------------------------------------------------

def load_fashion_mnist(split, root=FASHION_MNIST_DIR):
    """Fashion-MNIST `split` ("train" or "test") as (uint8 images [N,28,28], int64 labels [N])."""
    stem = {"train": "train", "test": "t10k"}[split]
    images = read_idx_gz(os.path.join(root, f"{stem}-images-idx3-ubyte.gz"), ndim=3)
    labels = read_idx_gz(os.path.join(root, f"{stem}-labels-idx1-ubyte.gz"), ndim=1)
    if len(images) != len(labels):
        raise InputError(f"{root}: {split} split has {len(images)} images but {len(labels)} labels")
    return images, labels.astype(np.int64)


def read_idx_gz(path, ndim):
    """The uint8 array of a gzipped IDX file (big-endian magic 0x0800+ndim, then one uint32 per dimension)."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise InputError(f"{path}: not found (apt-get install dataset-fashion-mnist)") from None
    except (OSError, EOFError) as err:
        raise InputError(f"{path}: cannot read ({err})") from None
    head = 4 + 4 * ndim
    if len(data) < head or struct.unpack(">I", data[:4])[0] != 0x800 + ndim:
        raise InputError(f"{path}: not a uint8 IDX file with {ndim} dimensions")
    shape = struct.unpack(f">{ndim}I", data[4:head])
    if len(data) - head != int(np.prod(shape)):
        raise InputError(f"{path}: header says {shape} but the file holds {len(data) - head} values")
    return np.frombuffer(data, np.uint8, offset=head).reshape(shape)


def write_fashion_mnist_jpegs(split, dest, size, per_class, root=FASHION_MNIST_DIR):
    """The first `per_class` images (0 = all) of each class of `split` as RGB JPEGs of size x size in class folders."""
    images, labels = load_fashion_mnist(split, root)
    for label, name in enumerate(FASHION_MNIST_CLASSES):
        folder = os.path.join(dest, name)
        os.makedirs(folder)
        picks = np.flatnonzero(labels == label)
        for i in picks[:per_class or len(picks)]:
            rgb = Image.fromarray(images[i]).convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
            rgb.save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def make_fashion_mnist(out_dir, *, size=64, train_per_class=1000, val_per_class=200, workers=2,
                       progress=None, root=FASHION_MNIST_DIR):
    """The embedded default dataset: Fashion-MNIST train -> OUT_DIR/train.*, test -> OUT_DIR/val.*.

    Same arguments give the same bytes. Returns None without doing anything when OUT_DIR already holds the
    complete output of the same arguments (recorded in OUT_DIR/fashion-mnist.json, written last).
    """
    stamp = os.path.join(out_dir, "fashion-mnist.json")
    request = dict(size=size, train_per_class=train_per_class, val_per_class=val_per_class)
    if is_complete(stamp, request):
        return None
    if os.path.exists(stamp):  # the outputs are about to change
        os.remove(stamp)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".jpegs-") as raw:
        write_fashion_mnist_jpegs("train", os.path.join(raw, "train"), size, train_per_class, root)
        write_fashion_mnist_jpegs("test", os.path.join(raw, "val"), size, val_per_class, root)
        summaries = pack_imagenet(raw, out_dir, workers=workers, progress=progress)
    files = {name: os.path.getsize(os.path.join(out_dir, name))
             for name in sorted(os.listdir(out_dir)) if name.startswith(("train.", "val."))}
    write_atomically(stamp, json.dumps(dict(request=request, files=files), indent=1))
    return summaries


def is_complete(stamp, request):
    """True when `stamp` records `request` and every file it lists is there with its recorded size."""
    try:
        with open(stamp) as f:
            done = json.load(f)
        out_dir = os.path.dirname(stamp)
        return done["request"] == request and all(
            os.path.getsize(os.path.join(out_dir, name)) == size for name, size in done["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_atomically(path, text):
    """Write under a temporary name, then rename: a reader sees the old file or the whole new one."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# --- listing --------------------------------------------------------------------------------------------

def list_classes(src_dir):
    """The class folders of src_dir in sorted order, which is their label order."""
    if not os.path.isdir(src_dir):
        raise InputError(f"{src_dir}: no such directory")
    names = sorted(entry.name for entry in os.scandir(src_dir) if entry.is_dir())
    if not names:
        raise InputError(f"{src_dir}: no class folders (expected one sub-folder of images per class)")
    return names


def list_images(src_dir, classes=None):
    """An Item per image of src_dir's class folders, in sorted folder/file order (im2rec --list --recursive).

    classes: {folder name: label} to use instead of the sorted position (a val split takes train's map).
    """
    names = list_classes(src_dir)
    if classes is None:
        classes = {name: label for label, name in enumerate(names)}
    items = []
    for name in names:
        folder = os.path.join(src_dir, name)
        if name not in classes:
            raise InputError(f"{folder}: class folder is not one of the {len(classes)} classes of the label map")
        files = sorted(f for f in os.listdir(folder)
                       if os.path.splitext(f)[1].lower() in IMAGE_EXTS and os.path.isfile(os.path.join(folder, f)))
        if not files:
            raise InputError(f"{folder}: class folder has no images ({'/'.join(IMAGE_EXTS)})")
        items += [Item(len(items) + i, classes[name], f"{name}/{f}") for i, f in enumerate(files)]
    return items


def text_lines(path):
    """The lines of a text file, or an InputError naming it."""
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None


def read_lst(path):
    """The Items of an im2rec .lst file (`index<TAB>label<TAB>relative path` per line), in file order."""
    items, seen = [], set()
    for number, line in enumerate(text_lines(path), 1):
        fields = line.strip().split("\t")
        if fields == [""]:
            continue
        try:
            index, label, rel = int(fields[0]), float(fields[1]), fields[2].strip()
            if len(fields) != 3 or label < 0 or label != int(label) or not rel:
                raise ValueError
        except (ValueError, IndexError):
            raise InputError(f"{path}:{number}: expected 'index<TAB>whole label<TAB>path', got {line[:80]!r}") from None
        if index in seen:
            raise InputError(f"{path}:{number}: index {index} appears twice")
        seen.add(index)
        items.append(Item(index, int(label), rel))
    if not items:
        raise InputError(f"{path}: no entries")
    return items


def write_lst(path, items):
    with open(path, "w") as f:
        f.writelines(f"{item.index}\t{item.label:f}\t{item.path}\n" for item in items)


def classes_from_lst(path):
    """{class folder: label} of an existing .lst, so that another split gets the same labels."""
    classes = {}
    for item in read_lst(path):
        name = item.path.split("/")[0]
        if classes.setdefault(name, item.label) != item.label:
            raise InputError(f"{path}: class folder {name} has two labels ({classes[name]} and {item.label})")
    return classes


# --- packing --------------------------------------------------------------------------------------------

def read_record(root, item):
    """The record of one image: its IRHeader + the file's bytes, unchanged. Only the signature is checked
    (a full decode would cost more than the copy); `verify` decodes every image."""
    path = os.path.join(root, item.path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    if not data.startswith(IMAGE_SIGNATURES):
        raise InputError(f"{path}: not a JPEG or PNG image ({len(data)} bytes)")
    return mx.recordio.pack(mx.recordio.IRHeader(0, item.label, item.index, 0), data)


def try_read_record(root, item):
    """(record, None), or (None, problem line) for a bad file, so that skip_bad can go on past it."""
    try:
        return read_record(root, item), None
    except InputError as err:
        return None, str(err)


def ordered_map(fn, items, workers, chunk=16):
    """fn over items on `workers` threads, yielding the results in input order with a bounded read-ahead.

    Threads rather than processes: file reads and the ctypes record writes release the GIL, while a process
    pool would copy every image through a pipe (4-7x slower here). Each task is `chunk` items, so the threads
    hand over work once per chunk rather than once per image.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    items = iter(items)
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        try:
            for part in iter(lambda: list(islice(items, chunk)), []):
                pending.append(pool.submit(list, map(fn, part)))
                if len(pending) >= 4 * workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def progress_bar(iterable, total, desc, progress):
    """tqdm to stderr with images/s; progress None = only when stderr is a terminal."""
    return tqdm(iterable, total=total, desc=desc, unit="img", file=sys.stderr,
                disable=None if progress is None else not progress)


def pack(src_dir, out_prefix, *, shuffle=True, seed=100, workers=1, list_file=None, classes=None,
         skip_bad=False, progress=None):
    """Pack the images of src_dir's class folders into OUT_PREFIX.{lst,rec,idx} (layout: module docstring).

    list_file: pack the Items of an existing im2rec .lst in its order (paths relative to src_dir) instead of
    listing the folders; shuffle, seed and classes then do not apply.
    classes: {folder: label} instead of the sorted folder order (a val split takes train's).
    skip_bad: leave out unreadable or non-image files (counted in the summary) instead of stopping.
    """
    start = time.time()
    if os.path.isdir(out_prefix) or out_prefix.endswith(os.sep):
        raise InputError(f"{out_prefix}: is a directory; give a file prefix such as "
                         f"{os.path.join(out_prefix, 'train')}")
    if list_file:
        items = read_lst(list_file)
        if not os.path.isdir(src_dir):
            raise InputError(f"{src_dir}: no such directory")
    else:
        items = list_images(src_dir, classes)
        if shuffle:
            random.Random(seed).shuffle(items)  # the same permutation as im2rec's random.seed(100); shuffle()
    final = {ext: f"{out_prefix}.{ext}" for ext in ("rec", "idx", "lst")}
    tmp = {ext: path + ".tmp" for ext, path in final.items()}
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    packed, skipped = [], []
    records = mx.recordio.MXIndexedRecordIO(tmp["idx"], tmp["rec"], "w")
    try:
        results = ordered_map(partial(try_read_record, src_dir), items, workers)
        with closing(results), progress_bar(results, len(items), f"pack {os.path.basename(out_prefix)}",
                                            progress) as bar:
            for (record, problem), item in zip(bar, items):  # bar first, so it counts the last image
                if problem and not skip_bad:
                    raise InputError(problem)
                if problem:
                    skipped.append(problem)
                    continue
                records.write_idx(item.index, record)
                packed.append(item)
        records.close()
        if not packed:
            raise InputError(f"{src_dir}: none of the {len(items)} listed images could be packed")
        write_lst(tmp["lst"], packed)
        publish(tmp, final)
    finally:
        records.close()
        for path in tmp.values():
            if os.path.exists(path):
                os.remove(path)
    return Summary(out_prefix, len(packed), len({item.label for item in packed}),
                   os.path.getsize(final["rec"]), time.time() - start, tuple(skipped))


def publish(tmp, final):
    """Rename the finished temporaries to their final names; the old .idx goes first and the new one comes
    last, so that an old .idx never pairs with a new .rec."""
    if os.path.exists(final["idx"]):
        os.remove(final["idx"])
    for ext in ("rec", "lst", "idx"):
        os.replace(tmp[ext], final[ext])


def pack_imagenet(raw_dir, out_dir, **options):
    """RAW_DIR/train and RAW_DIR/val (class folders) -> OUT_DIR/{train,val}.*, val labelled by train's folders.

    Val is packed first: it is the small one, and a val class unknown to train then fails at once.
    """
    classes = {name: label for label, name in enumerate(list_classes(os.path.join(raw_dir, "train")))}
    val = pack(os.path.join(raw_dir, "val"), os.path.join(out_dir, "val"), classes=classes, **options)
    train = pack(os.path.join(raw_dir, "train"), os.path.join(out_dir, "train"), **options)
    return train, val


# --- verifying ------------------------------------------------------------------------------------------

def read_idx(path):
    """[(key, offset)] of an .idx file, and [(key or line, offset, problem)] for the lines that are not sound."""
    entries, bad, keys, offsets = [], [], set(), set()
    for number, line in enumerate(text_lines(path), 1):
        try:
            key, offset = map(int, line.split("\t"))
        except ValueError:
            bad.append((f"line {number}", None, f".idx line is not 'key<TAB>offset': {line[:80]!r}"))
            continue
        if key in keys or offset in offsets:
            bad.append((key, offset, "the .idx lists this key or offset twice"))
            continue
        keys.add(key)
        offsets.add(offset)
        entries.append((key, offset))
    return entries, bad


def records_at(rec_path, entries):
    """(record end, payload, problem) for each (key, offset) in turn. mxnet's own reader reads the record, so
    that a record the writer split in parts (where the payload holds the magic word) reads whole; the bounds
    and the magic are checked first, for a clear message, and because a read at the very end of the file would
    leave the reader at end-of-stream for good."""
    size = os.path.getsize(rec_path)
    reader = mx.recordio.MXRecordIO(rec_path, "r")
    end = ctypes.c_size_t()
    try:
        with open(rec_path, "rb") as raw:
            for _, offset in entries:
                if offset % 4 or not 0 <= offset <= size - 8:
                    yield None, None, "offset is outside the .rec or not 4-byte aligned"
                    continue
                raw.seek(offset)
                magic = struct.unpack("<I", raw.read(4))[0]
                if magic != RECORD_MAGIC:
                    yield None, None, f"no record starts here (found 0x{magic:08x}, not the RecordIO magic)"
                    continue
                try:  # the C API has the reader's Seek and Tell; recordio.py does not wrap Tell
                    check_call(_LIB.MXRecordIOReaderSeek(reader.handle, ctypes.c_size_t(offset)))
                    payload = reader.read()
                    check_call(_LIB.MXRecordIOReaderTell(reader.handle, ctypes.byref(end)))
                except MXNetError as err:
                    yield None, None, f"mxnet cannot read the record ({str(err).splitlines()[-1].split(': ')[-1]})"
                    continue
                yield end.value, payload, None
    finally:
        reader.close()


def check_payload(num_classes, record):
    """(record end, label, problem) of one records_at result: one label below num_classes, and an image
    that decodes."""
    end, payload, problem = record
    if problem:
        return end, None, problem
    try:
        header, image = mx.recordio.unpack(payload)
    except (struct.error, ValueError):
        return end, None, f"record of {len(payload)} bytes is too short for its header"
    if header.flag != 0:
        return end, None, f"header flag {header.flag}: expected one label (0)"
    label = header.label
    if label != int(label) or not 0 <= label < (num_classes or float("inf")):
        return end, None, f"label {label:g} is not a class number{f' below {num_classes}' if num_classes else ''}"
    problem = decode_problem(image)
    return end, None if problem else int(label), problem


def decode_problem(data):
    """Why the image bytes do not decode, or None. JPEGs decode at 1/8 scale (draft): every byte of the
    entropy-coded data is still read, so truncation and corruption are still caught, at a fraction of the cost."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (img.width // 8, img.height // 8))
            img.load()
    except UnidentifiedImageError:
        return f"the {len(data)} image bytes are not an image"
    except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError... for corrupt data
        return f"image does not decode ({err})"
    return None


def verify(prefix, *, num_classes=None, workers=1, progress=None):
    """Check PREFIX.idx/.rec: every offset starts a record that mxnet reads, with one label in range and an
    image that decodes, and the records of the .idx cover the whole .rec."""
    start = time.time()
    rec_path = prefix + ".rec"
    entries, bad = read_idx(prefix + ".idx")
    if not os.path.isfile(rec_path):
        raise InputError(f"{rec_path}: no such file")
    labels, spans = set(), []
    results = ordered_map(partial(check_payload, num_classes), records_at(rec_path, entries), workers)
    with closing(results), progress_bar(results, len(entries), f"verify {os.path.basename(prefix)}",
                                        progress) as bar:
        for (end, label, problem), (key, offset) in zip(bar, entries):
            if end is not None:
                spans.append((offset, end))
            if problem:
                bad.append((key, offset, problem))
            else:
                labels.add(label)
    size = os.path.getsize(rec_path)
    gap = first_gap(sorted(spans), size)
    if gap is not None:
        bad.append(("-", gap, "the .rec has bytes here that no record of the .idx covers"))
    if not entries:
        bad.append(("-", None, "the .idx lists no records"))
    return Summary(prefix, len(entries), len(labels), size, time.time() - start, tuple(bad))


def first_gap(spans, size):
    """The first byte offset not covered by the sorted (start, end) spans, or None if they tile [0, size)."""
    end = 0
    for start, stop in spans:
        if start != end:
            return end
        end = stop
    return None if end == size else end


# --- command line ---------------------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rn50_mx.prep_rec",
                                     description="Pack class folders of images into MXNet .rec/.idx files.")
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workers", type=positive, default=2, help="threads reading the files (default 2)")
    common.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                        help="no progress bar (there is none anyway when stderr is not a terminal)")
    packing = argparse.ArgumentParser(add_help=False, parents=[common])
    packing.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                         help="keep the sorted order (default: shuffled like im2rec, seed 100)")
    packing.add_argument("--skip-bad", action="store_true",
                         help="leave out unreadable or non-image files and count them instead of stopping")

    cmd = commands.add_parser("pack", parents=[packing], help="SRC_DIR's class folders -> OUT_PREFIX.{lst,rec,idx}")
    cmd.add_argument("src_dir")
    cmd.add_argument("out_prefix")
    source = cmd.add_mutually_exclusive_group()
    source.add_argument("--list", dest="list_file", metavar="FILE.lst",
                        help="pack the images of this im2rec .lst, in its order, instead of listing SRC_DIR")
    source.add_argument("--classes-from", metavar="OTHER.lst",
                        help="take the folder -> label map from another split's .lst")

    cmd = commands.add_parser("imagenet", parents=[packing],
                              help="RAW_DIR/{train,val} -> OUT_DIR/{train,val}.{lst,rec,idx}")
    cmd.add_argument("raw_dir")
    cmd.add_argument("out_dir")

    cmd = commands.add_parser("fashion-mnist", parents=[common],
                              help="the embedded default dataset -> OUT_DIR/{train,val}.{lst,rec,idx}")
    cmd.add_argument("out_dir")
    cmd.add_argument("--size", type=positive, default=64, help="image side in pixels (default 64)")
    cmd.add_argument("--train-per-class", type=natural, default=1000, help="train images per class; 0 = all 6000")
    cmd.add_argument("--val-per-class", type=natural, default=200, help="val images per class; 0 = all 1000")

    cmd = commands.add_parser("verify", parents=[common], help="check PREFIX.idx/.rec and decode every image")
    cmd.add_argument("prefix", help="PREFIX of PREFIX.rec and PREFIX.idx")
    cmd.add_argument("--num-classes", type=positive, help="labels must be below this")
    return parser.parse_args(argv)


def positive(text):
    return whole(text, 1)


def natural(text):
    return whole(text, 0)


def whole(text, low):
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
    return value


def run(args):
    """Run one parsed command; the exit code is 1 when verify finds a bad record."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` cleans up like Ctrl-C
    options = dict(workers=args.workers, progress=args.progress)
    if args.command == "verify":
        summary = verify(args.prefix, num_classes=args.num_classes, **options)
        for index, offset, problem in summary.problems:
            print(f"{args.prefix}.rec: record {index} at offset {'?' if offset is None else offset}: {problem}")
        print(summary.line(f", {len(summary.problems)} BAD" if summary.problems else ", all good"))
        return 1 if summary.problems else 0
    if args.command == "fashion-mnist":
        summaries = make_fashion_mnist(args.out_dir, size=args.size, train_per_class=args.train_per_class,
                                       val_per_class=args.val_per_class, **options)
        if summaries is None:
            print(f"{args.out_dir}: already complete for these arguments; nothing to do")
            return 0
    else:
        options.update(shuffle=args.shuffle, skip_bad=args.skip_bad)
        if args.command == "imagenet":
            summaries = pack_imagenet(args.raw_dir, args.out_dir, **options)
        else:
            classes = classes_from_lst(args.classes_from) if args.classes_from else None
            summaries = [pack(args.src_dir, args.out_prefix, list_file=args.list_file, classes=classes, **options)]
    for summary in summaries:
        for problem in summary.problems:
            print(f"{PROG}: skipped {problem}", file=sys.stderr)
        print(summary.line(f", {len(summary.problems)} bad files skipped" if summary.problems else ""))
    return 0


def main(argv=None):
    """Command-line entry point (python -m rn50_mx.prep_rec, or rn50-prep-rec)."""
    run_cli(lambda: run(parse_args(argv)), PROG)


if __name__ == "__main__":
    main()
