"""Reading a file whole and writing outputs, with a failure as one line naming the file: the one way every module
does either.

Every writer owns its output for the duration: an exclusive lock (flock) on PATH.lock, which a second writer meets
with one line and which the kernel releases when the holder dies, so a killed writer never leaves a stale lock.
The output is written under a temporary name no other writer shares (pid and random suffix) and renamed at the
end; a failed or interrupted write removes its temporaries."""
import contextlib
import errno
import fcntl
import os
import secrets
import socket
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


def regular_size(path):
    """The size of the regular file at `path` (through links), asked of the file system without opening it (no byte
    read); one line when it is missing, special, or not readable by this process's user."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise os_error(path, err, "read") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: {special_kind(st.st_mode)}, not a regular file: cannot read it")
    if not os.access(path, os.R_OK, effective_ids=True):
        raise InputError(f"{path}: cannot read (Permission denied)")
    return st.st_size


def special_kind(mode):
    """What is at a path, in words (a file where a folder is expected, or a special one where a file is)."""
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISREG, "a file"))
    return next((words for test, words in kinds if test(mode)), "a special file")


def os_error(path, err, doing="write"):
    """An InputError naming `path` and the operating system's reason."""
    return InputError(f"{path}: cannot {doing} ({err.strerror or err})")


def open_regular(path, flags=os.O_RDONLY, what="read", follow=True, sole=False, said=None):
    """A descriptor of the regular file at `path`, asked what it is (fstat) before a byte is read or written: the one
    way to open a file another user may have planted something at. The open itself does not wait (O_NONBLOCK, cleared
    after: a FIFO's open returns at once, and is refused); with follow False a symbolic link at `path` is refused
    (O_NOFOLLOW: a file of ours in a folder others can write is never opened through a link to one of theirs); with
    `sole` a file with other hard links is refused (it would be written in place, a victim's content through it).
    Anything else is one line naming `path` (an operating system's refusal names `said` instead when given: the
    output a lock guards); `what` is the verb it uses (read, write)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise InputError(f"{path}: a symbolic link, not a regular file: not opened through it") from None
        if err.errno == errno.ENXIO:  # O_WRONLY on a FIFO that no one reads
            raise InputError(f"{path}: a FIFO (named pipe), not a regular file: cannot {what} it") from None
        raise os_error(said or path, err, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: {special_kind(st.st_mode)}, not a regular file: cannot {what} it")
        if sole and st.st_nlink > 1:
            raise InputError(f"{path}: has {st.st_nlink} hard links: another file's content would be written "
                             "through it; remove it")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path, limit=1 << 20):
    """The text (at most `limit` bytes) of a small file this package writes into a folder others may write too (a
    lock's note, a marker, a checkpoint's meta.json): open_regular's, never through a link, a FIFO or a device; one
    line naming `path` otherwise."""
    fd = open_regular(path, follow=False)
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError as err:
        raise os_error(path, err, "read") from None
    finally:
        os.close(fd)


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
    """lock_file's descriptor, or None when another process holds the lock. The lock is a regular file of its own
    (open_regular: not a link, a FIFO or a hard link of another file), since its holder may write its note into it
    (noted_lock): a link planted at a lock in a shared folder made the run truncate the file it pointed at."""
    while True:  # a lock that is not there yet fails for its folder's reason: said as the output's
        said = None if os.path.lexists(path) else output
        fd = open_regular(path, os.O_RDWR | os.O_CREAT, "write", follow=False, sole=True, said=said)
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


def noted_lock(path, refusal, said=None):
    """try_lock's descriptor of `path` (an operating system's refusal naming `said`), held for the life of the
    process, with the holder's note in the file ("process PID on HOST"); when another process holds it, an InputError
    of refusal(its note): what a second run is told. A note that cannot be written (a full disk) is one line."""
    fd = try_lock(path, said)
    if fd is None:
        try:
            note = read_text(path, 200).strip() or "unknown"
        except InputError:
            note = "unknown"
        raise InputError(refusal(note))
    try:
        write_note(fd)
    except OSError as err:
        os.close(fd)
        raise os_error(said or path, err, "write") from None
    return fd


def write_note(fd):
    """The holder's note in a lock it holds: "process PID on HOST"."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)


_owned = set()  # the outputs this process owns now: owning one again inside is a no-op


@contextlib.contextmanager
def owned(path):
    """Hold PATH.lock for the duration, so that no other writer of `path` runs at the same time. Taking it, and
    writing the holder's note into it, is also the check that the output's folder is writable and has room (a full
    disk takes a file but not its bytes), before any work is done for it."""
    lock = os.path.abspath(path) + ".lock"
    if lock in _owned:
        yield
        return
    fd = lock_file(lock, path)  # a refusal names the output the user gave, not our lock file
    try:
        write_note(fd)
    except OSError as err:
        os.close(fd)
        remove_quietly(lock)
        raise os_error(path, err, "write") from None
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
    """Write `text` (str, or bytes) under a temporary name, then rename it to `path`, owning `path` meanwhile: a
    reader sees the old file or the whole new one. An existing `path` is kept unless `force`. A failure is an
    InputError naming `path` (and `what` it is)."""
    with owned(path):
        refuse_existing(path, force, what or "file")
        tmp = temp_name(path)
        try:
            with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
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
