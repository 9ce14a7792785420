"""Real data for the tests and benches: class folders of Fashion-MNIST photographs saved as JPEG, and their packed
train/val .rec sets."""
import os

import numpy as np
from PIL import Image

from rn50_mx import prep_rec

CLASSES = ("ankle_boot", "bag", "coat")  # sorted, so labels are 0, 1, 2
PER_CLASS = 7
TINY_CLASSES = ("ankle_boot", "bag", "coat", "dress", "pullover")  # five, so that top-5 is defined


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


def packed_train_val(root, classes=TINY_CLASSES, per_class=PER_CLASS):
    """ROOT/jpegs (classes x per_class photographs) packed as ROOT/data/train.rec/.idx (shuffled) and
    ROOT/data/val.rec/.idx (in order); returns (jpegs, data) folders."""
    jpegs = write_jpeg_tree(os.path.join(root, "jpegs"), classes=classes, per_class=per_class)
    data = os.path.join(root, "data")
    os.makedirs(data)
    prep_rec.pack(jpegs, os.path.join(data, "train"))
    prep_rec.pack(jpegs, os.path.join(data, "val"), shuffle=False)
    return jpegs, data


def one_per_class(root, count, seed):
    """`count` photographs, each its own class, packed in order as ROOT/unique.rec/.idx: a sample's label says which
    record it is. Returns the prefix."""
    write_jpeg_tree(os.path.join(root, "jpegs"), classes=tuple(f"c{i:02d}" for i in range(count)), per_class=1,
                    seed=seed)
    prefix = os.path.join(root, "unique")
    prep_rec.pack(os.path.join(root, "jpegs"), prefix, shuffle=False)
    return prefix
