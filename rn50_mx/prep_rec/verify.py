"""`verify PREFIX`: every record of PREFIX.idx/.rec read by mxnet's own reader, its label checked and its image
decoded, and the records checked to cover the whole .rec."""
import ctypes
import os
import struct
import time
from contextlib import closing
from functools import partial

from ..files import open_regular
from ..rec_index import RECORD_MAGIC, read_idx
from .images import decode_problem
from .records import Summary, mxnet, ordered_map, progress_bar


def records_at(rec_path, entries):
    """(record end, payload, problem) for each (key, offset) in turn. mxnet's own reader reads the record, so
    that a record the writer split in parts (where the payload holds the magic word) reads whole; the bounds
    and the magic are checked first, for a clear message, and because a read at the very end of the file would
    leave the reader at end-of-stream for good."""
    size = os.path.getsize(rec_path)
    mx = mxnet()
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
                    mx.base.check_call(mx.base._LIB.MXRecordIOReaderSeek(reader.handle, ctypes.c_size_t(offset)))
                    payload = reader.read()
                    mx.base.check_call(mx.base._LIB.MXRecordIOReaderTell(reader.handle, ctypes.byref(end)))
                except mx.base.MXNetError as err:
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
        header, image = mxnet().recordio.unpack(payload)
    except (struct.error, ValueError):
        return end, None, f"record of {len(payload)} bytes is too short for its header"
    if header.flag != 0:
        return end, None, f"header flag {header.flag}: expected one label (0)"
    label = header.label
    if label != int(label) or not 0 <= label < (num_classes or float("inf")):
        return end, None, f"label {label:g} is not a class number{f' below {num_classes}' if num_classes else ''}"
    problem = decode_problem(image)
    return end, None if problem else int(label), problem


def verify(prefix, *, num_classes=None, workers=1, progress=None):
    """Check PREFIX.idx/.rec: every offset starts a record that mxnet reads, with one label in range and an
    image that decodes, and the records of the .idx cover the whole .rec."""
    start = time.time()
    rec_path = prefix + ".rec"
    entries, bad = read_idx(prefix + ".idx")
    os.close(open_regular(rec_path))  # missing, special or unreadable: one line, not mxnet's C++ stack
    labels, spans = set(), []
    results = ordered_map(partial(check_payload, num_classes), records_at(rec_path, entries), workers)
    with closing(results), progress_bar(len(entries), f"verify {os.path.basename(prefix)}", progress) as bar:
        for (end, label, problem), (key, offset) in zip(results, entries):
            bar.update()
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
