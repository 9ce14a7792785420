"""The fused optimizer update (rn50_mx/fused_update) against MXNet's kernels, whose numbers it must keep: weights,
masters and momenta bit for bit after several training steps, on every instruction set this CPU has, special values
included; where the library is missing, stale or not a library, one line and MXNet's kernels; and the Makefile's
build of it from a clean tree."""
import os
import shutil
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from rn50_mx import fused_update, optim, train
from rn50_mx.config import Settings
from rn50_mx.model import BFLOAT16
from tests.support.bfloat16 import needs_bfloat16
from tests.support.nets import trained_parts
from tests.support.procs import ROOT

VENV = os.path.join(ROOT, ".venv")
# Every instruction set fused_update_plan knows; those beyond this CPU are skipped, saying so.
ISAS = [fused_update.PORTABLE, fused_update.AVX512, fused_update.AVX512_BF16]
OPTIMIZERS = [dict(optimizer="sgdwfastlars", lars_form="submitted"), dict(optimizer="sgdwfastlars", lars_form="tf"),
              dict(optimizer="sgd")]


def built():
    """The Kernel of the library `make` builds (make test builds it first: a missing one fails here)."""
    kernel = fused_update.load()
    assert kernel is not None, f"{fused_update.LIBRARY} does not load: `make fused-update` builds it"
    return kernel


def on_isa(isa):
    """The built library on instruction set `isa`; the test is skipped where this CPU lacks it."""
    kernel = built()
    if isa > kernel.best_isa:
        names = fused_update.ISA_NAMES
        pytest.skip(f"this CPU lacks {names[isa]} (its best: {names[kernel.best_isa]})")
    return fused_update.Kernel(kernel.lib, isa)


def bits(array):
    """The bits of an NDArray (a bfloat16 one widened: exact), as uint32."""
    return (array.astype("float32") if array.dtype == BFLOAT16 else array).asnumpy().view(np.uint32)


def assert_same(ours, theirs, what):
    for k, (a, b) in enumerate(zip(ours, theirs)):
        differ = bits(a) != bits(b)
        assert not differ.any(), f"{what} {k}: {differ.sum()} of {differ.size} values differ"


def states_of(trainer):
    """Every optimizer state array, in index order: (momentum, master) of a bfloat16 tensor, the momentum of the
    others."""
    states = trainer._updaters[0].states
    return [part for i in sorted(states) for part in (states[i] if isinstance(states[i], tuple) else [states[i]])]


def counted(kernel, calls):
    """`kernel` with its update calls counted into `calls`."""
    real = kernel.update
    kernel.update = lambda *args, **kwargs: (calls.append(len(args[0])), real(*args, **kwargs))
    return kernel


@pytest.mark.parametrize("options,dtype", [pytest.param(OPTIMIZERS[0], "bfloat16", marks=needs_bfloat16),
                                           (OPTIMIZERS[2], "float32")], ids=["lars-bfloat16", "sgd-float32"])
def test_training_steps_are_bit_for_bit(options, dtype):
    """ResNet-50 as training builds it (hybridized, train.parts), warmed up as training does (an eval that leaves the
    convolutions' weights in oneDNN's layout, two steps, their undoing), then two steps on random batches, once
    with the fused update and once with MXNet's kernels: every weight, master and momentum the same bits. The
    engine orders each fused update between its step's backward and the next forward: a forward reading weights
    half updated would show here."""
    s = Settings(num_classes=10, image_shape="3,32,32", batch_size=8, dtype=dtype, synthetic=True, num_examples=16,
                 lr=1.0, warmup_epochs=1, num_epochs=4, wd=1e-4, **options)
    rng = np.random.default_rng(0)
    batches = [mx.io.DataBatch(data=[mx.nd.array(rng.standard_normal((8, 3, 32, 32)), dtype=s.input_dtype)],
                               label=[mx.nd.array(rng.integers(0, 10, 8))]) for _ in range(2)]
    runs, calls = {}, []
    for fused in (True, False):
        net, loss_fn, trainer = trained_parts(s, mx.cpu())
        trainer._optimizer.use_fused(counted(fused_update.Kernel(built().lib), calls) if fused else None)
        train.warm_up(net, loss_fn, trainer, s, mx.cpu())
        for batch in batches:
            train.train_step(net, loss_fn, trainer, batch)
        params = [p.data() for p in net.collect_params().values()]
        runs[fused] = params, states_of(trainer)
    assert sum(calls) == 3 * 161, calls  # every tensor of every step: the CPU's 1 warm-up step, 2 timed
    assert_same(runs[True][0], runs[False][0], "parameter")  # BatchNorm's running statistics too
    assert_same(runs[True][1], runs[False][1], "state")


