"""Distributed training on real processes: `horovodrun --gloo -np 2` on this CPU, as a user launches it.

What each test launches runs either `python -m rn50_mx.train` itself or this file as a worker
(`python tests/test_dist.py MODE OUT ...`, the functions under "workers"), which calls rn50_mx's own functions,
so no test-only code path lives in the package. Every launch costs about 7 s of horovodrun start-up.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import psutil
import pytest

from tests.support.mllog import CHECKER_ON_A_SHORT_RUN
from tests.support.procs import PYTHONPATH, assert_all_end, gloo_ranks
from tests.support.settings import SHRUNK_LAYERS
from rn50_mx import children, data, dist, model, optim, timing, train
from rn50_mx.config import Settings
from rn50_mx.errors import InputError, run_cli

THIS = os.path.abspath(__file__)
GLOBAL_BATCH, FEATURES, STEPS = 8, 12, 2


def launch(n, command, out_file, env=None, **popen):
    """horovodrun with n Gloo processes on localhost running `command`; output to out_file. Returns the Popen."""
    with open(out_file, "w") as out:
        return subprocess.Popen([*gloo_ranks(n), *command],
                                stdout=out, stderr=subprocess.STDOUT, env={**(env or os.environ), **PYTHONPATH},
                                **popen)


def stop_tree(proc, procs=()):
    """The launcher and the processes under it, ended if a test left them running (psutil checks that each pid
    still names the process it saw before signalling it)."""
    if proc.poll() is None:
        procs = [*procs, *psutil.Process(proc.pid).children(recursive=True)]
        proc.kill()
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def tails(text, lines=30):
    """The last `lines` lines of each rank and of the launcher: the cause of a failure is often in a rank that did
    not print last (a rank aborted in native code, while its peer's traceback fills the end of the output)."""
    by_source = {}
    for line in text.splitlines():
        tag = re.match(r"\[(\d+)\]<std", line)
        by_source.setdefault(f"rank {tag.group(1)}" if tag else "launcher", []).append(line)
    return "\n".join(f"--- {source}\n" + "\n".join(text_lines[-lines:]) for source, text_lines in by_source.items())


def run_to_end(n, command, out_file, timeout=240, **popen):
    """launch() and wait; the text it printed, after checking that it succeeded."""
    proc = launch(n, command, out_file, **popen)
    try:
        proc.wait(timeout=timeout)
    finally:
        stop_tree(proc)
    text = open(out_file).read()
    assert proc.returncode == 0, tails(text)
    return text


def demo_flags(rec_prefix, out_dir, **more):
    """The demo's shape, shrunk: 32x32 images of 3 classes, batch 4 per process, 1 epoch, eval at its end."""
    flags = dict(data_train=rec_prefix + ".rec", data_val=rec_prefix + ".rec", num_classes=3, image_shape="3,32,32",
                 num_layers=SHRUNK_LAYERS, batch_size=4, num_epochs=1, warmup_epochs=0, eval_period=1, eval_offset=0,
                 lr=0.5, dali_threads=1, seed=7, kv_store="horovod", disp_batches=1, dgxngpu=2,
                 mllog_file=os.path.join(out_dir, "mlperf.log"))
    flags.update(more)
    return [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]


def rank_lines(text, rank):
    """What rank `rank` printed, without horovodrun's "[rank]<stdout>:" prefix."""
    tag = f"[{rank}]<stdout>:"
    return [line[len(tag):] for line in text.splitlines() if line.startswith(tag)]


# --- workers: run under horovodrun as `python tests/test_dist.py MODE OUT ...` --------------------------------

def tiny_net(seed):
    """Dense -> ReLU -> Dense: no BatchNorm, whose per-rank batch statistics would differ from one process's."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, in_units=FEATURES, activation="relu"), mx.gluon.nn.Dense(3, in_units=16))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    return net


# Each optimizer with one of Horovod's two allreduce paths: grouped calls (num_groups 2), or one call per tensor.
OPTIMIZER_GROUPS = (("lars", 2), ("sgd", 0))


def equivalence_worker(out, kv_store):
    """STEPS updates of tiny_net on a fixed global batch, which the ranks split in equal halves; each optimizer's
    parameters are saved by rank 0. The ranks start from different weights: the broadcast must align them."""
    rng = np.random.RandomState(0)
    x = rng.standard_normal((STEPS, GLOBAL_BATCH, FEATURES)).astype("float32")
    y = rng.randint(0, 3, (STEPS, GLOBAL_BATCH)).astype("float32")
    for name, groups in OPTIMIZER_GROUPS:
        s = Settings(optimizer=name, lr=2.0, warmup_epochs=1, num_epochs=3, wd=1e-3, kv_store=kv_store,
                     horovod_num_groups=groups, dgxngpu=ranks(kv_store))
        d = dist.init(s)
        local = GLOBAL_BATCH // d.size
        mine = slice(d.rank * local, (d.rank + 1) * local)
        net = tiny_net(seed=1 + d.rank)
        d.broadcast_params(net.collect_params())
        if d.rank == 0:
            net.save_parameters(f"{out}.{name}.init")
        trainer = optim.make_trainer(net, s, STEPS, d.trainer)
        loss_fn = optim.make_loss(s)
        for step in range(STEPS):
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.array(x[step, mine])), mx.nd.array(y[step, mine]))
            loss.backward()
            trainer.step(local)
        if d.rank == 0:
            net.save_parameters(f"{out}.{name}")
    mx.nd.waitall()  # as train.run: no rank leaves with allreduces its peer still needs


def ranks(kv_store):
    """The processes per node a worker's settings name: the tests launch 2 Horovod ranks, or one process."""
    return 2 if kv_store == "horovod" else 1


def eval_settings(rec_prefix, kv_store):
    return Settings(data_train=rec_prefix + ".rec", data_val=rec_prefix + ".rec", num_classes=3,
                    image_shape="3,32,32", batch_size=4, dali_threads=1, kv_store=kv_store, dgxngpu=ranks(kv_store))


def pixel_net(seed):
    """A random linear classifier on the pixels. A random ResNet-50 predicts one class for all 21 images, so
    top-1 could not tell which images were counted; this one's predictions vary from image to image."""
    net = mx.gluon.nn.Dense(3, in_units=3 * 32 * 32)
    mx.random.seed(seed)
    net.initialize(mx.init.Normal(0.05))
    return net


def eval_worker(out, rec_prefix):
    """Broadcast: the real model, initialised differently on each rank and with rank-made BatchNorm running
    statistics, saved per rank after the broadcast. Eval: train.evaluate of pixel_net (also broadcast) on the
    real DALI val iterator."""
    s = eval_settings(rec_prefix, "horovod")
    d = dist.init(s)
    base_seed, _ = train.rank_seed(s, d)  # no --seed: every rank must still use the one rank 0 logs
    mx.random.seed(100 + d.rank)
    net = model.build_model(s)
    for p in net.collect_params().values():
        if p.grad_req == "null":  # running mean and variance: 0 and 1 on every rank unless we change them
            p.set_data(mx.nd.random.uniform(0.5, 1.5, p.shape) * (d.rank + 1))
    if d.rank == 0:
        net.save_parameters(f"{out}.resnet.before")
    d.broadcast_params(net.collect_params())
    net.save_parameters(f"{out}.resnet.rank{d.rank}")
    pixels = pixel_net(seed=101 + d.rank)
    d.broadcast_params(pixels.collect_params())
    pixels.save_parameters(f"{out}.pixels.rank{d.rank}")
    _, val = data.make_iters(s, d.rank, d.size, 1, mx.cpu())
    top1, top5, n = train.evaluate(pixels, val, d, 0)
    with open(f"{out}.rank{d.rank}.json", "w") as f:
        json.dump(dict(top1=top1, top5=top5, n=n, records=val.num_samples, base_seed=base_seed), f)
    mx.nd.waitall()


def train_worker(out, *flags):
    """`python -m rn50_mx.train FLAGS`, unchanged, except that each rank also saves its parameters after fit."""
    fit = train.fit

    def fit_and_save(s, d, net, *args):
        status = fit(s, d, net, *args)
        net.save_parameters(f"{out}.rank{d.rank}")
        return status

    train.fit = fit_and_save
    sys.argv = ["rn50_mx.train", *flags]
    run_cli(train.main, "rn50_mx.train")


# --- tests ----------------------------------------------------------------------------------------------------

def bn_stats_worker(out):
    """Each rank's ResNet-50 BatchNorm statistics after a training forward on its own images, saved before and
    after the average over ranks that a multi-rank run takes before each eval (train.one_model)."""
    s = Settings(kv_store="horovod", num_classes=3, image_shape="3,32,32", dgxngpu=2)
    d = dist.init(s)
    mx.random.seed(3)
    net = model.build_model(s)
    x = mx.nd.array(np.random.RandomState(d.rank).standard_normal((4, 3, 32, 32)))
    net.hybridize(static_alloc=True, static_shape=True)
    with mx.autograd.record():
        y = net(x)
    y.backward()
    mx.nd.waitall()  # MXNet's BatchNorm writes its running statistics in backward, unseen by a read's wait
    stats = model.running_stats(net)
    np.save(f"{out}.{d.rank}.before.npy", np.concatenate([a.asnumpy().ravel() for a in stats]))
    d.average_in_place(stats)
    np.save(f"{out}.{d.rank}.after.npy", np.concatenate([a.asnumpy().ravel() for a in stats]))


def test_bn_statistics_are_averaged_over_two_ranks(tmp_path):
    """Two Gloo ranks whose statistics differ end with their mean, every running mean and variance of the
    network (106 arrays); one process keeps its own."""
    run_to_end(2, [sys.executable, THIS, "bn_stats", str(tmp_path / "bn")], tmp_path / "out.txt")
    before = [np.load(tmp_path / f"bn.{r}.before.npy") for r in (0, 1)]
    after = [np.load(tmp_path / f"bn.{r}.after.npy") for r in (0, 1)]
    assert np.abs(before[0] - before[1]).max() > 1e-3
    np.testing.assert_allclose(after[0], (before[0] + before[1]) / 2, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(after[0], after[1])
    single = [mx.nd.array(before[0])]
    dist.Single().average_in_place(single)
    np.testing.assert_array_equal(single[0].asnumpy(), before[0])


def load(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


def test_one_process_without_a_launcher():
    assert isinstance(dist.init(Settings()), dist.Single)
    d = dist.init(Settings(kv_store="horovod"))  # no horovodrun around: Horovod runs as one rank
    assert (d.rank, d.local_rank, d.size) == (0, 0, 1)
    assert d.allreduce_sum(mx.nd.array([3], dtype="int32")).asnumpy().tolist() == [3]
    total = d.host_sum([3, True])
    assert total.asnumpy().tolist() == [3, 1] and total.context == dist.HOST and total.dtype == np.int32
    with pytest.raises(InputError, match="local rank 0 needs GPU 0, but 0 are visible"):
        dist.init(Settings(kv_store="horovod", device="gpu"))



def test_horovodrun_s_build_questions_get_horovod_s_answers_without_a_fork():
    """children.answer_build_questions: horovodrun asked whether Horovod was built with Gloo and with MPI in 3 forks a
    launch, the last importing MXNet (half a CPU-second); its answers now come from the MXNet extension's library
    loaded without MXNet's Python. They are Horovod's own checks' answers, on the MPI path (no --gloo: mpirun) as on
    Gloo's, and a launch forks no check (os.fork's audit events in horovodrun's process: 3 before). Without an MXNet
    extension (made unimportable, as Python documents it), horovodrun's own checks answer (None: no extension)."""
    # Horovod's own checks in a process of their own: their forks import MXNet, whose library must not be loaded
    # twice (the extension's RUNPATH may name another venv's copy: "_Integer is already registered")
    theirs = "from horovod.common import util\nprint(util.gloo_built(), util.mpi_built())\n"
    ours = ("from horovod.common import util\nfrom horovod.runner import launch\n"
            "from rn50_mx.children import answer_build_questions\nanswer_build_questions(launch)\n"
            "print(launch.gloo_built is util.gloo_built, launch.gloo_built(), launch.mpi_built())\n")
    told = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            for code in (theirs, ours, "import sys\nsys.modules['horovod.mxnet'] = None\n" + ours)]
    assert [t.stdout.split() for t in told] == [["True", "True"], ["False", "True", "True"],
                                                ["True", "None", "None"]], [t.stdout + t.stderr for t in told]
    counted = ("import atexit, sys\nforks = []\n"  # printed at exit, or before the exec into mpirun (the MPI path)
               "def count(event, args):\n"
               "    forks.extend(['fork'] if event == 'os.fork' else [])\n"
               "    if event == 'os.exec':\n"
               "        print('forks', len(forks), flush=True)\n"
               "sys.addaudithook(count)\natexit.register(lambda: print('forks', len(forks)))\n")
    for options in (["--gloo"], []):
        launch = children.horovodrun(2, *options)
        ran = subprocess.run([launch[0], "-c", counted + launch[2], *launch[3:], "echo", "a rank ran"],
                             capture_output=True, text=True, timeout=300, env={**os.environ, **PYTHONPATH})
        assert ran.returncode == 0 and ran.stdout.count("a rank ran") == 2, ran.stdout + ran.stderr
        assert [line for line in ran.stdout.splitlines() if line.startswith("forks")] == ["forks 0"], ran.stdout


def test_only_rank_0_of_a_fresh_run_draws_the_initial_weights():
    """The broadcast gives the other ranks rank 0's weights (their own zeroed first) and a resumed run's come from its
    checkpoint: nothing else draws them (each draw is 0.8 s of a core). That a 2-rank run's rank 1 then trains rank 0's
    weights, its evals judging the model rank 0 saves, test_checkpoint's
    test_a_multi_rank_run_has_one_model_the_one_its_evals_judged shows."""
    fresh, resumed = SimpleNamespace(resume=None), SimpleNamespace(resume="/ckpt/step-6")
    assert train.draws_weights(dist.Single(), None) and train.draws_weights(dist.Single(), fresh)
    assert not train.draws_weights(dist.Single(), resumed)
    assert not train.draws_weights(SimpleNamespace(rank=1), None)
    assert not train.draws_weights(SimpleNamespace(rank=1), fresh)

@pytest.mark.slow
def test_two_ranks_on_half_batches_make_the_one_process_update(tmp_path):
    run_to_end(2, [sys.executable, THIS, "equivalence", str(tmp_path / "two"), "horovod"], tmp_path / "out.txt")
    equivalence_worker(str(tmp_path / "one"), "device")
    for name, _ in OPTIMIZER_GROUPS:
        init, one, two = (load(tmp_path / f) for f in (f"one.{name}.init", f"one.{name}", f"two.{name}"))
        assert load(tmp_path / f"two.{name}.init").keys() == init.keys()
        for key in init:
            np.testing.assert_array_equal(load(tmp_path / f"two.{name}.init")[key], init[key])  # rank 0's seed
            assert np.abs(one[key] - init[key]).max() > 1e-3, (name, key)  # the update is not negligible
            np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6, err_msg=f"{name} {key}")


@pytest.mark.slow
def test_eval_counts_each_val_image_once_over_two_ranks(small_rec, tmp_path):
    """21 val images (odd: shards of 10 and 11, both padded to 3 batches of 4); also the parameter broadcast, which
    must not use Horovod's broadcast op (0.28.1 reads the op's name after its background thread may have completed
    and freed it: the old code crashed a rank at start-up once in about 120 launches). Horovod's own timeline lists
    the ops each rank ran."""
    out, timeline = str(tmp_path / "params"), tmp_path / "timeline.json"
    run_to_end(2, [sys.executable, THIS, "eval", out, small_rec], tmp_path / "out.txt",
               env={**os.environ, "HOROVOD_TIMELINE": str(timeline)})
    ops = set(re.findall(r'"name": "([A-Z_]+)"', timeline.read_text()))
    assert "ALLREDUCE" in ops and not any("BROADCAST" in op for op in ops), ops
    rank0, rank1, before = (load(f"{out}.resnet.{name}") for name in ("rank0", "rank1", "before"))
    assert any(k.endswith("running_mean") for k in rank0) and any(k.endswith("running_var") for k in rank0)
    for key in rank0:  # weights and BatchNorm running statistics alike came from rank 0, unchanged
        np.testing.assert_array_equal(rank0[key], before[key], err_msg=key)
        np.testing.assert_array_equal(rank1[key], rank0[key], err_msg=key)
    results = [json.load(open(f"{out}.rank{r}.json")) for r in (0, 1)]
    assert [r["records"] for r in results] == [21, 21] and results[0] == results[1]  # base seed included

    s = eval_settings(small_rec, "device")
    net = pixel_net(seed=0)
    net.load_parameters(out + ".pixels.rank0")
    _, val = data.make_iters(s, 0, 1, 1, mx.cpu())
    predicted = {int(k) for batch in val for k in net(batch.data[0]).argmax(axis=1).asnumpy()[:4 - batch.pad]}
    assert predicted == {0, 1, 2}  # so top-1 depends on which images are counted
    top1, top5, n = train.evaluate(net, val, dist.Single(), 0)
    assert n == 21 == results[0]["n"]
    assert (results[0]["top1"], results[0]["top5"]) == (top1, top5)


@pytest.mark.slow
def test_two_process_demo_run(small_rec, tmp_path):
    """The demo's configuration on 2 processes: the ranks end with the same weights, only rank 0 reports (every
    rank logs init_start), every val image counts once, and the log passes the compliance checker except for
    the accuracy target, which 3 steps cannot reach."""
    out = str(tmp_path / "params")
    text = run_to_end(2, [sys.executable, THIS, "train", out, *demo_flags(small_rec, str(tmp_path))],
                      tmp_path / "out.txt")
    rank0, rank1 = load(out + ".rank0"), load(out + ".rank1")
    trainable = [k for k in rank0 if not k.endswith(("running_mean", "running_var"))]
    assert len(trainable) == 53 and rank0.keys() == rank1.keys()  # every one of the 14-layer network (ResNet-50: 161)
    for key in trainable:  # BatchNorm running statistics are each rank's own, as in the reference (bn_group 1)
        np.testing.assert_array_equal(rank1[key], rank0[key], err_msg=key)

    ours, theirs = rank_lines(text, 0), rank_lines(text, 1)
    assert len(theirs) == 1 and '"key": "init_start"' in theirs[0], theirs
    assert sum(" step " in line for line in ours) == 3, ours  # --disp-batches 1: a progress line a step
    assert any(line.startswith("epoch 1: ") and line.endswith("(21 images)") for line in ours), ours

    log = str(tmp_path / "mlperf.log")
    run = timing.read_run(log, "1.0.0")
    assert run.batch_size == 8 and run.status == "aborted" and run.seed == 7 and len(run.evals) == 1
    assert timing.check_compliance(log, "1.0.0") == CHECKER_ON_A_SHORT_RUN


def ranks_and_launcher(proc):
    """{rank: psutil.Process of its python} and every process under the launcher, once both ranks run."""
    procs = psutil.Process(proc.pid).children(recursive=True)
    ranks = {}
    for p in procs:
        try:
            if "rn50_mx.train" in p.cmdline() and os.path.basename(p.cmdline()[0]).startswith("python"):
                ranks[int(p.environ()["HOROVOD_RANK"])] = p
        except (psutil.NoSuchProcess, KeyError):
            pass
    return ranks, procs


def start_long_run(small_rec, tmp_path, **popen):
    """A 50-epoch 2-process run; returns (launcher, ranks, its processes, output file) once rank 0 is training."""
    out_file = tmp_path / "out.txt"
    flags = demo_flags(small_rec, str(tmp_path), num_epochs=50, eval_period=50, eval_offset=49)
    proc = launch(2, [sys.executable, "-m", "rn50_mx.train", *flags], out_file, **popen)
    try:
        deadline = time.time() + 120
        while "epoch 2 step 1/3" not in open(out_file).read():  # rank 0 is mid-epoch; so is rank 1 (same steps)
            assert proc.poll() is None and time.time() < deadline, tails(open(out_file).read())
            time.sleep(0.2)
        ranks, procs = ranks_and_launcher(proc)
        assert sorted(ranks) == [0, 1], procs
    except BaseException:
        stop_tree(proc)
        raise
    return proc, ranks, procs, out_file


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_naming_it(small_rec, tmp_path):
    proc, ranks, procs, out_file = start_long_run(small_rec, tmp_path)
    ranks[1].send_signal(signal.SIGKILL)
    killed = time.time()
    try:
        proc.wait(timeout=60)
        text = open(out_file).read()
        assert proc.returncode != 0 and time.time() - killed < 60
        assert "Process 1 exit with status code 137" in text, tails(text)  # and rank 0 was stopped:
        assert_all_end(procs, timeout=10)
    finally:
        stop_tree(proc, procs)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "Ctrl-C in its terminal"])
