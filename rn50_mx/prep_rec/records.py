"""The writer every source shares: PREFIX.{lst,rec,idx} as `im2rec.py --pass-through` writes them.

  PREFIX.lst  one line per record, in record order: `index<TAB>label<TAB>class/file.jpg` (label printed as %f)
  PREFIX.rec  RecordIO written by mxnet.recordio; record = IRHeader(flag=0, label, id=index, id2=0) followed by
              the image file's bytes
  PREFIX.idx  `index<TAB>byte offset` of each record in the .rec
The three files are written under temporary names of this writer alone and renamed at the end (the .idx last),
so an interrupted run never leaves a .rec/.idx pair that looks complete; the prefix is owned meanwhile
(rn50_mx/files.py), and an existing set is replaced only when asked (--force).
"""
import os
import sys
import time
from collections import deque, namedtuple
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from itertools import islice

from tqdm import tqdm

from ..errors import InputError, stops_deferred
from ..files import os_error, owned, refuse_existing, remove_quietly, temp_name
from ..rec_index import text_lines

Item = namedtuple("Item", "index label path")  # one .lst line; path is relative to the source folder


def mxnet():
    """MXNet, imported at the first record written or read: its import costs about 2 CPU-seconds, which a run that
    stops on its input first (no source, a bad archive or file name, an existing set) then never pays."""
    import mxnet as mx
    return mx


@dataclass(frozen=True)
class Summary:
    """What was written to (or, for verify, seen in) PREFIX.rec. problems: for a writer, the line of each bad
    file left out with skip_bad; for verify, (index, byte offset, problem) of each bad record. notes: what a
    source changed on the way (imagenet: the odd files it transcoded)."""
    prefix: str
    images: int
    classes: int
    bytes: int
    seconds: float
    problems: tuple = ()
    notes: tuple = ()

    def line(self, note):
        seconds = max(self.seconds, 1e-9)
        return (f"{self.prefix}.rec: {self.images} images, {self.classes} classes, {self.bytes} bytes in "
                f"{self.seconds:.1f} s ({self.images / seconds:.0f} images/s, {self.bytes / seconds / 1e6:.0f} MB/s)"
                f"{note}")


# --- .lst files ----------------------------------------------------------------------------------------

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
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{item.index}\t{item.label:f}\t{item.path}\n" for item in items)


def classes_from_lst(path):
    """{class folder: label} of an existing .lst, so that another split gets the same labels."""
    classes = {}
    for item in read_lst(path):
        name = item.path.split("/")[0]
        if classes.setdefault(name, item.label) != item.label:
            raise InputError(f"{path}: class folder {name} has two labels ({classes[name]} and {item.label})")
    return classes


# --- writing -------------------------------------------------------------------------------------------

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
    pool = ThreadPoolExecutor(workers)
    pending = deque()
    try:
        for part in iter(lambda: list(islice(items, chunk)), []):
            pending.append(pool.submit(list, map(fn, part)))
            if len(pending) >= 4 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        # not waiting: a thread blocked in a read must not keep a stopped pack (SIGTERM, a full disk) waiting
        pool.shutdown(wait=False, cancel_futures=True)


