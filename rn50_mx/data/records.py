"""The run's .rec/.idx files: their checks, the data faults named in one line, and the epoch they give."""
import contextlib
import io
import math
import os
import re

import mxnet as mx
import numpy as np
from PIL import Image, UnidentifiedImageError

from .. import prep_rec
from ..errors import InputError
from ..files import regular_input, write_atomically

# --- files ----------------------------------------------------------------------------------------------

def rec_and_idx(settings, train):
    """The (.rec, .idx) pair of a split, after checking that both are there: DALI's own errors are stack traces."""
    return readable(*data_paths(settings, train))


def data_paths(settings, train):
    """The (.rec, .idx) paths of a split, as the settings name them; no file is opened."""
    flag = "--data-train" if train else "--data-val"
    rec = settings.data_train if train else settings.data_val
    idx = (settings.data_train_idx if train else settings.data_val_idx) or settings.idx_path(rec)
    if not rec:
        raise InputError(f"{flag}: not set (give a .rec file, or --synthetic 1 for training)")
    return rec, idx


def readable(rec, idx):
    """(rec, idx) after reading a byte of each: a missing, empty or special file (files.regular_input) is one line
    naming it."""
    try:
        with open(regular_input(rec), "rb") as f:
            if not f.read(1):
                raise InputError(f"{rec}: empty file")
    except OSError as err:
        raise InputError(f"{rec}: cannot read ({err.strerror})") from None
    try:
        with open(regular_input(idx), "rb") as f:
            if not f.read(1):
                raise InputError(f"{idx}: empty index: it lists no record of {rec}")
    except FileNotFoundError:
        raise InputError(f"{idx}: no index for {rec}; pack the images again to get both files: "
                         f"python -m rn50_mx.prep_rec pack IMAGE_DIR {os.path.splitext(rec)[0]}") from None
    except OSError as err:
        raise InputError(f"{idx}: cannot read ({err.strerror})") from None
    return rec, idx


def check_idx(rec, idx):
    """Every .idx line is `key<TAB>offset` inside the .rec, found before DALI's reader meets it (an assertion).
    `python -m rn50_mx.check` runs it, which the launchers run before any rank starts: reading ImageNet's 1.28M lines takes
    seconds, which training itself does not spend."""
    entries = sound_entries(rec, idx)
    size = os.path.getsize(rec)
    outside = next((key for key, offset in entries if not 0 <= offset < size), None)
    if outside is not None:
        raise InputError(f"{idx}: record {outside} starts past the end of {rec} ({size} bytes): the two files are "
                         "not one set")


def sound_entries(rec, idx):
    """[(key, offset)] of every .idx line; a line that is not `key<TAB>offset` is one line naming it (DALI's reader
    would fail on it with an assertion after run_start, its epoch sized on a count that included it)."""
    entries, bad = prep_rec.read_idx(idx)
    if bad:
        where, _, problem = bad[0]
        raise InputError(f"{idx}: {where}: {problem}; pack the images again (python -m rn50_mx.prep_rec verify "
                         f"{os.path.splitext(rec)[0]} checks a set)")
    return entries


def count_records(rec, idx):
    """Records listed by an .idx, every line checked, without opening the .rec."""
    return len(sound_entries(rec, idx))


def record_at(idx, offset):
    """The record index (the .idx key) of the record that starts at byte `offset` of the .rec."""
    entries, _ = prep_rec.read_idx(idx)
    return dict((o, key) for key, o in entries).get(offset, f"at byte offset {offset}")


def first_unidentified(rec, idx):
    """Index of the first record whose bytes no decoder can even identify as an image, or None.

    Only for the DALI failures that do not name their sample (a header nvImageCodec cannot parse): reading
    each header is far cheaper than decoding every image, which `prep_rec verify` does.
    """
    records = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
    try:
        for key in records.keys:
            _, image = mx.recordio.unpack(records.read_idx(key))
            try:
                Image.open(io.BytesIO(image)).close()
            except (UnidentifiedImageError, OSError, SyntaxError):
                return key
    finally:
        records.close()
    return None


class BadRecord(InputError):
    """A record that does not decode; `record` is its .idx key."""

    def __init__(self, message, record):
        super().__init__(message)
        self.record = record


