"""`python -m rn50_mx.selftest` as a GPU owner runs it, here on the CPU with config/CPU.sh and a small packed
Fashion-MNIST: every check runs and passes (the allreduce across 2 Gloo processes), a check that fails says why in
its row and sets the exit code, and missing data stop it in one line before any check."""
import re
import signal
import subprocess
import time

import mxnet as mx
import psutil
import pytest

from tests.support.bfloat16 import DEMO_DTYPE, needs_bfloat16
from tests.support.procs import (ENV_PATH, ONE_THREAD, PYTHONPATH, ROOT, SHARED_CORES, assert_one_line_naming,
                                 descendants, sourced)
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
    """config/CPU.sh's path at a quarter of its batch: every row's code is the same, at a quarter of the CPU."""
    result = sourced("CPU", f"python -m rn50_mx.selftest {fashion} --ranks 2 --steps 1 --batch-size 32", ONE_THREAD,
                     timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    table = rows(result.stdout)
    for check in ("memory", "pipelines", "layout/precision", "lars float16", "allreduce", "train steps", "eval"):
        assert table[check][0] == "ok", (check, result.stdout)
    assert re.match(r"[\d.]+ GiB per process: input 0\.00, weights, gradients and optimizer states 0\.26, "
                        r"activations [\d.]+ \(estimate\)", table["memory"][1]), table["memory"]
    assert f"(32, 3, 32, 32) {DEMO_DTYPE} NCHW on cpu(0), train 200 and val 100 images" in table["pipelines"][1]
    assert "2 processes" in table["allreduce"][1] and "100 images" in table["eval"][1]
    assert "real/synthetic" in table["train steps"][1] and "no MLPerf anchor" in table["train steps"][1]
    assert result.stdout.rstrip().endswith("selftest: all checks passed")


@pytest.mark.slow
def test_a_failing_check_names_itself_and_sets_the_exit_code(fashion):
    """10-class data under a 2-class config: the pipelines' label check fails in its row, without a traceback."""
    result = sourced("CPU", f"python -m rn50_mx.selftest {fashion} --num-classes 2 --steps 1", ONE_THREAD, timeout=600)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    status, detail = rows(result.stdout)["pipelines"]
    assert status == "FAIL" and "not a class number in [0, 2)" in detail
    assert "selftest: FAILED: pipelines" in result.stdout


def test_missing_data_is_one_line_before_any_check(tmp_path):
    missing = str(tmp_path / "train.rec")
    result = sourced("CPU", f"python -m rn50_mx.selftest --data-train {missing} --data-val {missing}")
    assert_one_line_naming(result, missing)


# --- kernels for this GPU: the decision from the device's answers (the real launch runs on a GPU) --------------
WHEEL_ARCHS = ({"sm_50", "sm_60", "sm_70", "sm_80", "sm_86"}, set())  # mxnet-cu117 1.9.1's libmxnet.so: no PTX
NO_KERNEL = "Check failed: e == cudaSuccess: no kernel image is available for execution on the device"


def test_a_gpu_without_kernels_fails_in_one_line_naming_it_and_the_fix():
    from rn50_mx.selftest import kernels

    gpus = [kernels.Gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0), None),
            kernels.Gpu(1, "NVIDIA H100 80GB HBM3", (9, 0), NO_KERNEL)]
    ok, detail = kernels.verdict(gpus, WHEEL_ARCHS)
    assert ok is False and "\n" not in detail
    assert detail.startswith("GPU 1 NVIDIA H100 80GB HBM3 (sm_90, Hopper): this MXNet cannot run a kernel on it")
    assert "no kernel image" in detail and "sm_50, sm_60, sm_70, sm_80, sm_86, no PTX, which has no sm_90" in detail
    assert "docker build -t rn50-mx ." in detail and "nvcr.io/nvidia/mxnet:24.04-py3" in detail
    ok, detail = kernels.verdict(gpus[1:], None)  # no cuobjdump: the launch alone decides
    assert ok is False and "libmxnet.so" not in detail and "sm_90, Hopper" in detail


