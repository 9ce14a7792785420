"""One error type for bad input, and the CLI wrapper that turns it into one line on stderr."""
import contextlib
import gc
import os
import re
import signal
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
    forget_interrupts()
    sys.exit(code or 0)


def forget_interrupts():
    """Keep the exit status the tool chose after an interrupt it handled. CPython 3.11 marks the process to end by
    SIGINT once a KeyboardInterrupt has left an eval() or exec() of a string, caught later or not (Python/pythonrun.c
    run_eval_code_obj sets _Py_UnhandledKeyboardInterrupt; Py_RunMain kills the process with SIGINT after finalizing
    when it is set), and clears the mark as it starts another. A SIGTERM that landed in collections.namedtuple's eval,
    as Pillow loaded its plugins, ended a stopped pack by SIGINT (status -2) instead of 130: 3 stops in 100 here, and
    once in CI. The interrupts that reach here are handled (run_cli catches the rest): the empty exec clears the mark."""
    exec("")


@contextlib.contextmanager
def stops_deferred():
    """A stop (SIGINT, SIGTERM) that comes during the block is acted on as the block ends, as it would have been
    (the signal raised again under the tool's own handling): for a library call that leaves an object half made when
    interrupted. MXNet's MXIndexedRecordIO marks itself open, then opens its .idx; stopped between the two, its
    __del__ failed on the missing .idx file and printed a traceback after the tool's one line (1 stop in 120). Only
    the main thread can set handlers: elsewhere the block runs as it is. Never around a call that can wait on the
    user's input (a FIFO, a hung mount): the stop would wait with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came = []
    kept = {signum: signal.signal(signum, lambda signum, frame: came.append(signum))
            for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


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
    forget_interrupts()
    if not any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
