"""MXNet's operator functions from the code `make` compiled (rn50_mx/op_cache): the same code as compiling each
source, taken for every operator at import, and never a file that is not this Python's whole cache."""
import marshal
import os
import shutil
import subprocess
import sys

import pytest

from rn50_mx import op_cache
from tests.support.procs import ROOT, py, run

# In a fresh process: MXNet imported with op_cache's finder at `path` (the shipped one when 'PATH'), counting what
# the operator modules run: kept code, or a source to compile; then one operator run. Prints kept, compiled, 3.0.
IMPORT = """
import builtins, sys
from rn50_mx import op_cache
path = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, op_cache.CompiledOps)]
sys.meta_path.insert(0, op_cache.CompiledOps(op_cache.PATH if path == 'PATH' else path))
counts, real = [0, 0], builtins.exec
def counting(source, g=None, l=None):
    g = sys._getframe(1).f_globals if g is None else g
    if g.get('__name__') in op_cache.MODULES:
        counts[isinstance(source, str)] += 1
    return real(source, g, l)
builtins.exec = counting
import mxnet as mx
builtins.exec = real
print(counts[0], counts[1], (mx.nd.ones(3) * 2 + 1).asnumpy().sum() / 3)
"""

def import_with(path):
    result = run([sys.executable, "-c", IMPORT, str(path)])
    assert result.returncode == 0, result.stderr[-2000:]
    kept, compiled, value = result.stdout.split()
    return int(kept), int(compiled), float(value)


def test_every_operator_s_kept_code_is_what_compiling_its_source_makes():
    """Each of MXNet's operator sources, recorded in a fresh process: the shipped file's code for it, its handle put
    back, equals (co_code, constants, names, line table) the code compiling the source itself makes."""
    code = ("import builtins, sys\n"
            "from rn50_mx import op_cache\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, op_cache.CompiledOps)]\n"
            "sources, real = [], builtins.exec\n"
            "def recording(source, g=None, l=None):\n"
            "    g = sys._getframe(1).f_globals if g is None else g\n"
            "    if isinstance(source, str) and g.get('__name__') in op_cache.MODULES:\n"
            "        sources.append(source)\n"
            "    return real(source, g, l)\n"
            "builtins.exec = recording\n"
            "import mxnet\n"
            "builtins.exec = real\n"
            "table = op_cache.load()\n"
            "same = sum(op_cache.compiled(s, table) == compile(s, '<string>', 'exec') for s in sources)\n"
            "print(len(sources), same)\n")
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr[-2000:]
    sources, same = map(int, result.stdout.split())
    assert sources > 2000 and same == sources, result.stdout


def test_mxnet_s_import_takes_the_kept_code_for_every_operator():
    kept, compiled, value = import_with("PATH")
    assert kept > 2000 and compiled == 0 and value == 3.0


@pytest.mark.parametrize("planted", ["missing", "a FIFO", "a folder", "another Python's", "damaged", "not code"])
def test_a_cache_that_is_not_this_python_s_whole_file_is_never_used(tmp_path, planted):
    """Whatever is at the path, nothing of it is used; a FIFO is not opened (its open would wait for a writer)."""
    path = tmp_path / "ops.marshal"
    good = open(op_cache.PATH, "rb").read()
    if planted == "a FIFO":
        os.mkfifo(path)
    elif planted == "a folder":
        path.mkdir()
    elif planted == "another Python's":
        path.write_bytes(good.replace(op_cache.HEADER, op_cache.HEADER[:-4] + b"\x00\x00\r\n", 1))
    elif planted == "damaged":
        path.write_bytes(good[:len(good) // 2])
    elif planted == "not code":
        path.write_bytes(op_cache.HEADER + marshal.dumps({b"k" * 32: "print('not code')"}))
    assert op_cache.load(str(path)) == {}


def test_with_a_damaged_cache_mxnet_compiles_every_operator_and_computes(tmp_path):
    good = open(op_cache.PATH, "rb").read()
    (tmp_path / "ops.marshal").write_bytes(good[:len(good) // 2])
    kept, compiled, value = import_with(tmp_path / "ops.marshal")
    assert compiled > 2000 and kept < 10 and value == 3.0  # kept: the 2 code objects MXNet runs itself


def test_the_cache_is_written_whole_by_one_writer_and_a_second_one_says_so(tmp_path):
    """Two builds at once in a copy of the package, a link planted at the file: one writes it (under a temporary name,
    renamed over the link), the other stops with one line or writes it after; what is left loads as this Python's
    cache, and the link's target is untouched."""
    shutil.copytree(os.path.join(ROOT, "rn50_mx"), tmp_path / "rn50_mx")
    target = tmp_path / "rn50_mx" / "op_cache" / "ops.marshal"
    target.unlink(missing_ok=True)
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    target.symlink_to(victim)  # planted where the cache is written: replaced, never written through
    env = {"PYTHONPATH": str(tmp_path)}
    first, second = (subprocess.Popen(py("rn50_mx.op_cache"), cwd=tmp_path, env={**os.environ, **env},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2))
    outcomes = sorted((proc.wait(timeout=120), proc.stdout.read() + proc.stderr.read()) for proc in (first, second))
    assert outcomes[0][0] == 0 and f"{target}: " in outcomes[0][1], outcomes
    assert outcomes[1][0] == 0 or (outcomes[1][0] == 2 and len(outcomes[1][1].strip().splitlines()) == 1), outcomes
    assert sorted(set(os.listdir(target.parent)) - {"__pycache__"}) == ["__init__.py", "__main__.py", "ops.marshal"]
    assert len(op_cache.load(str(target))) > 2000 and not target.is_symlink() and victim.read_text() == "theirs"
