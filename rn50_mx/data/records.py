"""The run's .rec/.idx files: their checks, the data faults named in one line, and the epoch they give."""
import contextlib
import io
import math
import os
import re

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import InputError
from ..files import open_regular, regular_size, write_atomically
from ..rec_index import RECORD_MAGIC, read_idx

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


def present(rec, idx):
    """(rec, idx) when both are regular files this process may read, neither empty, asked of the file system without
    opening them (files.regular_size): what training asks before any work, since the MLPerf clock starts before
    the data are touched (DaliIter.open reads them after run_start). A missing, empty or special file is one line
    naming it: a FIFO val .rec used to fail after run_start."""
    if not regular_size(rec):
        raise InputError(f"{rec}: empty file")
    if not os.path.lexists(idx):
        raise InputError(f"{idx}: no index for {rec}; pack the images again to get both files: "
                         f"python -m rn50_mx.prep_rec pack IMAGE_DIR {os.path.splitext(rec)[0]}")
    if not regular_size(idx):
        raise InputError(f"{idx}: empty index: it lists no record of {rec}")
    return rec, idx


def readable(rec, idx):
    """present(rec, idx), then a byte of each read, opened as files.open_regular opens (a FIFO or a device swapped
    in since is refused before a read that would wait or fail in DALI's words)."""
    for path in present(rec, idx):
        first_byte(path)
    return rec, idx


def first_byte(path):
    """The first byte of the regular file at `path` (b"" when it is empty)."""
    fd = open_regular(path)
    try:
        return os.read(fd, 1)
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    finally:
        os.close(fd)


def named_files(settings, check=readable):
    """[(rec, idx)] of the splits the settings name, each passing `check` (readable, or present: no byte read)."""
    return [check(*data_paths(settings, train)) for train, path in ((True, settings.data_train),
                                                                   (False, settings.data_val)) if path]


def check_idx(rec, idx):
    """The number of records the .idx lists, after checking that every line is `key<TAB>offset` inside the .rec and
    that the records end where the .rec ends, found before DALI's reader meets them (an assertion, or part of the
    data read in silence from an index cut short). `python -m rn50_mx.check` runs it, which the launchers run before
    any rank starts, and training when it counts the records (no --num-examples): reading ImageNet's 1.28M lines
    takes seconds, which the ImageNet configs' training (NUMEXAMPLES) does not spend, and reads no data before
    run_start."""
    entries = sound_entries(rec, idx)
    size = os.path.getsize(rec)
    outside = next((key for key, offset in entries if not 0 <= offset < size), None)
    if outside is not None:
        raise InputError(f"{idx}: record {outside} starts past the end of {rec} ({size} bytes): the two files are "
                         "not one set")
    if entries:
        last_record_whole(rec, idx, size, *max(entries, key=lambda entry: entry[1]))
    return len(entries)


def last_record_whole(rec, idx, size, key, offset):
    """The .rec's last record (at `offset`) starts with RecordIO's magic word and ends inside the file (the length
    is the low 29 bits of the word after it; a record written in parts ends past its first part's end): a .rec cut
    short (a copy or a pack that stopped) is one line here, not DALI's failure at its last batch of an epoch."""
    fd = open_regular(rec)
    try:
        header = os.pread(fd, 8, offset)
    except OSError as err:
        raise InputError(f"{rec}: cannot read ({err.strerror})") from None
    finally:
        os.close(fd)
    magic, word = (int.from_bytes(header[k:k + 4], "little") for k in (0, 4)) if len(header) == 8 else (0, 0)
    if magic != RECORD_MAGIC:
        raise InputError(f"{idx}: puts record {key} at byte {offset} of {rec}, where no record starts: the two files "
                         "are not one set")
    end = offset + 8 + -(-(word & ((1 << 29) - 1)) // 4) * 4  # a record's bytes are padded to a multiple of 4
    if end > size:
        raise InputError(f"{rec}: record {key} ends past the end of the file ({size} bytes): the file was cut short; "
                         "copy or pack it again")
    if end < size and word >> 29 == 0:  # a whole record (not the first part of a split one) ends the listed ones
        raise InputError(f"{idx}: lists records up to byte {end} of {rec}'s {size}: the index was cut short (or the "
                         ".rec holds records it does not list); pack the images again")


def sound_entries(rec, idx):
    """[(key, offset)] of every .idx line; a line that is not `key<TAB>offset` is one line naming it (DALI's reader
    would fail on it with an assertion after run_start, its epoch sized on a count that included it)."""
    entries, bad = read_idx(idx)
    if bad:
        where, _, problem = bad[0]
        raise InputError(f"{idx}: {where}: {problem}; pack the images again (python -m rn50_mx.prep_rec verify "
                         f"{os.path.splitext(rec)[0]} checks a set)")
    return entries


def record_at(idx, offset):
    """The record index (the .idx key) of the record that starts at byte `offset` of the .rec."""
    entries, _ = read_idx(idx)
    return dict((o, key) for key, o in entries).get(offset, f"at byte offset {offset}")


def first_unidentified(rec, idx):
    """Index of the first record whose bytes no decoder can even identify as an image, or None.

    Only for the DALI failures that do not name their sample (a header nvImageCodec cannot parse): reading
    each header is far cheaper than decoding every image, which `prep_rec verify` does.
    """
    import mxnet as mx  # here, not above: the launchers' data check (python -m rn50_mx.check) reads no record

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
    if "fn.readers." in text or rec in text or idx in text:  # a reader's, or one naming the files (reader_meta's)
        return InputError(f"{idx if idx in text and rec not in text else rec}: {cause}; {verify}")
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
    lines = (f"{key}\t{offset}\n" for key, offset in read_idx(idx)[0] if key not in keys)
    write_atomically(dest, "".join(lines), "the shortened index")
    return dest


# --- epoch accounting (common/dali.py, get_rec_iter) ------------------------------------------------------------------

def train_samples(settings):
    """Images per train epoch: --num-examples, or every record of the train .rec."""
    if settings.num_examples:
        return settings.num_examples
    if settings.synthetic and not settings.data_train:
        raise InputError("--synthetic: give --num-examples (or --data-train) to size the epoch")
    return check_idx(*rec_and_idx(settings, True))


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
    splits = named_files(settings)
    if not splits:
        return "not checked: no --data-train/--data-val (DATA_TRAIN/DATA_VAL) or DATADIR given"
    for rec, idx in splits:
        check_idx(rec, idx)
    if settings.data_train:  # the batch the processes of the run take from this train set
        steps_per_epoch(settings, settings.world_size)
    return "found " + ", ".join(f"{rec} and its .idx" for rec, _ in splits)
