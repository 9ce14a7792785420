"""Tars read in place: the members of a tar, and of the tars inside it, as (name, offset, size) in the file, to be
read later by offset with os.pread. Nothing is extracted, and memory holds the index, never the images.

ILSVRC2012's archives are uncompressed tars (the train tar holds one uncompressed tar per class), so every image
is a byte range of the file on disk. Python's tarfile reads the headers: it seeks over the data it is not asked
for, and keeps its offsets relative to where it started, which a Window makes the start of an inner tar.
"""
import io
import os
import tarfile
from collections import Counter, namedtuple

from ..errors import InputError
from ..files import regular_input

Member = namedtuple("Member", "name offset size")  # offset: of the member's data, from the start of the file
SMALL_FILE_LIMIT = 64 << 20  # the devkit's meta.mat is about 2.5 MB, its ground truth 0.3 MB
END_OF_ARCHIVE = 2 * tarfile.BLOCKSIZE  # two zero blocks end every tar


class Window(io.RawIOBase):
    """Bytes [start, start + size) of an open file descriptor, as a seekable file read with os.pread: threads
    can share the descriptor, each with windows of its own."""

    def __init__(self, fd, start, size):
        super().__init__()
        self.fd, self.start, self.size, self.pos = fd, start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, pos, whence=io.SEEK_SET):
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + pos
        return self.pos

    def read(self, n=-1):
        """Up to n bytes (all that is left for n < 0): one pread, no copy (tarfile asks for a header at a time)."""
        left = self.size - self.pos
        data = os.pread(self.fd, left if n is None or n < 0 else max(0, min(n, left)), self.start + self.pos)
        self.pos += len(data)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def members(fd, start, size, name):
    """The regular files of the tar at bytes [start, start + size) of fd, in tar order, as Members.

    A tar that stops early (its last member runs past the end, or the end-of-archive blocks are missing: tarfile
    takes either for a normal end) or is no tar at all is an InputError naming `name`."""
    truncated = f"{name}: truncated tar (a member or the end-of-archive blocks run past its {size} bytes)"
    try:
        with tarfile.open(fileobj=Window(fd, start, size), mode="r:") as tar:
            found = [Member(info.name, start + info.offset_data, info.size) for info in tar if info.isfile()]
            end = tar.offset
    except (tarfile.TarError, EOFError) as err:
        if str(err) == "unexpected end of data":  # tarfile's word for a member that runs past the end
            raise InputError(truncated) from None
        raise InputError(f"{name}: not a tar ({err})") from None
    if end + END_OF_ARCHIVE > size:
        raise InputError(truncated)
    names = Counter(m.name for m in found)
    twice = next((n for n, count in names.items() if count > 1), None)
    if twice is not None:  # both would be packed, and a label keyed by name would be given to both
        raise InputError(f"{name}: holds two members named {twice!r}; an archive of ImageNet names each image once")
    return found


def class_members(path, outer):
    """members() of the tar `outer` inside the tar at `path`, for a worker process (it opens the file itself)."""
    fd, _ = open_archive(path)
    try:
        return members(fd, outer.offset, outer.size, f"{path}: member {outer.name}")
    finally:
        os.close(fd)


def open_archive(path):
    """A read-only descriptor of `path` and its size, or an InputError naming it."""
    try:
        fd = os.open(regular_input(path), os.O_RDONLY)
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    return fd, os.fstat(fd).st_size


def read_member(fd, member, name):
    """The bytes of one member, by offset; an InputError naming `name` when the file ends first."""
    data = os.pread(fd, member.size, member.offset)
    if len(data) != member.size:
        raise InputError(f"{name}: truncated ({len(data)} of {member.size} bytes)")
    return data


def small_files(path, wanted):
    """{suffix: bytes} of the members of a (compressed) tar whose names end with one of `wanted`: the devkit's
    few small files, read into memory."""
    found = {}
    try:
        with tarfile.open(path) as tar:
            for info in tar:
                suffix = next((w for w in wanted if info.name.endswith(w)), None)
                if suffix and info.isfile():
                    if info.size > SMALL_FILE_LIMIT:  # the header says so before a byte is read
                        raise InputError(f"{path}: member {info.name!r} has {info.size} bytes, more than the "
                                         f"{SMALL_FILE_LIMIT >> 20} MiB a devkit file has; not the devkit")
                    found[suffix] = tar.extractfile(info).read()
    except (tarfile.TarError, EOFError, OSError) as err:
        raise InputError(f"{path}: cannot read as a tar ({err})") from None
    missing = [w for w in wanted if w not in found]
    if missing:
        raise InputError(f"{path}: has no {', '.join(missing)}")
    return found
