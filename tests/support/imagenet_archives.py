"""A small ImageNet in each layout users download, byte for byte in the official structure, for the tests and for
bench/prep_imagenet.py (python -m bench.prep_imagenet).

  ILSVRC2012_img_train.tar       an uncompressed tar of uncompressed class tars <WNID>.tar of <WNID>_<n>.JPEG
  ILSVRC2012_img_val.tar         ILSVRC2012_val_<8 digits>.JPEG, flat, members not in name order
  ILSVRC2012_devkit_t12.tar.gz   ILSVRC2012_devkit_t12/data/meta.mat (MATLAB struct array `synsets`, the devkit's
                                 field names; leaf IDs 1..K in an order that is not the WNID order, then a parent
                                 synset) and data/ILSVRC2012_validation_ground_truth.txt
The train set holds ImageNet's odd files: a PNG named .JPEG, a CMYK JPEG, and a grayscale JPEG (kept as is).
Pictures are Fashion-MNIST photographs, or whatever `picture(i)` the caller gives.
"""
import csv
import io
import os
import random
import tarfile
from dataclasses import dataclass, field

import numpy as np
import scipy.io
from PIL import Image

from rn50_mx import prep_rec

WNIDS = ("n01440764", "n01443537", "n01484850", "n01491361", "n01494475")
TRAIN_TAR, VAL_TAR, DEVKIT = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "ILSVRC2012_devkit_t12.tar.gz"
GROUND_TRUTH = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"
META = "ILSVRC2012_devkit_t12/data/meta.mat"
ODD = {"png": "n01443537_2933.JPEG", "cmyk": "n01484850_17.JPEG", "grey": "n01491361_3.JPEG"}


def fashion_picture():
    """picture(i): Fashion-MNIST photograph i as an RGB image of a varied size."""
    images, _ = prep_rec.load_fashion_mnist("test")
    sizes = np.random.RandomState(1).randint(40, 97, (len(images), 2))

    def picture(i):
        return Image.fromarray(images[i]).convert("RGB").resize(tuple(sizes[i]), Image.BILINEAR)
    return picture


def encode(img, kind="jpeg", quality=90):
    """The file bytes of `img` as an ImageNet file would hold them."""
    out = io.BytesIO()
    if kind == "png":
        img.save(out, "PNG")
    elif kind == "cmyk":
        img.convert("CMYK").save(out, "JPEG", quality=quality)
    elif kind == "grey":
        img.convert("L").save(out, "JPEG", quality=quality)
    else:
        img.save(out, "JPEG", quality=quality)
    return out.getvalue()


@dataclass
class SmallImageNet:
    """{WNID: {file: bytes}} of train, {file: WNID} and {file: bytes} of val, and the devkit's leaf ID order."""
    train: dict = field(default_factory=dict)
    val_class: dict = field(default_factory=dict)
    val: dict = field(default_factory=dict)
    ids: tuple = ()

    @property
    def odd(self):
        """The train files that imagenet re-encodes: {"WNID/file": kind}."""
        return {f"{ODD[k][:9]}/{ODD[k]}": {"png": "PNG", "cmyk": "CMYK JPEG"}[k] for k in ("png", "cmyk")}


