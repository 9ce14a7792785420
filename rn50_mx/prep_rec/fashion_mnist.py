"""The embedded default dataset: Fashion-MNIST (Debian's dataset-fashion-mnist) as JPEG class folders, packed like
ImageNet."""
import gzip
import json
import os
import struct
import tempfile

import numpy as np
from PIL import Image

from ..errors import InputError
from ..files import os_error, write_atomically
from .folders import pack_train_val

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# Fashion-MNIST's classes in its label order; the digit prefix makes sorted folder order = label order.
FASHION_MNIST_CLASSES = ("0_t-shirt_top", "1_trouser", "2_pullover", "3_dress", "4_coat",
                         "5_sandal", "6_shirt", "7_sneaker", "8_bag", "9_ankle_boot")


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
    try:
        if os.path.exists(stamp):  # the outputs are about to change
            os.remove(stamp)
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".jpegs-") as raw:
            write_fashion_mnist_jpegs("train", os.path.join(raw, "train"), size, train_per_class, root)
            write_fashion_mnist_jpegs("test", os.path.join(raw, "val"), size, val_per_class, root)
            # the stamp decides whether the files there are this request's: a different request replaces them
            summaries = pack_train_val(raw, out_dir, workers=workers, progress=progress, force=True)
    except OSError as err:  # a file where the folder goes, a folder that cannot be written, a full disk
        raise os_error(out_dir, err, "write") from None
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