def special_masters(rng, size):
    """float32 values as bits: MXNet's rounding's corners (ties to even, the largest finite values that round to
    infinity, subnormals, signed zeros, infinities, quiet and signalling NaNs with payloads) and random bits."""
    corners = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                        0x00000001, 0x807FFFFF, 0x00800000, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
                        0x7FC00000, 0x7F800001, 0xFFBFFFFF, 0x7FC0DEAD], dtype=np.uint32)
    return np.concatenate([corners, rng.integers(0, 2**32, size - corners.size, dtype=np.uint64).astype(np.uint32)])


SHAPES = [(64, 32, 3, 3), (6, 8), (2, 2, 1, 1), (5,), (6,), (1000,), (37, 11), (3, 3, 7, 7)]


def tensors(rng, shapes, dtype):
    """Weights and four steps' gradients of `shapes` in `dtype`, spanning magnitudes: a zero tensor (LARS falls back
    to the plain rate), a gradient with infinities and a NaN, subnormal masters (their weights round to zero)."""
    def draw(shape):
        a = mx.nd.array(rng.standard_normal(shape).astype(np.float32) * 10 ** rng.uniform(-4, 2))
        return mx.nd.amp_cast(a, dtype=BFLOAT16) if dtype == "bfloat16" else a
    weights = [draw(s) for s in shapes]
    weights[2][:] = 0
    grads = [[draw(s) for s in shapes] for _ in range(4)]
    grads[1][3][:] = mx.nd.array(np.array([np.inf, -np.inf, np.nan, 1, 2], np.float32)).astype(weights[3].dtype)
    weights[4][:] = mx.nd.array(np.full(6, 1e-39, np.float32)).astype(weights[4].dtype)
    return weights, grads


ISA_IDS = dict(ids=lambda i: fused_update.ISA_NAMES[i].replace(" ", "-"))