def input_error(err, rec, idx):
    """The one-line InputError for a DALI failure that the data caused, or None when the data is not at fault.

    DALI names a sample whose data breaks off mid-decode ("<rec> at index <byte offset>"), but not one whose
    header nvImageCodec cannot parse; that one is searched for.
    """
    text = str(err)
    cause = text.split("encountered:")[-1].strip().splitlines()[0] if "encountered:" in text else text
    cause = re.sub(r'^Assert on ".*" failed: ', "", cause)
    verify = f"check it with: python -m rn50_mx.prep_rec verify {os.path.splitext(rec)[0]}"
    if "fn.decoders." in text:  # the sample's source: "<rec> at index <offset>" (where the wording puts it)
        named = re.search(re.escape(rec) + r" at index (\d+)", text)
        if named:
            record = record_at(idx, int(named.group(1)))
            return BadRecord(f"{rec}: record {record} does not decode (its data breaks off or is corrupt)", record)
        record = first_unidentified(rec, idx)
        if record is None:
            return InputError(f"{rec}: a record does not decode (DALI: {cause}); {verify}")
        return BadRecord(f"{rec}: record {record} is not an image (DALI: {cause})", record)
    if "fn.readers." in text:
        return InputError(f"{rec}: {cause}; {verify}")
    return None


@contextlib.contextmanager
def data_errors(rec, idx):
    """Turn the DALI failures that the data causes into one-line InputErrors; let the others through."""
    try:
        yield
    except RuntimeError as err:
        problem = input_error(err, rec, idx)
        if problem is None:
            raise
        raise problem from None


def check_labels(shapes, labels, sources, num_classes, rec, idx):
    """Each record carries one label (`shapes`: DALI's per-sample label shapes; a .rec packed with several labels
    per image, im2rec --pack-label, would make the batch's labels wider than the buffer they are copied into), a
    class number below num_classes; otherwise name the first bad record (via its source)."""
    wide = next((i for i, shape in enumerate(shapes) if math.prod(shape) != 1), None)
    if wide is not None:
        offset = int(np.asarray(sources[wide]).tobytes().decode().rsplit(" at index ", 1)[1])
        raise InputError(f"{rec}: record {record_at(idx, offset)} carries {math.prod(shapes[wide])} labels; training "
                         "takes one class label per image (pack the images again: python -m rn50_mx.prep_rec pack)")
    bad = (labels < 0) | (labels >= num_classes) | (labels != np.floor(labels))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        offset = int(np.asarray(sources[i]).tobytes().decode().rsplit(" at index ", 1)[1])
        raise InputError(f"{rec}: record {record_at(idx, offset)} has label {labels[i]:g}, "
                         f"not a class number in [0, {num_classes})")


def index_without(idx, keys, dest):
    """dest: a copy of the .idx without the records `keys` (written under a temporary name, then renamed)."""
    lines = (f"{key}\t{offset}\n" for key, offset in prep_rec.read_idx(idx)[0] if key not in keys)
    write_atomically(dest, "".join(lines), "the shortened index")
    return dest


# --- epoch accounting (common/dali.py, get_rec_iter) ------------------------------------------------------------------

def train_samples(settings):
    """Images per train epoch: --num-examples, or every record of the train .rec."""
    if settings.num_examples:
        return settings.num_examples
    if settings.synthetic and not settings.data_train:
        raise InputError("--synthetic: give --num-examples (or --data-train) to size the epoch")
    return count_records(*rec_and_idx(settings, True))


def steps_per_epoch(settings, world, num_samples=None):
    """Train steps per epoch, the same on every rank: ceil(floor(N / world) / batch), as the reference."""
    n = num_samples if num_samples is not None else train_samples(settings)
    if n < world:
        raise InputError(f"{settings.data_train or '--num-examples'}: {n} train images for {world} processes")
    if n // world < settings.batch_size:
        raise InputError(f"--batch-size={settings.batch_size}: larger than the {n // world} train images of each of "
                         f"the {world} processes ({settings.data_train or '--num-examples'})")
    return math.ceil(n // world / settings.batch_size)


def shard_range(n, rank, world):
    """[begin, end) of a rank's records: DALI's readers cut shard i at floor(i * n / world)."""
    return n * rank // world, n * (rank + 1) // world


def val_pads(n, rank, world, batch, padded_shard):
    """Padding of each val batch of a rank. With pad_last_batch DALI repeats a shard's last image up to
    `padded_shard` (the same on every rank) and rounds up to whole batches: those repeats are the pad."""
    begin, end = shard_range(n, rank, world)
    batches = math.ceil(padded_shard / batch)
    return [batch - min(batch, max(0, end - begin - k * batch)) for k in range(batches)]


def check_files(settings):
    """The .rec/.idx pairs the settings name must be there, readable and sound, and the train set must hold a
    batch for every process, as training would find out after its start. Returns what was checked in words
    ("not checked: ..." when the settings name no data)."""
    splits = [(train, path) for train, path in ((True, settings.data_train), (False, settings.data_val)) if path]
    if not splits:
        return "not checked: no --data-train/--data-val (DATA_TRAIN/DATA_VAL) or DATADIR given"
    for train, _ in splits:
        check_idx(*rec_and_idx(settings, train))
    if settings.data_train:  # the batch the processes of the run take from this train set
        steps_per_epoch(settings, settings.world_size)
    return "found " + ", ".join(f"{path} and its .idx" for _, path in splits)
