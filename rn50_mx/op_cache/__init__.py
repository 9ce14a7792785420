"""MXNet's operator functions from code compiled once, at `make`, instead of at every import.

MXNet 1.9's import writes the Python source of a function for each of its operators and compiles it: 2556 sources
(mxnet/ndarray/register.py and mxnet/symbol/register.py, `exec(code, None, local)`), 0.43 of the 0.95 CPU-seconds the
import takes here, in every process that loads MXNet: each training and Horovod rank, horovodrun's own check, evaluate.
Each source differs between processes only by its operator's handle, an address written into it as a number
(`_imperative_invoke(<handle>, ...)`, `_symbol_creator(<handle>, ...)`). `python -m rn50_mx.op_cache` (make runs it)
compiles every source with a placeholder for the handle and keeps the code by the SHA-256 of that source; at import,
the two modules' `exec` takes the kept code of a source it is given, with the handle put back in place of the
placeholder, and compiles any other source as before. A source MXNet writes differently (another version, NVIDIA's
fork in the GPU image) finds nothing kept: that process compiles it, as without the file. The code kept is equal to
what compiling the source makes (tests/test_op_cache.py compares all of them)."""
import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import stat
import sys
import types

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops.marshal")
MODULES = ("mxnet.ndarray.register", "mxnet.symbol.register")
CALLS = ("_imperative_invoke(", "_symbol_creator(")  # the calls whose first argument is the handle
HEADER = b"rn50_mx op_cache 1\n" + importlib.util.MAGIC_NUMBER  # code objects are one Python version's
PI = "31415926535897932384626433832795"  # a placeholder's digits: as many as the handle's it stands for


def placeholder(digits):
    """The number that stands for a handle of `digits` digits: as wide as it, so that every column of the source,
    and so the code's line table, stays the same."""
    return int(PI[:digits])


def with_placeholder(source):
    """(`source` with its operator's handle replaced by its placeholder, the handle), or (None, None) when it names
    no handle or more than one. str.find, not a regular expression: this runs for each of the 2556 sources at every
    import, where a regular expression's scan of their docstrings took a fifth of a CPU-second."""
    parts, handles, at = [], set(), 0
    for call in CALLS:
        start = source.find(call)
        while start >= 0:
            first = start + len(call)
            end = source.find(",", first)
            if end < 0 or not source[first:end].isdigit():
                return None, None
            parts.append((first, end))
            handles.add(int(source[first:end]))
            start = source.find(call, end)
    if len(handles) != 1 or len(str(min(handles))) > len(PI):
        return None, None
    handle = handles.pop()
    pieces = []
    for first, end in sorted(parts):
        pieces += [source[at:first], str(placeholder(end - first))]
        at = end
    return "".join(pieces) + source[at:], handle


def key(source):
    return hashlib.sha256(source.encode()).digest()


def with_handle(code, handle, stand_in=None):
    """`code` with the placeholder of `handle` replaced by it in its constants and in those of the code it holds."""
    stand_in = placeholder(len(str(handle))) if stand_in is None else stand_in
    consts = tuple(handle if type(c) is int and c == stand_in else
                   with_handle(c, handle, stand_in) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_consts=consts)


def compiled(source, table):
    """The code `exec` would compile from `source`, taken from `table` when it holds it; else `source` itself."""
    general, handle = with_placeholder(source)
    code = table.get(key(general)) if general is not None else None
    return source if code is None else with_handle(code, handle)


def load(path=PATH):
    """{key: code} kept at `path`; {} when there is none, or it is not a regular file, or not one this Python wrote
    (a file from another Python or a damaged one is never used: its code would not be this version's)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return {}
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(HEADER):
            return {}
        table = marshal.loads(data[len(HEADER):])
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(table, dict) or not all(isinstance(k, bytes) and isinstance(v, types.CodeType)
                                              for k, v in table.items()):
        return {}
    return table


def exec_with(table):
    """The `exec` the two modules see: builtins.exec of the kept code of each source."""
    def cached_exec(source, globals=None, locals=None):
        if globals is None:  # exec(code, None, local) runs in its caller's globals
            globals = sys._getframe(1).f_globals
        return exec(compiled(source, table) if isinstance(source, str) else source, globals, locals)
    return cached_exec


class _Loader:
    """The module's own loader, with `exec` set in the module before its body runs."""

    def __init__(self, loader, table):
        self.loader, self.table = loader, table

    def __getattr__(self, name):  # get_source, is_package, ...: the module's own loader answers
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__dict__["exec"] = exec_with(self.table)
        self.loader.exec_module(module)


class CompiledOps:
    """A meta path finder: the two modules, found as usual, loaded with the kept code (read at the first of them)."""

    def __init__(self, path=PATH):
        self.path, self.table = path, None

    def find_spec(self, name, path=None, target=None):
        if name not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        if self.table is None:
            self.table = load(self.path)
        if self.table:
            spec.loader = _Loader(spec.loader, self.table)
        return spec


def parser():
    """The command line of `python -m rn50_mx.op_cache`: no argument; -h says what it does (config.Parser: an error
    is one line)."""
    from ..config import Parser

    return Parser(prog="python -m rn50_mx.op_cache", description="Compile MXNet's operator functions once, for "
                  f"every later import of it: writes {PATH} (make runs it after installing MXNet).")


def recorded():
    """{key: code} of every operator source of this MXNet, compiled with the placeholder: MXNet imported in this
    process with an `exec` that records them."""
    import builtins

    table, real_exec = {}, builtins.exec

    def recording_exec(source, globals=None, locals=None):
        if globals is None:  # as in exec_with: the caller's globals
            globals = sys._getframe(1).f_globals
        if isinstance(source, str) and globals.get("__name__") in MODULES:
            general, _ = with_placeholder(source)
            if general is not None:
                table[key(general)] = compile(general, "<string>", "exec")
        return real_exec(source, globals, locals)

    kept = [finder for finder in sys.meta_path if isinstance(finder, CompiledOps)]
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder not in kept]  # every source compiled here
    builtins.exec = recording_exec
    try:
        importlib.import_module("mxnet")
    finally:
        builtins.exec = real_exec
        sys.meta_path[:0] = kept
    return table
