"""Reading a file whole and writing outputs, with a failure as one line naming the file: the one way every module
does either.

Every writer owns its output for the duration: an exclusive lock (flock) on PATH.lock, which a second writer meets
with one line and which the kernel releases when the holder dies, so a killed writer never leaves a stale lock.
The output is written under a temporary name no other writer shares (pid and random suffix) and renamed at the
end; a failed or interrupted write removes its temporaries."""
import contextlib
import fcntl
import os
import secrets
import stat
import zlib

from .errors import InputError


def read_bytes(path):
    """The bytes of the file at `path`. A device is refused before a read: a link to /dev/zero named like an image
    never ends, a disk would be read whole. A FIFO is read as a file: it waits for its writer as a hung mount waits,
    and a stop (SIGTERM, Ctrl-C) still ends the reader at once (the tests' stand-in for a read that blocks)."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                raise InputError(f"{path}: a device, not a file: cannot read it")
            return f.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None


def regular_input(path):
    """`path`, once it names a regular file (through links), checked before any open: opening a FIFO waits for a
    writer that may never come (a .rec planted as a pipe hung evaluate and check), a device reads without end, a
    folder fails in a library's own words. One line naming the path otherwise; a path that is not there is left to
    the caller's open, whose words say so."""
    with contextlib.suppress(OSError):
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{path}: {special_kind(mode)}, not a regular file: cannot read it")
    return path


def special_kind(mode):
    """What a file that is not a regular one is, in words."""
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
    return next((words for test, words in kinds if test(mode)), "a special file")


def os_error(path, err, doing="write"):
    """An InputError naming `path` and the operating system's reason."""
    return InputError(f"{path}: cannot {doing} ({err.strerror or err})")


def lock_file(path, output=None):
    """An open descriptor holding an exclusive flock on `path` (created when missing), or an InputError naming
    `output` (the file the lock guards; default `path`): another process holds it, or the lock cannot be created
    (read-only or full disk, missing folder)."""
    fd = try_lock(path, output)
    if fd is None:
        raise InputError(f"{output or path}: another process is writing this output now; wait for it to end or "
                         "choose another output")
    return fd


def try_lock(path, output=None):
    """lock_file's descriptor, or None when another process holds the lock."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise os_error(output or path, err, "write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:  # a holder that just finished removed the file we opened: lock the one at `path` now
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


_owned = set()  # the outputs this process owns now: owning one again inside is a no-op


@contextlib.contextmanager
def owned(path):
    """Hold PATH.lock for the duration, so that no other writer of `path` runs at the same time. Taking it is
    also the check that the output's folder is writable, before any work is done for it."""
    lock = os.path.abspath(path) + ".lock"
    if lock in _owned:
        yield
        return
    fd = lock_file(lock, path)  # a refusal names the output the user gave, not our lock file
    _owned.add(lock)
    try:
        yield
    finally:
        _owned.discard(lock)
        with contextlib.suppress(OSError):
            os.remove(lock)
        os.close(fd)


def owned_in_folder(path):
    """owned(path), its folder created first: an unwritable folder or a second writer is one line before any work
    is done for the output (the tuner's and the search's config fragments)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise os_error(folder, err, "create") from None
    return owned(path)


def temp_name(path):
    """A temporary name next to `path` that no other writer shares."""
    return f"{path}.{os.getpid()}-{secrets.token_hex(3)}.tmp"


def remove_quietly(*paths):
    """Remove what of `paths` is there (a path through a file is not there either)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.remove(path)


def refuse_existing(path, force, what="output"):
    """An existing `path` is kept unless `force`: one line saying how to replace it."""
    if os.path.exists(path) and not force:
        raise InputError(f"{path}: exists; the {what} there is kept (give --force to replace it)")


def refuse_special(path, what="output"):
    """An existing `path` that is not a regular file (a folder, a symlink, a FIFO) is one line: checked before the
    work, as the rename at its end would fail on a folder and replace a link another file's owner planted."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise InputError(f"{path}: exists and is not a regular file; the {what} is not written there")


def write_atomically(path, text, what="", force=True):
    """Write `text` under a temporary name, then rename it to `path`, owning `path` meanwhile: a reader sees the
    old file or the whole new one. An existing `path` is kept unless `force`. A failure is an InputError naming
    `path` (and `what` it is)."""
    with owned(path):
        refuse_existing(path, force, what or "file")
        tmp = temp_name(path)
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as err:
            raise InputError(f"{path}: cannot write{' ' + what if what else ''} ({err.strerror})") from None
        finally:
            remove_quietly(tmp)


def crc32(path, size=None):
    """The CRC-32 of the file at `path`, or of its first `size` bytes."""
    value, left = 0, size
    with open(path, "rb") as f:
        while left is None or left > 0:
            chunk = f.read(1 << 22 if left is None else min(left, 1 << 22))
            if not chunk:
                break
            value = zlib.crc32(chunk, value)
            left = None if left is None else left - len(chunk)
    return value
