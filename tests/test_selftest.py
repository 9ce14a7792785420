"""`python -m rn50_mx.selftest` as a GPU owner runs it, here on the CPU with config/CPU.sh and a small packed
Fashion-MNIST: every check runs and passes (the allreduce across 2 Gloo processes), a check that fails says why in
its row and sets the exit code, and missing data stop it in one line before any check."""
import re

import pytest

from conftest import assert_one_line_naming, sourced
from rn50_mx import prep_rec


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    """config/CPU.sh's data, smaller: 20 train and 10 val photographs per class at 32x32."""
    out = tmp_path_factory.mktemp("fashion")
    prep_rec.make_fashion_mnist(str(out), size=32, train_per_class=20, val_per_class=10)
    return f"--data-train {out}/train.rec --data-val {out}/val.rec"


def rows(stdout):
    """The table as {check: (status, detail)}."""
    table = {}
    for line in stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=2)  # columns are two or more spaces apart
        if len(parts) == 3 and parts[1] in ("ok", "FAIL", "-"):
            table[parts[0]] = (parts[1], parts[2])
    return table


@pytest.mark.slow
def test_every_check_passes_on_the_cpu(fashion):
    result = sourced("CPU", f"python -m rn50_mx.selftest {fashion} --ranks 2 --steps 3", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    table = rows(result.stdout)
    for check in ("pipelines", "layout/precision", "lars float16", "allreduce", "train steps", "eval"):
        assert table[check][0] == "ok", (check, result.stdout)
    assert "(128, 3, 32, 32) float32 NCHW on cpu(0), train 200 and val 100 images" in table["pipelines"][1]
    assert "2 processes" in table["allreduce"][1] and "100 images" in table["eval"][1]
    assert "real/synthetic" in table["train steps"][1] and "no MLPerf anchor" in table["train steps"][1]
    assert result.stdout.rstrip().endswith("selftest: all checks passed")


@pytest.mark.slow
def test_a_failing_check_names_itself_and_sets_the_exit_code(fashion):
    """10-class data under a 2-class config: the pipelines' label check fails in its row, without a traceback."""
    result = sourced("CPU", f"python -m rn50_mx.selftest {fashion} --num-classes 2 --steps 1", timeout=600)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    status, detail = rows(result.stdout)["pipelines"]
    assert status == "FAIL" and "not a class number in [0, 2)" in detail
    assert "selftest: FAILED: pipelines" in result.stdout


def test_missing_data_is_one_line_before_any_check(tmp_path):
    missing = str(tmp_path / "train.rec")
    result = sourced("CPU", f"python -m rn50_mx.selftest --data-train {missing} --data-val {missing}")
    assert_one_line_naming(result, missing)


def test_one_gpu_per_process_from_nvidia_smis_answers():
    """The verdict on nvidia-smi's compute-apps lines (pid, gpu_uuid), as a GPU machine would give them."""
    from rn50_mx.selftest import checks
    from rn50_mx.config import Settings
    from rn50_mx.selftest.report import CheckFailed, Skipped

    apps = "4242, GPU-aaaa\n4243, GPU-bbbb\n4243, GPU-aaaa\n"
    assert checks.gpu_contexts(4242, apps) == "process 4242: a context on GPU-aaaa only"
    with pytest.raises(CheckFailed, match="process 4243 holds contexts on 2 GPUs \\(GPU-aaaa, GPU-bbbb\\)"):
        checks.gpu_contexts(4243, apps)
    with pytest.raises(Skipped, match="no context of process 7"):
        checks.gpu_contexts(7, apps)
    with pytest.raises(Skipped, match="no context"):
        checks.gpu_contexts(4242, "")
    with pytest.raises(Skipped, match="CPU run"):
        checks.one_gpu(Settings())
