"""The .idx of a RecordIO set as the packer, `prep_rec verify` and the data check read it, in plain Python: the check
the launchers run before every trial (python -m rn50_mx.check) reads indexes, and must not load MXNet to do so."""
from .errors import InputError
from .files import regular_input

RECORD_MAGIC = 0xCED7230A  # the first word of every record (dmlc-core's RecordIOWriter::kMagic)


def text_lines(path):
    """The lines of a text file, or an InputError naming it (a FIFO or another special file too)."""
    try:
        with open(regular_input(path), encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None


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
