"""A checkpoint's files on the disk: written durably, and checked against the sizes and CRC-32s its meta.json
lists."""
import json
import os
import re

from .. import files
from ..errors import InputError
from .contents import load_problem, meta_problem
from .trainer_file import COUNTS, STATES

META = "meta.json"


def fsync_path(path):
    """Flush a file's or a folder's entry to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path, payload):
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def summary(folder):
    """{file: [size, CRC-32]} of every file in `folder` but meta.json."""
    return {name: [os.path.getsize(os.path.join(folder, name)), files.crc32(os.path.join(folder, name))]
            for name in sorted(os.listdir(folder)) if name != META}


def problem(folder):
    """Why the checkpoint in `folder` cannot be used (partial, corrupt, or files that do not load: contents.py), or
    None."""
    path = os.path.join(folder, META)
    if not os.path.lexists(path):
        return f"no {META}: its writer stopped before the end"
    try:
        meta = json.loads(files.read_text(path, 1 << 24))
    except (ValueError, InputError) as err:
        return f"{META} unreadable ({err})"
    wrong = meta_problem(meta)
    if wrong:
        return wrong
    listed = meta["files"]
    wanted = {"params", STATES, COUNTS} | {f"rank{r}{part}" for r in range(meta["world"]) for part in (".json", ".aux")}
    missing = sorted(wanted - set(listed))
    if missing:
        return f"{META} lists no {missing[0]}"
    for name, (size, value) in listed.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"{name} is missing"
        try:
            if os.path.getsize(path) != size:
                return f"{name} has {os.path.getsize(path)} bytes, not {size}"
            if files.crc32(path) != value:
                return f"{name} is corrupt (CRC-32 differs)"
        except OSError as err:  # a file this user cannot read (docs/checkpoints.md: refused, the previous one used)
            return f"{name} cannot be read ({err.strerror})"
    return load_problem(folder, meta)


def read_meta(folder):
    """The checkpoint's meta.json (one that `problem` found whole)."""
    return read_json(os.path.join(folder, META))


def read_json(path):
    """A JSON file this package wrote, or one line naming it and why it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read ({err})") from None


def first_line(err):
    """An OSError's reason, or the last line of an MXNetError (its first lines are a C++ stack), without the place
    dmlc's JSON reader adds after it (' At Line 0, around ^...') and the condition a failed check names."""
    if getattr(err, "strerror", None):
        return err.strerror
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [type(err).__name__]
    while len(lines) > 1 and lines[-1].startswith("At "):
        lines.pop()
    return re.sub(r"Check failed: .*? \(.*? vs\. .*?\) : ", "", lines[-1].replace("MXNetError: ", ""))