@pytest.mark.parametrize("isa", ISAS, **ISA_IDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("options", OPTIMIZERS, ids=lambda o: f"{o['optimizer']}-{o.get('lars_form', '')}")
def test_every_instruction_set_gives_mxnets_bits(options, dtype, isa):
    """Four updates of tensors of many sizes (multiples of 16 and not: the vector loops' tails), the schedule's lr
    and LARS's momentum correction moving, through the Updater as Gluon's Trainer calls it: the fused update on each
    instruction set against MXNet's kernels."""
    kernel = on_isa(isa)
    weights, grads = tensors(np.random.default_rng(1), SHAPES, dtype)
    runs = {}
    for fused in (True, False):
        s = Settings(lr=0.5, warmup_epochs=1, num_epochs=3, wd=1e-2, dtype=dtype, **options)
        opt = optim.make_optimizer(s, steps_per_epoch=2)
        opt.set_wd_mult({i: 0.0 for i, shape in enumerate(SHAPES) if len(shape) == 1})
        runs[fused] = run_updates(opt, kernel if fused else None, weights, grads)
    assert_same(runs[True][0], runs[False][0], "weight")
    assert_same(runs[True][1], runs[False][1], "state")


def run_updates(opt, kernel, weights, grads, prepare=None):
    """Copies of `weights` after the updates by `opt` (with `kernel`, or MXNet's kernels) of each step's `grads`,
    and the states, flat: (weights, states). `prepare(updater, weights)` runs after the first update."""
    calls = []
    opt.use_fused(kernel and counted(kernel, calls))
    opt.rescale_grad = 1 / 8
    updater = mx.optimizer.get_updater(opt)
    ws = [w.copy() for w in weights]
    for t, step in enumerate(grads):
        updater(list(range(len(ws))), [g.copy() for g in step], ws)
        if t == 0 and prepare:
            prepare(updater, ws)
    mx.nd.waitall()
    assert kernel is None or calls == [len(ws)] * len(grads), calls
    states = updater.states
    return ws, [part for i in sorted(states) for part in (states[i] if isinstance(states[i], tuple) else [states[i]])]


@needs_bfloat16
@pytest.mark.parametrize("isa", ISAS, **ISA_IDS)
def test_bfloat16_weights_round_as_amp_cast_does(isa):
    """Momentum SGD at lr 0 on a master holding every corner of the rounding and random bit patterns: the update
    keeps each finite master and writes its weight rounded, bit for bit as MXNet's path does it (amp_cast, whose
    rounding is vcvtneps2bf16's: nearest, ties to even; a NaN quieted, its payload's top kept; a subnormal to a zero
    of its sign; mshadow's own bf16_t cast truncates instead)."""
    kernel = on_isa(isa)
    rng = np.random.default_rng(2)
    corners = special_masters(rng, 4099)
    weights = [mx.nd.zeros(corners.size, dtype=BFLOAT16)]
    grads = [[mx.nd.array(rng.standard_normal(corners.size)).astype(BFLOAT16)] for _ in range(2)]

    def plant(updater, ws):  # the master as the corners, its weight as MXNet's path makes it
        updater.states[0][1][:] = mx.nd.array(corners.view(np.float32))
        ws[0][:] = mx.nd.amp_cast(updater.states[0][1], dtype=BFLOAT16)

    runs = {}
    for fused in (True, False):
        opt = optim.make_optimizer(Settings(optimizer="sgd", lr=0.0, end_lr=0.0, warmup_epochs=0,
                                            dtype="bfloat16"), 2)
        runs[fused] = run_updates(opt, kernel if fused else None, weights, grads, plant)
    assert_same(runs[True][0], runs[False][0], "weight")
    assert_same(runs[True][1], runs[False][1], "state")
    master = runs[True][1][1].asnumpy().view(np.uint32)
    kept = ((corners & 0x7F800000) != 0x7F800000) & (corners != 0x80000000)  # -0 + 0 is +0
    assert (master[kept] == corners[kept]).all()  # lr 0: the finite masters as they were
    assert (bits(runs[True][0][0])[kept] >> 16 == amp_cast_bits(corners[kept])).all()


def amp_cast_bits(values):
    """bfloat16 bits of float32 `values` (bits) as vcvtneps2bf16 rounds them."""
    top = values >> 16
    rounded = ((values + 0x7FFF + (top & 1)) >> 16) & 0xFFFF
    rounded = np.where((values & 0x7F800000) == 0, top & 0x8000, rounded)
    return np.where((values & 0x7FFFFFFF) > 0x7F800000, top | 0x40, rounded)


def test_the_parsers_read_floats_as_mxnet_does():
    """The library's floats are the ones MXNet's operators read from their arguments: a float field (dmlc::stof:
    sgd_update's lr), a Tuple<float> item (multi_sgd_update's lrs) and _mul_scalar's scalar (a double). dmlc's
    parser is not the nearest float32 (measured: 3.5% of random decimals in [0, 20] read one ULP off), so taking
    float32(value) instead would break the bits."""
    kernel = built()
    assert kernel.param_float(3.5131124120511803) != np.float32(3.5131124120511803)
    for value in (0.9, 1 / 3, 10.5 / 786, 0.1 + 2**-30, 3.5131124120511803, 1e30, 1e-30):
        w, v = mx.nd.zeros(1), mx.nd.zeros(1)  # one step from 0 on a gradient of 1: -lr
        mx.nd.sgd_update(w, mx.nd.ones(1), lr=value, wd=0, rescale_grad=1, out=w)
        mx.nd.multi_sgd_update(v, mx.nd.ones(1), lrs=[value], wds=[0], num_weights=1, rescale_grad=1, out=[v])
        assert [np.float32(kernel.param_float(value)), np.float32(kernel.tuple_float(value))] == \
            [-w.asnumpy()[0], -v.asnumpy()[0]], value
        assert kernel.times_scalar([1.0, 0.5], value).tolist() == (mx.nd.array([1.0, 0.5]) * value).asnumpy().tolist()
    assert np.isnan(kernel.param_float("no number")) and np.isnan(kernel.tuple_float("[x"))


def test_where_the_library_is_missing_training_says_so_and_runs_mxnets_kernels(tmp_path, monkeypatch, capfd):
    """A missing build, a file that is no library, a library that is not this one, a build of another source, a
    source that does not read: each one line on stderr, and the optimizer updates with MXNet's kernels."""
    cases = {"missing": "is not built", "garbage": "does not load", "other": "does not load",
             "stale": "was built from another fused_update.cc", "unreadable": "does not read"}
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "libfused_update.so.1").write_bytes(b"\x7fELF not really")
    (tmp_path / "other").mkdir()
    shutil.copy(ctypes_library("libm.so.6"), tmp_path / "other" / "libfused_update.so.1")
    (tmp_path / "stale").mkdir()
    shutil.copy(fused_update.LIBRARY, tmp_path / "stale" / "libfused_update.so.1")
    (tmp_path / "stale" / "fused_update.cc").write_text(open(fused_update.SOURCE).read() + "\n// changed\n")
    (tmp_path / "unreadable" / "fused_update.cc").mkdir(parents=True)  # a folder where the source should be
    shutil.copy(fused_update.LIBRARY, tmp_path / "unreadable" / "libfused_update.so.1")
    source = fused_update.SOURCE
    for case, why in cases.items():
        monkeypatch.setattr(fused_update, "LIBRARY", str(tmp_path / case / "libfused_update.so.1"))
        monkeypatch.setattr(fused_update, "SOURCE", str(tmp_path / case / "fused_update.cc")
                            if case in ("stale", "unreadable") else source)
        opt = optim.make_optimizer(Settings(dtype="float32"), steps_per_epoch=2)
        lines = capfd.readouterr().err.splitlines()
        assert opt.fused is None and len(lines) == 1 and why in lines[0], (case, lines)
        assert "MXNet's unfused kernels" in lines[0] and fused_update.LIBRARY in lines[0]
        weight = mx.nd.ones((4, 3, 3, 3))
        mx.optimizer.get_updater(opt)([0], [mx.nd.ones((4, 3, 3, 3))], [weight])
        assert (weight.asnumpy() < 1).all()  # updated, by MXNet's kernels
    assert optim.make_optimizer(Settings(dtype="float32", device="gpu"), 2).fused is None  # the GPU: never