def progress_bar(total, desc, progress, unit="img"):
    """tqdm to stderr, counting images or (unit="B") bytes; progress None = only when stderr is a terminal."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr,
                disable=None if progress is None else not progress)


def record_of(fetch, item):
    """(record, None) of one image: its IRHeader + the bytes fetch(item) gives; or (None, problem line) for a
    bad image, so that skip_bad can go on past it."""
    try:
        recordio = mxnet().recordio
        return recordio.pack(recordio.IRHeader(0, item.label, item.index, 0), fetch(item)), None
    except InputError as err:
        return None, str(err)


def check_prefix(out_prefix):
    if os.path.isdir(out_prefix) or out_prefix.endswith(os.sep):
        raise InputError(f"{out_prefix}: is a directory; give a file prefix such as "
                         f"{os.path.join(out_prefix, 'train')}")


def check_names(items, lst):
    """Every path must fit a .lst line (no tab, newline or carriage return) and be UTF-8 (the .lst is UTF-8):
    found out before any record is written."""
    for item in items:
        try:
            item.path.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{item.path.encode('utf-8', 'surrogateescape')!r}: file name is not UTF-8, which "
                             f"{lst} cannot hold; rename the file") from None
        if any(char in item.path for char in "\t\n\r"):
            raise InputError(f"{item.path!r}: file name holds a tab or line break, which {lst} cannot hold; rename "
                             "the file")


def write_records(items, out_prefix, fetch, *, workers=1, skip_bad=False, progress=None, size=None, force=False):
    """Write a record of fetch(item)'s image bytes for each Item, in the order of `items`, to
    OUT_PREFIX.{rec,idx,lst}, reading `workers` images at a time. An existing OUT_PREFIX.rec is kept unless
    `force`; the prefix is owned for the duration (rn50_mx/files.py), so a second writer stops with one line.

    fetch raises InputError for a bad image: the run stops with that line, or with skip_bad leaves the image out
    and counts it. size(item) = its bytes gives a progress bar over bytes (MB/s, images/s); else it counts images.
    """
    start = time.time()
    check_prefix(out_prefix)
    final = {ext: f"{out_prefix}.{ext}" for ext in ("rec", "idx", "lst")}
    check_names(items, final["lst"])
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    except OSError as err:
        raise os_error(os.path.dirname(os.path.abspath(out_prefix)), err, "create") from None
    with owned(final["rec"]):
        refuse_existing(final["rec"], force, "packed set")
        tmp = {ext: temp_name(path) for ext, path in final.items()}
        try:
            packed, skipped = pack_into(items, tmp, out_prefix, fetch, workers, skip_bad, progress, size, start)
            publish(tmp, final)
        except (OSError, mxnet().base.MXNetError) as err:
            reason = err.strerror if isinstance(err, OSError) else str(err).strip().splitlines()[-1]
            raise InputError(f"{out_prefix}.rec: cannot write ({reason})") from None
        finally:
            remove_quietly(*tmp.values())
    return Summary(out_prefix, len(packed), len({item.label for item in packed}),
                   os.path.getsize(final["rec"]), time.time() - start, tuple(skipped))


def pack_into(items, tmp, out_prefix, fetch, workers, skip_bad, progress, size, start):
    """The records and the .lst of write_records under the temporary names `tmp`; (packed, skipped)."""
    packed, skipped = [], []
    with stops_deferred():
        records = mxnet().recordio.MXIndexedRecordIO(tmp["idx"], tmp["rec"], "w")
    try:
        results = ordered_map(lambda item: record_of(fetch, item), items, workers)
        with closing(results), progress_bar(sum(map(size, items)) if size else len(items),
                                            f"pack {os.path.basename(out_prefix)}", progress,
                                            "B" if size else "img") as bar:
            for (record, problem), item in zip(results, items):
                bar.update(size(item) if size else 1)
                if size and len(packed) % 256 == 0:
                    bar.set_postfix_str(f"{len(packed) / max(time.time() - start, 1e-9):.0f} img/s", refresh=False)
                if problem and not skip_bad:
                    raise InputError(problem)
                if problem:
                    skipped.append(problem)
                    continue
                records.write_idx(item.index, record)
                packed.append(item)
    finally:
        records.close()
    if not packed:
        raise InputError(f"{out_prefix}: none of the {len(items)} listed images could be packed")
    write_lst(tmp["lst"], packed)
    return packed, skipped


def publish(tmp, final):
    """Rename the finished temporaries to their final names; the old .idx goes first and the new one comes
    last, so that an old .idx never pairs with a new .rec."""
    if os.path.exists(final["idx"]):
        os.remove(final["idx"])
    for ext in ("rec", "lst", "idx"):
        os.replace(tmp[ext], final[ext])
