"""Class folders -> .rec, as `im2rec.py --list --recursive` then `im2rec.py --pass-through` (README and
DeepLearningExamples' scripts/prepare_imagenet.sh).

Labels: one class per sub-folder of SRC_DIR; the folders in sorted order get 0..K-1, the order in which im2rec's
sorted os.walk first sees them (only the files directly inside a class folder are packed). `index` numbers the
images in sorted folder/file order; the records follow that list shuffled as im2rec does (random.seed(100)).
The file bytes go into the records unchanged (no decode, resize or re-encode).
"""
import os
import random

from ..errors import InputError
from ..files import read_bytes
from .images import IMAGE_EXTS, checked
from .records import Item, read_lst, write_records

IM2REC_SEED = 100


def list_classes(src_dir):
    """The class folders of src_dir in sorted order, which is their label order."""
    if not os.path.isdir(src_dir):
        raise InputError(f"{src_dir}: no such directory")
    try:
        names = sorted(entry.name for entry in os.scandir(src_dir) if is_folder(entry))
    except OSError as err:
        raise InputError(f"{src_dir}: cannot read ({err.strerror})") from None
    if not names:
        raise InputError(f"{src_dir}: no class folders (expected one sub-folder of images per class)")
    return names


def image_entries(folder):
    """The entries named like images directly inside `folder`, as os.DirEntry, in directory order. Anything but a
    folder counts: a broken link or a file that cannot be read is then named when it is read, not left out."""
    return (entry for entry in os.scandir(folder)
            if os.path.splitext(entry.name)[1].lower() in IMAGE_EXTS and not is_folder(entry))


def is_folder(entry):
    """Whether an os.DirEntry is a folder; a link that cannot be followed (a loop) is not, and is named when read."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def image_files(folder):
    """image_entries(folder) sorted by name."""
    return sorted(image_entries(folder), key=lambda entry: entry.name)


def size_of(entry):
    """The bytes of a listed file, for progress; 0 when it cannot be read (reading it will say why)."""
    try:
        return entry.stat().st_size
    except OSError:
        return 0


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
        files = image_files(folder)
        if not files:
            raise InputError(f"{folder}: class folder has no images ({'/'.join(IMAGE_EXTS)})")
        items += [Item(len(items) + i, classes[name], f"{name}/{f.name}") for i, f in enumerate(files)]
    return items


def shuffled(items, seed=IM2REC_SEED):
    """items in im2rec's record order: random.seed(seed); random.shuffle(items). The permutation depends only
    on the seed and the length, so every source of the same images gets the same order."""
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def read_file(root, item):
    """The bytes of one listed image, checked to start like an image."""
    path = os.path.join(root, item.path)
    return checked(read_bytes(path), path)


def pack(src_dir, out_prefix, *, shuffle=True, seed=IM2REC_SEED, workers=1, list_file=None, classes=None,
         skip_bad=False, progress=None, force=False):
    """Pack the images of src_dir's class folders into OUT_PREFIX.{lst,rec,idx} (records.py says what they hold).

    list_file: pack the Items of an existing im2rec .lst in its order (paths relative to src_dir) instead of
    listing the folders; shuffle, seed and classes then do not apply.
    classes: {folder: label} instead of the sorted folder order (a val split takes train's).
    skip_bad: leave out unreadable or non-image files (counted in the summary) instead of stopping.
    force: replace an existing OUT_PREFIX set (otherwise kept, with one line).
    """
    if list_file:
        items = read_lst(list_file)
        if not os.path.isdir(src_dir):
            raise InputError(f"{src_dir}: no such directory")
    else:
        items = list_images(src_dir, classes)
        if shuffle:
            items = shuffled(items, seed)
    return write_records(items, out_prefix, lambda item: read_file(src_dir, item), workers=workers,
                         skip_bad=skip_bad, progress=progress, force=force)


def pack_train_val(raw_dir, out_dir, **options):
    """RAW_DIR/train and RAW_DIR/val (class folders) -> OUT_DIR/{train,val}.*, val labelled by train's folders.

    Val is packed first: it is the small one, and a val class unknown to train then fails at once.
    """
    classes = {name: label for label, name in enumerate(list_classes(os.path.join(raw_dir, "train")))}
    val = pack(os.path.join(raw_dir, "val"), os.path.join(out_dir, "val"), classes=classes, **options)
    train = pack(os.path.join(raw_dir, "train"), os.path.join(out_dir, "train"), **options)
    return train, val
