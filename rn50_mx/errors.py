"""One error type for bad input, and the CLI wrapper that turns it into one line on stderr."""
import gc
import os
import re
import sys
import threading

from . import children


class InputError(Exception):
    """Bad input from the user: the message names the file (or setting) and the problem, on one line."""


def printable(text):
    """`text` on one line whatever it holds: a newline, a CR or another control character shown escaped (a path or
    value with one printed raw would break the line, or hide in it)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def one_line(message):
    """MXNet's error without its traceback lines, timestamps and source locations: the first line that says
    something ("Operator _ones is not implemented for GPU.", "... no kernel image is available ...")."""
    noise = re.compile(r"^(Traceback \(most recent call last\):|File \"|\[bt\]|Stack trace)")
    lines = [re.sub(r"^(MXNetError: )?(\[\d\d:\d\d:\d\d\] \S+: )?", "", line.strip()) for line in message.splitlines()]
    return next((line for line in lines if line and not noise.match(line)), "no message")[:300]


def run_cli(main, prog):
    """Run `main()`; an InputError, Ctrl-C or a closed output pipe ends the process with one line and a non-zero code.
    After a failure the process ends at once (its `finally` blocks have run): a worker thread blocked in a read (a
    FIFO, a hung mount) must not keep it waiting at interpreter exit.

    What the imports made (MXNet's thousands of generated operator functions, about 120,000 objects) lives as long as
    the process: frozen out of the garbage collector, whose every full pass and DALI's collect at exit would walk it
    again (a tiny training: 4.42-4.55 user CPU-seconds against 4.59-4.92, side by side)."""
    gc.freeze()
    try:
        code = main()
    except InputError as err:
        quit_now(printable(f"{prog}: error: {err}"), 2)
    except KeyboardInterrupt:
        stopped = children.stop_all()
        quit_now(f"{prog}: interrupted" + (f"; its {stopped} child process group(s) stopped" if stopped else ""), 130)
    except BrokenPipeError:  # stdout's reader left (`| head`): nothing more to say to it, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        quit_now(f"{prog}: stopped: its output's reader has gone", 1)
    sys.exit(code or 0)


def settings_first(resolve, prog, help_text=None):
    """For a tool started as `python -m`, at the top of its module, before the module loads MXNet and DALI (2 s of a
    CPU): `resolve()` reads its arguments and settings as its main() will, so that a bad flag or value is its one line
    and exit 2 at once. Returns what resolve() returned, for main() to take (resolving, and what it says, happens
    once). With -h or --help: help_text() printed and exit 0 when given, else None for main() to answer."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        if help_text is None:
            return None
        print(help_text())
        sys.exit(0)
    try:
        return resolve()
    except InputError as err:
        quit_now(printable(f"{prog}: error: {err}"), 2)


def quit_now(line, code):
    """Print `line` on stderr and end the process with `code`, without waiting for the threads that interpreter exit
    would wait for when there are any (otherwise as sys.exit, which a caller in the same process can catch)."""
    print(line, file=sys.stderr)
    if not any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