def make(wnids=WNIDS, per_class=6, val_images=12, picture=None, seed=0, quality=90):
    """A SmallImageNet: per_class train images per class (one class one fewer, as ImageNet's counts vary) with
    the odd files among them, and val_images val images of random classes."""
    picture = picture or fashion_picture()
    rng = random.Random(seed)
    net, n = SmallImageNet(ids=tuple(rng.sample(wnids, len(wnids)))), 0
    for c, wnid in enumerate(wnids):
        net.train[wnid] = {}
        for k in range(per_class - (c == 1)):
            name = f"{wnid}_{rng.randrange(1, 20000)}.JPEG"
            net.train[wnid][name] = encode(picture(n), quality=quality)
            n += 1
    for kind, name in ODD.items():
        net.train[name[:9]][name] = encode(picture(n), kind, quality)
        n += 1
    for i in range(1, val_images + 1):
        name = f"ILSVRC2012_val_{i:08d}.JPEG"
        net.val_class[name] = wnids[rng.randrange(len(wnids))]
        net.val[name] = encode(picture(n), quality=quality)
        n += 1
    return net


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def tar_bytes(files, mode="w"):
    """A tar (format GNU, as the official archives) of {name: bytes}, in the given order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode, format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            add(tar, name, data)
    return out.getvalue()


def meta_mat(net):
    """meta.mat's bytes: the struct array `synsets` with the devkit's fields, leaves first, then one parent."""
    fields = ("ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images")
    synsets = np.zeros((len(net.ids) + 1, 1), dtype=[(name, object) for name in fields])
    for i, wnid in enumerate(net.ids):
        synsets[i, 0] = (float(i + 1), wnid, f"class {wnid}", "a leaf", 0.0, np.zeros((1, 0)), 0.0,
                         float(len(net.train.get(wnid, {}))))
    synsets[-1, 0] = (float(len(net.ids) + 1), "n00000001", "entity", "the root", float(len(net.ids)),
                      np.arange(1, len(net.ids) + 1, dtype=float)[None], 1.0, 0.0)
    out = io.BytesIO()
    scipy.io.savemat(out, {"synsets": synsets})
    return out.getvalue()


def ground_truth(net):
    ids = {wnid: i + 1 for i, wnid in enumerate(net.ids)}
    return "".join(f"{ids[net.val_class[name]]}\n" for name in sorted(net.val)).encode()


def write_devkit(net, path, truth=None):
    files = {META: meta_mat(net), GROUND_TRUTH: ground_truth(net) if truth is None else truth}
    write(path, tar_bytes(files, mode="w:gz"))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def val_order(net):
    """The val names in a member order that is not the name order (as the official val tar's)."""
    return sorted(net.val, key=lambda name: name[::-1])


def write_archives(net, dst):
    """The three official archives of `net` in dst."""
    classes = {f"{wnid}.tar": tar_bytes(files) for wnid, files in sorted(net.train.items(), reverse=True)}
    write(os.path.join(dst, TRAIN_TAR), tar_bytes(classes))
    write(os.path.join(dst, VAL_TAR), tar_bytes({name: net.val[name] for name in val_order(net)}))
    write_devkit(net, os.path.join(dst, DEVKIT))
    return str(dst)


def write_train_folders(net, root):
    for wnid, files in net.train.items():
        for name, data in files.items():
            write(os.path.join(root, wnid, name), data)


def write_kaggle(net, dst):
    """Kaggle's layout of `net`: class folders, a flat val folder and LOC_val_solution.csv (boxes after the
    WNID, rows not in name order)."""
    write_train_folders(net, os.path.join(dst, "ILSVRC/Data/CLS-LOC/train"))
    for name, data in net.val.items():
        write(os.path.join(dst, "ILSVRC/Data/CLS-LOC/val", name), data)
    with open(os.path.join(dst, "LOC_val_solution.csv"), "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["ImageId", "PredictionString"])
        for name in val_order(net):
            wnid = net.val_class[name]
            rows.writerow([name[:-5], f"{wnid} 10 20 30 40 {wnid} 1 2 3 4"])
    return str(dst)


def write_extracted(net, dst):
    """The archives extracted as their readme says: train/<WNID>/, a flat val/, and the devkit archive."""
    write_train_folders(net, os.path.join(dst, "train"))
    for name, data in net.val.items():
        write(os.path.join(dst, "val", name), data)
    write_devkit(net, os.path.join(dst, DEVKIT))
    return str(dst)


def write_class_folders(net, dst):
    """What valprep.sh makes of the extracted archives: train/<WNID>/ and val/<WNID>/."""
    write_train_folders(net, os.path.join(dst, "train"))
    for name, data in net.val.items():
        write(os.path.join(dst, "val", net.val_class[name], name), data)
    return str(dst)
