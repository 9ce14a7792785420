"""Reading a file whole and writing a small text file, with a failure as one line naming the file: the one way
every module does either."""
import os

from .errors import InputError


def read_bytes(path):
    """The bytes of the file at `path`."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None


def write_atomically(path, text, what=""):
    """Write `text` under a temporary name, then rename it to `path`: a reader sees the old file or the whole new
    one. A failure is an InputError naming `path` (and `what` it is)."""
    try:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    except OSError as err:
        raise InputError(f"{path}: cannot write{' ' + what if what else ''} ({err.strerror})") from None