def test_stopping_the_launcher_stops_every_rank(small_rec, tmp_path, how):
    proc, ranks, procs, out_file = start_long_run(small_rec, tmp_path, start_new_session=True)
    if how.startswith("SIGTERM"):
        proc.send_signal(signal.SIGTERM)
    else:  # the terminal signals its foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)  # the whole run takes over a minute here
        assert_all_end(procs, timeout=10)
        # The run did not complete, and the log says so to run_and_time.sh, which reads a trial's outcome from it:
        # horovodrun's own status is not reliable here (horovod 0.28.1 safe_shell_exec: the thread that stops a
        # rank can reap its shell with psutil's wait before subprocess's wait does, which then reports 0).
        log = open(tmp_path / "mlperf.log").read()
        assert '"key": "run_start"' in log and '"key": "run_stop"' not in log
    finally:
        stop_tree(proc, procs)


WORKERS = {"equivalence": equivalence_worker, "eval": eval_worker, "train": train_worker,
           "bn_stats": bn_stats_worker}

if __name__ == "__main__":
    WORKERS[sys.argv[1]](*sys.argv[2:])


def test_a_rank_that_sees_exactly_one_gpu_uses_it():
    """Slurm giving each task its own GPU (CUDA_VISIBLE_DEVICES holds one): local rank 3 uses the GPU it sees; on a
    node where every rank sees every GPU, rank 3 uses GPU 3; too few GPUs for the ranks is one line."""
    assert [dist.gpu_index(rank, 1) for rank in range(4)] == [0, 0, 0, 0]
    assert [dist.gpu_index(rank, 8) for rank in range(4)] == [0, 1, 2, 3]
    with pytest.raises(InputError, match="local rank 3 needs GPU 3, but 2 are visible"):
        dist.gpu_index(3, 2)
