"""Tiny real runs of `python -m rn50_mx.train` and `python -m rn50_mx.evaluate` (1 process, or 2 Gloo ranks under
horovodrun), each rank's model on cpu(1 + local rank) with mixed contexts refused (tests.support.devices): the
checkpoint, open-lever and progressive-resizing tests start, stop, resume and compare them. 24 images of 32x32 in
batches of 4: STEPS steps an epoch."""
import functools
import os
import re
import signal
import subprocess
import sys

import mxnet as mx

from rn50_mx import config, model
from rn50_mx.rehearse.stages import same_bits
from tests.support import stuck
from tests.support.procs import clean_environ, gloo_ranks
from tests.support.settings import SHRUNK_LAYERS

STEPS = 6  # per epoch: 24 images, batch 4 (2 ranks: batch 2 each)
FLAGS = dict(num_classes=3, image_shape="3,32,32", num_layers=SHRUNK_LAYERS, batch_size=4, num_examples=24,
             num_epochs=2, warmup_epochs=1, lr=0.5, eval_offset=0, eval_period=1, min_random_area=0.3, dali_threads=1,
             seed=7, disp_batches=1, accuracy_threshold=1.0)
EPOCH_LINE = re.compile(r"^(?:\[0\]<stdout>:)?epoch (\d+): .*?(loss .*)$", re.M)  # without img/s and data wait


def argv(recs, ranks, **changes):
    flags = dict(FLAGS, data_train=recs[0], data_val=recs[1])
    if ranks == 2:
        flags.update(batch_size=FLAGS["batch_size"] // 2, kv_store="horovod", dgxngpu=2)
    flags.update(changes)
    return [f"{config.flag_name(k)}={v}" for k, v in flags.items()]


def on_rank_devices(module, *args):
    """`python -m module ARGS` with each rank's model on cpu(1 + local rank) and mixed contexts refused
    (--standin devices): a checkpoint written on one rank's device and resumed on another's fails here as on an
    8-GPU node (GPU review 3, F1 and F2)."""
    return [sys.executable, "-m", module, *args, "--standin=devices"]


def start(recs, ranks, out, held_at=None, **changes):
    """The training run in its own session (1 process, or horovodrun with 2), its output to `out`; with `held_at`,
    rank 0 waits at that train batch (1-based) until signal_held has signalled it."""
    command = on_rank_devices("rn50_mx.train", *argv(recs, ranks, **changes))
    if ranks == 2:
        command = [*gloo_ranks(2), *command]
    env = clean_environ()
    if held_at:
        os.mkfifo(gate(out))
        env.update(stuck.environ("hold", gate(out), held_at))
    with open(out, "w") as f:
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def gate(out):
    return f"{out}.gate"


def signal_held(proc, out, signum, rank=None):
    """`signum` to the run (to its rank `rank` under horovodrun) while rank 0 of the run started with `held_at` waits
    at that batch; then the run goes on. The signal so lands between two known steps on any machine."""
    stuck.signal_held(proc, gate(out), signum, rank)


def finish(proc, out, code=0, timeout=300):
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = open(out).read()
    assert proc.returncode == code, text[-3000:]
    return text


def run(recs, ranks, out, code=0, **changes):
    return finish(start(recs, ranks, out, **changes), out, code)


def params(prefix):
    return mx.nd.load(prefix + "-0000.params")


@functools.lru_cache(maxsize=1)
def network_arrays():
    """The names of every array (parameters and BatchNorm statistics) of the network FLAGS trains."""
    s = config.Settings(**{name: FLAGS[name] for name in ("num_classes", "image_shape", "num_layers")})
    return list(model.build_model(s, drawn=False).collect_params())


def assert_same_params(prefix, reference):
    ours, theirs = params(prefix), params(reference)
    assert ours.keys() == theirs.keys() and len(ours) == len(network_arrays())
    for name in ours:
        assert same_bits(ours[name].asnumpy(), theirs[name].asnumpy()), name


def epoch_lines(text):
    """{epoch: 'loss ..., top-1 ..., top-5 ... (N images)'} of rank 0's output."""
    return {int(e): rest for e, rest in EPOCH_LINE.findall(text)}


def evaluate(recs, ranks, *extra, **changes):
    command = on_rank_devices("rn50_mx.evaluate", *extra, *argv(recs, ranks, **changes))
    if ranks == 2:
        command = [*gloo_ranks(2), *command]
    return subprocess.run(command, env=clean_environ(), capture_output=True, text=True, timeout=240)
