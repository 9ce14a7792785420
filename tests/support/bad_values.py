"""The standard hostile values, stated once for every hostile table (the launchers' variables, the tools' flags, the
files each folder format holds): a value is either a text given where a name is expected (NAMES) or a thing planted at
the path an input names (PLANTS). A table runs each input through all of them; where a case is legitimately different,
the table says why in one line. Beyond the PLANTS every input meets: truncated (where a file is there to cut),
unreadable_folder (where a folder is expected) and full_disk (where a command writes)."""
import contextlib
import os
import subprocess

# Texts given in place of a path, a stamp or an image name: each must reach a command as a name, never as an option,
# and be shown escaped on one line.
NAMES = {
    "leading dash": "-x",
    "newline": "a\nb",
    "glob characters": "a*[?]",
    "colon": "a:b",
    "empty": "",
}


def missing(path):
    """Nothing at `path`."""


def directory(path):
    os.mkdir(path)


def fifo(path):
    """A FIFO no one writes: a reader that opens it without asking what it is waits forever."""
    os.mkfifo(path)


def link_elsewhere(path):
    """A link to a file outside the run's folders, which must never be read as the input nor written through."""
    victim = f"{path}.victim"
    with open(victim, "w") as f:
        f.write("the victim's own content\n")
    os.symlink(os.path.basename(victim), path)


def unreadable(path):
    """A file its owner cannot read (root reads through chmod: a test as root checks the refusal another way): the
    file at `path` made so, its content kept (a copy: another name of a hard link keeps its mode), or a new one."""
    content = b"x\n"
    if os.path.isfile(path):
        with open(path, "rb") as f:
            content = f.read()
        os.remove(path)
    with open(path, "wb") as f:
        f.write(content)
    os.chmod(path, 0)


def empty(path):
    open(path, "w").close()


PLANTS = {f.__name__.replace("_", " "): f for f in (missing, directory, fifo, link_elsewhere, unreadable, empty)}


def truncated(path):
    """The file at `path` cut to its first half (a copy that stopped, a writer killed mid-file): a new file, so that
    another name of a hard link keeps the whole."""
    with open(path, "rb") as f:
        content = f.read()
    os.remove(path)
    with open(path, "wb") as f:
        f.write(content[:len(content) // 2])


def unreadable_folder(path):
    """A folder its owner can neither list nor write (as for unreadable: root goes through chmod)."""
    os.mkdir(path)
    os.chmod(path, 0)


@contextlib.contextmanager
def full_disk(folder):
    """A full disk at `folder` (an empty folder, made if missing): a small tmpfs mounted there and filled, so that
    a file can be created but not one byte written (root only: the caller skips elsewhere)."""
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0777", "tmpfs", str(folder)], check=True,
                   capture_output=True)
    try:
        fd = os.open(os.path.join(folder, ".filler"), os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield str(folder)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def victim_intact(path):
    """True when the file a planted link pointed at still holds its own content."""
    with open(f"{path}.victim") as f:
        return f.read() == "the victim's own content\n"


def shown(value):
    """`value` as the launchers show it in a message (printf %q, rn50_mx/launch.sh's `shown`): one line a shell reads
    back."""
    import subprocess
    return subprocess.run(["bash", "-c", 'printf %q "$1"', "_", str(value)], capture_output=True, text=True,
                          check=True).stdout