def test_gpus_that_ran_the_kernel_pass_with_their_architectures():
    from rn50_mx.selftest import kernels

    gpus = [kernels.Gpu(i, "NVIDIA H200", (9, 0), None) for i in range(2)]
    ok, detail = kernels.verdict(gpus, ({"sm_80", "sm_90", "sm_100"}, {"sm_90"}))
    assert ok and detail == ("a kernel ran on GPU 0 NVIDIA H200 (sm_90, Hopper), GPU 1 NVIDIA H200 (sm_90, Hopper); "
                             "libmxnet.so: sm_80, sm_90, sm_100, PTX sm_90")
    assert kernels.verdict([], ({"sm_80"}, set())) == (True, "no GPU visible; libmxnet.so: sm_80, no PTX")
    assert kernels.verdict([], (set(), set()))[1] == "no GPU visible; libmxnet.so: no GPU code"
    assert [kernels.family(c) for c in ((7, 0), (7, 5), (8, 6), (8, 9), (9, 0))] == \
        ["Volta", "Turing", "Ampere", "Ada", "Hopper"]


def test_a_failed_launch_is_mxnets_message_in_one_line():
    """A real launch on GPU 0 with this CPU build of MXNet: its error, without the traceback preamble."""
    import mxnet as mx

    from rn50_mx.selftest import kernels

    error = kernels.launch_error(mx, 0)
    assert error == "Operator _ones is not implemented for GPU."
    assert kernels.one_line("[18:35:30] ../src/imperative/./imperative_utils.h:93: GPU support is disabled.\n"
                            "Stack trace:\n  [bt] (0) libmxnet.so") == "GPU support is disabled."


def test_without_cuobjdump_the_launch_alone_decides(tmp_path):
    """No CUDA toolkit here: library_archs says so (None), and the stack row reads the build's answer."""
    import shutil

    from rn50_mx.selftest import kernels

    if shutil.which("cuobjdump") or shutil.which("cuobjdump", path=kernels.CUDA_BIN):
        pytest.skip("cuobjdump is installed here")
    assert kernels.library_archs(str(tmp_path / "libmxnet.so")) is None


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


