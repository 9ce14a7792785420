"""Shared real data for the tests: small JPEG class folders cut from Fashion-MNIST, and their packed .rec."""
import os

import numpy as np
import pytest
from PIL import Image

from rn50_mx import prep_rec

CLASSES = ("ankle_boot", "bag", "coat")  # sorted, so labels are 0, 1, 2
PER_CLASS = 7


def write_jpeg_tree(root, classes=CLASSES, per_class=PER_CLASS, seed=0):
    """Class folders of real photographs (Fashion-MNIST, upscaled to varied sizes) saved as JPEG."""
    images, _ = prep_rec.load_fashion_mnist("train")
    rng = np.random.RandomState(seed)
    for c, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            grey = images[c * per_class + i]
            w, h = int(rng.randint(40, 97)), int(rng.randint(40, 97))
            rgb = Image.fromarray(grey).convert("RGB").resize((w, h), Image.BILINEAR)
            rgb.save(os.path.join(root, name, f"img{i:03d}.jpg"), quality=90)
    return str(root)


@pytest.fixture(scope="session")
def jpeg_tree(tmp_path_factory):
    """A tree of 3 classes x 7 JPEGs; tests must not modify it (copy it first)."""
    return write_jpeg_tree(tmp_path_factory.mktemp("jpegs"))


@pytest.fixture(scope="session")
def small_rec(jpeg_tree, tmp_path_factory):
    """`jpeg_tree` packed without shuffling: PREFIX.rec/.idx/.lst with 21 records, labels 0..2."""
    prefix = str(tmp_path_factory.mktemp("rec") / "small")
    prep_rec.pack(jpeg_tree, prefix, shuffle=False)
    return prefix