def ctypes_library(name):
    """The path of a shared library the process has loaded (for a real library that is not ours)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if line.rstrip().endswith(name)}
    assert paths, name
    return paths.pop()


def test_the_makefile_builds_it_from_a_clean_tree(tmp_path):
    """The Makefile and the source alone, two builds at once (a second writer: each renames a whole file), then the
    result loads and knows its source; with no compiler, one line and no library, and make still succeeds."""
    tree = tmp_path / "tree"
    (tree / "rn50_mx" / "fused_update").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "Makefile"), tree)
    shutil.copy(fused_update.SOURCE, tree / "rn50_mx" / "fused_update")
    make = ["make", "--no-print-directory", f"VENV={VENV}", "-o", f"{VENV}/.base", "fused-update"]
    builds = [subprocess.Popen(make, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    for build in builds:
        out, err = build.communicate(timeout=300)
        assert build.returncode == 0, err
    library = tree / "rn50_mx" / "fused_update" / "libfused_update.so.1"
    assert sorted(os.listdir(library.parent)) == ["fused_update.cc", "libfused_update.so.1"]  # no temporary left
    kernel, why = fused_update.open_library(str(library), str(tree / "rn50_mx" / "fused_update" / "fused_update.cc"))
    assert why is None and kernel.best_isa >= fused_update.PORTABLE
    library.unlink()
    result = subprocess.run([*make, "CXX=false"], cwd=tree, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not library.exists()
    assert result.stderr.count("\n") == 1 and "did not build" in result.stderr and "unfused" in result.stderr


def test_the_optimizer_pickles_without_the_library_and_gets_it_back():
    """Gluon's save_states pickles the optimizer: the library handle and the arrays last seen stay out, and the
    unpickled optimizer loads the library again."""
    import pickle

    opt = optim.make_optimizer(Settings(dtype="float32"), steps_per_epoch=2)
    assert opt.fused is built()
    back = pickle.loads(pickle.dumps(opt))
    assert back.fused is built() and back.fused_groups == {}
    opt.use_fused(None)
    assert pickle.loads(pickle.dumps(opt)).fused is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