@pytest.mark.slow
def test_sigterm_ends_the_self_test_and_its_horovodrun_ranks(fashion, tmp_path):
    """SIGTERM while the allreduce check runs horovodrun with 2 ranks: the self-test ends in one line and takes
    horovodrun and both ranks with it (they ran on under init before)."""
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        proc = subprocess.Popen(["bash", "-c", f"source config/CPU.sh && exec python -m rn50_mx.selftest {fashion} "
                                 "--ranks 2 --steps 1"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env={"PATH": ENV_PATH, **PYTHONPATH, **SHARED_CORES}, start_new_session=True)

    def workers():
        """This self-test's allreduce ranks: the suite's other self-tests and rehearsals run theirs beside it (a scan
        of every process found those, and signalled this one before its own horovodrun had started)."""
        return [p for p, command in descendants(proc.pid).items() if "--allreduce-worker" in command]

    deadline = time.time() + 300
    while len(workers()) < 2:
        assert proc.poll() is None and time.time() < deadline, out.read_text()[-2000:]
        time.sleep(0.2)
    started = workers()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert out.read_text().strip().splitlines()[-1] == (
        "rn50_mx.selftest: interrupted; its 1 child process group(s) stopped")
    gone, alive = psutil.wait_procs(started, timeout=30)
    assert alive == []


def test_the_allreduce_check_without_horovod_fails_naming_it(monkeypatch):
    """The allreduce check starts its ranks under this Python's Horovod (children.horovodrun: it looked for the
    horovodrun script); a Python without Horovod (made unimportable as Python documents it) fails the check in one
    line, before any process starts."""
    import sys

    from rn50_mx.config import Settings
    from rn50_mx.selftest import checks
    from rn50_mx.selftest.report import CheckFailed

    monkeypatch.setitem(sys.modules, "horovod", None)
    with pytest.raises(CheckFailed, match=r"^Horovod is not installed for .*python.* \(pip install horovod\)$"):
        checks.allreduce(Settings(), 2, [])


def test_the_stack_row_says_whether_normconv_is_there():
    """GPU review 3: the row said whether the fused BatchNorm kernels are there, not NVIDIA's NormConv operators."""
    from rn50_mx.selftest import stack

    mxnet_row = next(row for row in stack.stack_rows(False) if row.name == "mxnet")
    assert "fused BatchNorm no" in mxnet_row.detail and "NormConv no" in mxnet_row.detail, mxnet_row


class FatalNormConv:
    """NVIDIA's fused operators where their kernels cannot run: MXNet raises their LOG(FATAL) ("No fallback impl")
    as an MXNetError, here as the traced graph reaches the first of them."""

    def __getattr__(self, op):
        def call(**kwargs):
            raise mx.MXNetError(f"[{op}] No fallback impl")
        return call


def test_a_fatal_normconv_kernel_names_the_setting_that_avoids_it():
    """GPU review 3, F4: the layout/precision check hinted RN50_NORMCONV=0 only for a loss that differs; a fused
    kernel failing outright ended the check in MXNet's message. On the old code the MXNetError escapes."""
    from rn50_mx import model
    from rn50_mx.config import Settings
    from rn50_mx.selftest import checks
    from rn50_mx.selftest.report import CheckFailed

    s = Settings(num_classes=3, image_shape="3,32,32", batch_size=2)
    net = model.build_model(s)
    for stage in net.stages:
        for unit in stage:
            unit.batch, unit.ops = s.batch_size, FatalNormConv()  # as build_model sets them where NormConv is
    net.hybridize(static_alloc=True, static_shape=True)
    batch = mx.io.DataBatch(data=[mx.nd.ones((2, 3, 32, 32))], label=[mx.nd.array([0, 1])])
    with pytest.raises(CheckFailed, match=r"^the NormConv kernels failed on this GPU \(\[NormConvolution\] No "
                                          r"fallback impl\); train with RN50_NORMCONV=0$"):
        checks.layout_precision(s, mx.cpu(), net, batch)


@pytest.mark.parametrize("levers, shapes, note", [
    (dict(val_crop=64), "train (4, 3, 32, 32) and val (4, 3, 64, 64)", ""),
    (dict(prog_start_side=16, prog_step=16, prog_start_epoch=0, prog_end_epoch=2, num_epochs=3),
     "train (4, 3, 16, 16) and val (4, 3, 32, 32)", "; timed without progressive resizing (every batch at IMAGE_SHAPE"),
], ids=["val-crop", "progressive"])
def test_the_pipelines_and_train_steps_rows_pass_with_the_open_levers(three_classes, levers, shapes, note):
    """GPU review 4, F2: the pipelines check expected IMAGE_SHAPE of both splits, and the timed steps built their
    synthetic ceiling with --synthetic, which progressive resizing refuses: the recipe's open GPU config failed
    both rows. Both contenders are now timed without the lever, and the row says so."""
    from rn50_mx.selftest import checks
    from rn50_mx.selftest.report import attempt
    from tests.support.settings import open_settings

    s = open_settings(three_classes, **levers)
    rows = []
    attempt(rows, "pipelines", checks.pipelines, s, mx.cpu())
    attempt(rows, "train steps", checks.timed_steps, s, mx.cpu(), 1)
    assert [row.status for row in rows] == [True, True], rows
    assert rows[0].detail.startswith(f"{shapes} float32 NCHW on cpu(0), train 24 and val 12 images"), rows[0]
    assert ("real/synthetic" in rows[1].detail) and (note in rows[1].detail), rows[1]


@needs_bfloat16
def test_the_layout_precision_check_judges_bfloat16(fashion):
    """DTYPE=bfloat16 at the demo's batch (128 images of 32x32) against NCHW float32 on one real batch: within its
    tolerance (the old check had none for bfloat16: KeyError)."""
    from rn50_mx import config, data
    from rn50_mx.selftest import checks

    s = config.load([*fashion.split(), "--num-classes", "10", "--image-shape", "3,32,32", "--batch-size", "128",
                     "--dali-threads", "1", "--seed", "1", "--dtype", "bfloat16"], {})
    train_it, _ = data.make_iters(s, 0, 1, 1, mx.cpu())
    detail = checks.layout_precision(s, mx.cpu(), checks.configured_network(s, mx.cpu()), next(iter(train_it)))
    assert "(NCHW bfloat16; " in detail and "run imperatively" in detail, detail


def build_table(s, ctx):
    from rn50_mx.selftest import build

    return {row.name: (row.status, row.detail) for row in build.build_rows(s, ctx)}


def test_the_build_rows_check_the_stand_ins_picture_and_name_the_setting_where_it_differs(monkeypatch):
    """Issue 40: on the stand-in build (NVIDIA's as the rehearsal models it) the build's rows pass; where the installed
    build differs from that picture in what the network passes, a row fails naming the setting that avoids it: a
    BatchNormAddRelu that lacks a key Gluon's BatchNorm holds, a GPU (SM 89) whose NormConv kernels refuse (both
    wirings probed, each said). Gluon's BatchNorm without NVIDIA's keys is information (GPU review 6, F3: the
    network hands the operators what Gluon holds). On stock MXNet, one line: not NVIDIA's build."""
    from mxnet.gluon.nn import basic_layers

    from rn50_mx import standin
    from rn50_mx.config import Settings
    from tests.support import gpu_build

    assert build_table(Settings(), mx.cpu()) == {"NVIDIA build": (None, "not NVIDIA's build: MXNet 1.9.1 has neither "
                                                 "BatchNorm(act_type) nor NVIDIA's fused operators, so the stand-ins' "
                                                 "picture of that build is not checked here")}
    s = Settings(device="gpu", input_layout="NHWC", dtype="float16", standin="gpu", batch_size=2,
                 image_shape="4,32,32", num_classes=4)
    ctx = gpu_build.install(monkeypatch)
    table = build_table(s, ctx)
    assert list(table) == ["gluon layers", "fused operators", "None keywords", "kernels on this GPU"]
    assert all(status for status, _ in table.values()), table
    assert table["kernels on this GPU"][1].startswith(
        "fused BatchNorm ran; NormConv stats-fl ran; NormConv mainloop-fl ran, at batch 2 on 32x32 images in float16 "
        "NHWC on sm_80, which the stand-in assumes NormConv takes (ngc.NORMCONV_SM); this config's wiring: stats-fl")
    assert "BatchNormAddRelu(act_type=None) refused" in table["None keywords"][1]
    monkeypatch.setitem(standin.ngc.GPU, "sm", 90)  # an H100, as the 24.04 image is assumed to run them
    assert build_table(s, ctx)["kernels on this GPU"][0] is True
    monkeypatch.setitem(standin.ngc.GPU, "sm", 89)
    status, detail = build_table(s, ctx)["kernels on this GPU"]
    assert not status and detail.startswith("fused BatchNorm ran; NormConv stats-fl refused (No fallback impl for "
                                            "unsupported NormConvolution configuration.); NormConv mainloop-fl "
                                            "refused (No fallback impl"), detail
    assert detail.endswith("on sm_89, which the stand-in assumes NormConv refuses (ngc.NORMCONV_SM): set "
                           "RN50_NORMCONV=0"), detail
    real = standin.operator_arguments
    monkeypatch.setattr(standin, "operator_arguments", lambda op: real(op)._replace(
        names=[n for n in real(op).names if not (op == "BatchNormAddRelu" and n == "xbuf_ptr")]))
    assert build_table(s, ctx)["fused operators"] == (
        False, "BatchNormAddRelu lacks ['xbuf_ptr'], which the network passes: RN50_FUSED_BN=0 avoids it")
    monkeypatch.setattr(basic_layers._BatchNorm, "__init__", basic_layers._BatchNorm.__init__.stock)
    table = build_table(s, ctx)
    assert table["gluon layers"][0] is None and "nothing to set" in table["gluon layers"][1]
    assert table["fused operators"][0] is None and "BatchNormAddRelu lacks ['xbuf_ptr'], names the stand-in gives " \
        "them that the network never passes: nothing to set" in table["fused operators"][1]


def test_the_build_rows_fail_only_on_what_the_network_passes(monkeypatch):
    """GPU review 6, F3: the `fused operators` row required every name of the stand-ins' picture, arrays the NDArray
    functions declare and parameters the network leaves at their defaults, and the `kernels` row failed on an image
    laxer than the stand-in; a FAIL stops a SELFTEST=1 launch with advice to turn a working feature off. Now: a
    registry without NormConvolution's declared sum/sum_squares and ScaleBiasAddRelu's fused_relu (never passed) is
    information; one without a parameter the configured wiring passes fails, naming the other wiring where that one
    has all of its own; NormConv running where NORMCONV_SM says it refuses is information."""
    from rn50_mx import standin
    from rn50_mx.config import Settings
    from rn50_mx.selftest import build
    from rn50_mx.selftest.report import CheckFailed, Skipped
    from tests.support import gpu_build

    gpu_build.install(monkeypatch)
    real = standin.operator_arguments

    def registry_without(drop):
        monkeypatch.setattr(standin, "operator_arguments", lambda op: real(op)._replace(
            names=[n for n in real(op).names if n not in drop.get(op, ())]))

    registry_without({"NormConvolution": ("sum", "sum_squares"), "ScaleBiasAddRelu": ("fused_relu",)})
    with pytest.raises(Skipped, match=r"take every parameter the network passes; LARS kernels lars_multi_\*; "
                                      r"NormConvolution lacks \['sum', 'sum_squares'\]; ScaleBiasAddRelu lacks "
                                      r"\['fused_relu'\], names the stand-in gives them that the network never "
                                      r"passes: nothing to set$"):
        build.fused_operators()  # the default wiring, stats-fl
    registry_without({"NormConvolution": ("eps",)})  # mainloop-fl's conv2 and conv3 pass it, stats-fl's none
    with pytest.raises(Skipped, match=r"NormConvolution lacks \['eps'\], which the mainloop-fl wiring \(not this "
                                      r"config's\) passes"):
        build.fused_operators("stats-fl")
    with pytest.raises(CheckFailed, match=r"^NormConvolution lacks \['eps'\], which the mainloop-fl wiring passes: "
                                          r"RN50_NORMCONV_WIRING=stats-fl or RN50_NORMCONV=0 avoids it$"):
        build.fused_operators("mainloop-fl")
    registry_without({"BNStatsFinalize": ("elem_count",)})  # both wirings pass it
    with pytest.raises(CheckFailed, match=r"^BNStatsFinalize lacks \['elem_count'\], which the stats-fl wiring "
                                          r"passes: RN50_NORMCONV=0 avoids it$"):
        build.fused_operators("stats-fl")
    monkeypatch.setattr(build, "compute_capability", lambda ctx: (8, 9))  # an L40S on which the kernels run
    s = Settings(device="gpu", input_layout="NHWC", dtype="float16", standin="gpu", batch_size=2,
                 image_shape="4,32,32", num_classes=4)
    with pytest.raises(Skipped, match=r"NormConv mainloop-fl ran, at batch 2 on 32x32 images in float16 NHWC on "
                                      r"sm_89, which the stand-in assumes NormConv refuses \(ngc.NORMCONV_SM\): "
                                      r"NormConv runs where the rehearsal refuses it \(RN50_STANDIN_SM=89 rehearses "
                                      r"it refused\); nothing to set$"):
        build.kernels_here(s, mx.cpu(1))


def test_the_stack_only_check_says_in_one_line_that_stock_mxnet_is_not_nvidias_build():
    """`python -m rn50_mx.selftest --stack-only` with a GPU config, the minute's check in an image: on stock MXNet its
    build row is the one line; nothing fails."""
    result = sourced("NF5688M6", "python -m rn50_mx.selftest --stack-only", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert rows(result.stdout)["NVIDIA build"][1].startswith("not NVIDIA's build: MXNet 1.9.1")


def test_on_a_gpu_whose_normconv_kernels_refuse_the_self_test_says_so_in_rows_naming_the_setting(monkeypatch):
    """The stand-in build as SM 89 (NORMCONV_SM does not list it): the kernels row and the network's build each fail
    in one line naming RN50_NORMCONV=0, no traceback, and the checks that need the network are not run."""
    from rn50_mx import selftest
    from rn50_mx.config import Settings
    from tests.support import gpu_build

    gpu_build.install(monkeypatch)
    s = Settings(device="gpu", input_layout="NHWC", dtype="float16", batch_size=2, image_shape="4,32,32",
                 num_classes=4, standin="gpu", standin_sm=89)
    table = {row.name: (row.status, row.detail) for row in selftest.device_checks(s, 1, 1, [])}
    refusal = ("NVIDIA's NormConv kernels do not run on this GPU (No fallback impl for unsupported NormConvolution "
               "configuration.): set RN50_NORMCONV=0")
    assert table["network"] == (False, refusal)
    assert table["kernels on this GPU"] == (False, "fused BatchNorm ran; NormConv stats-fl refused (No fallback impl "
                                                   "for unsupported NormConvolution configuration.); NormConv "
                                                   "mainloop-fl refused (No fallback impl for unsupported "
                                                   "NormConvolution configuration.), at batch 2 on 32x32 images in "
                                                   "float16 NHWC on sm_89, which the stand-in assumes NormConv "
                                                   "refuses (ngc.NORMCONV_SM): set RN50_NORMCONV=0")
    assert "layout/precision" not in table and "eval" not in table
