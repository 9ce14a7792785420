"""Whether the installed MXNet is the build the stand-ins model (rn50_mx/standin: NVIDIA's MXNet as its public fork
shows it, and the assumptions docs/rehearsal.md lists): on an NGC image, in a few rows and a minute, where a
rehearsal was wrong about it, each naming the assumption and the setting that avoids it. On stock MXNet one line.

Each check returns its detail (report.attempt's contract) or raises CheckFailed; Skipped where it does not apply."""
from .. import config, model, standin
from ..standin import ngc, python_layer
from .report import CheckFailed, Row, Skipped, attempt


def is_nvidia_build():
    """Whether the registry has any of NVIDIA's fused operators (stood in for or real)."""
    return model.fused_batchnorm_available() or model.normconv_available()


def build_rows(s, ctx):
    """The rows of this module's checks, or the one line that says this MXNet is not NVIDIA's build."""
    import mxnet as mx

    if not is_nvidia_build():
        return [Row("NVIDIA build", None, f"not NVIDIA's build: MXNet {mx.__version__} has neither BatchNorm(act_type) "
                    "nor NVIDIA's fused operators, so the stand-ins' picture of that build is not checked here")]
    rows = []
    attempt(rows, "gluon layers", gluon_layers)
    attempt(rows, "fused operators", fused_operators, s.normconv_wiring)
    attempt(rows, "None keywords", none_keywords)
    attempt(rows, "kernels on this GPU", kernels_here, s, ctx)
    return rows


def gluon_layers():
    """NVIDIA's Gluon: BatchNorm's `_kwargs` hold act_type None, bn_group 1 and xbuf_ptr 0; Conv2D's hold the cuDNN
    algorithm choices; Dense passes cublas_algo_fwd_prec (standin/python_layer.py). A difference is information:
    the layers and their operators come from this one build, and the fused blocks set act_type themselves
    (model.BatchNormReLU.fused_kwargs), so the network runs either way."""
    from mxnet.gluon import nn

    batchnorm = nn.BatchNorm()._kwargs
    wanted = python_layer.BATCHNORM_KEYS
    differ = {k: batchnorm.get(k, "absent") for k in wanted if batchnorm.get(k, "absent") != wanted[k]}
    conv = set(python_layer.CONV_KEYS) - set(nn.Conv2D(8, 3)._kwargs)
    dense = not hasattr(nn.Dense(8), "cublas_algo_fwd_prec")
    if differ or conv or dense:
        raise Skipped(f"Gluon's BatchNorm _kwargs {differ or 'as assumed'}; Conv2D's lack {sorted(conv)}"
                      f"{', Dense has no cublas_algo_fwd_prec' if dense else ''}, where the stand-in's Gluon assumed "
                      f"{wanted}, the cuDNN choices and cublas_algo_fwd_prec (sneaxiy/NVIDIA-MxNet basic_layers.py:"
                      "344-348): the network hands the operators what this Gluon holds; nothing to set")
    return f"BatchNorm's _kwargs {wanted}, Conv2D's cuDNN choices and Dense's cublas_algo_fwd_prec, as assumed"


def passed_parameters():
    """{operator: the parameters the network hands it} for the fused BatchNorm and each NormConv wiring: what this
    build's registry must take. BatchNorm and BatchNormAddRelu are handed Gluon's BatchNorm `_kwargs`, act_type set
    or taken out (model.BatchNormReLU.fused_kwargs); the NormConv operators model.NORMCONV_PARAMETERS' names."""
    from mxnet.gluon import nn

    kwargs = set(nn.BatchNorm()._kwargs)
    return {"fused BatchNorm": {"BatchNorm": kwargs | {"act_type"}, "BatchNormAddRelu": kwargs - {"act_type"}},
            **{wiring: {op: set(names) for op, names in ops.items()}
               for wiring, ops in model.NORMCONV_PARAMETERS.items()}}


def fused_operators(wiring=config.FIELDS["normconv_wiring"].default):
    """Each of NVIDIA's operators takes, in this build's registry, every parameter the network hands it (a missing
    one fails, naming the setting that avoids it: for the config's NormConv `wiring` the other wiring where that one
    has all of its own, else RN50_NORMCONV=0); the multi-tensor LARS kernels are there under one of their two names
    (optim.momentum_kernels). Names of the stand-ins' picture the network never passes (the arrays the NDArray
    functions declare, parameters left at their defaults), and the other wiring's, are information."""
    present = set(standin.operators())
    registry = {op: set(standin.operator_arguments(op).names) for op in ("BatchNorm",) + ngc.OPERATORS
                if op in present}
    lacking = {}  # {feature: {op: missing names}}
    for feature, ops in passed_parameters().items():
        lacking[feature] = {op: sorted(names - registry[op]) for op, names in ops.items()
                            if op in registry and names - registry[op]}
    picture = {op: sorted(set(ngc.batchnorm_arguments() if op == "BatchNorm" else ngc.operator_arguments(op))
                          - names) for op, names in registry.items()}
    kernels = [name for name in ("preloaded_multi_mp_sgd_mom_update", "lars_multi_mp_sgd_mom_update")
               if name in present]
    failed = []
    if lacking["fused BatchNorm"]:
        failed.append(f"{words(lacking['fused BatchNorm'])}, which the network passes: RN50_FUSED_BN=0 avoids it")
    if lacking[wiring]:
        other = next(w for w in model.WIRINGS if w != wiring)
        avoid = f"RN50_NORMCONV_WIRING={other} or RN50_NORMCONV=0" if not lacking[other] else "RN50_NORMCONV=0"
        failed.append(f"{words(lacking[wiring])}, which the {wiring} wiring passes: {avoid} avoids it")
    if not kernels:
        failed.append("no multi-tensor LARS kernel (preloaded_multi_* nor lars_multi_*): OPTIMIZER=sgd avoids LARS")
    if failed:
        raise CheckFailed("; ".join(failed))
    family = kernels[0].replace("_mp_sgd_mom_update", "_*")
    detail = f"{', '.join(registry)} take every parameter the network passes; LARS kernels {family}"
    other = {w: lacking[w] for w in model.WIRINGS if lacking[w]}  # the config's own is complete here
    unused = {op: names for op, names in picture.items() if names}
    if other or unused:
        raise Skipped(detail + "".join(f"; {words(ops)}, which the {w} wiring (not this config's) passes"
                                       for w, ops in other.items())
                      + (f"; {words(unused)}, names the stand-in gives them that the network never passes: nothing "
                         "to set" if unused else ""))
    return detail


def words(missing):
    """{op: names} as 'Op lacks [names]; ...'."""
    return "; ".join(f"{op} lacks {names}" for op, names in missing.items())


def none_keywords():
    """MXNet's generated functions pass a None keyword on to the operator's parser as "None", which refuses a key the
    operator lacks (standin.ngc.params_of assumes so): Activation(bn_group=None), and BatchNormAddRelu(act_type=None)
    where the build has it. A build that dropped them would only be laxer than the rehearsal: information."""
    import mxnet as mx

    data = mx.sym.var("data")
    calls = {"Activation(bn_group=None)": lambda: mx.sym.Activation(data, act_type="relu", bn_group=None)}
    if "BatchNormAddRelu" in standin.operators():
        calls["BatchNormAddRelu(act_type=None)"] = lambda: mx.sym.BatchNormAddRelu(
            data=data, addend=mx.sym.var("addend"), axis=3, fix_gamma=False, act_type=None)
    accepted = []
    for name, call in calls.items():
        try:
            call()
            accepted.append(name)
        except mx.base.MXNetError:
            pass
    if accepted:
        raise Skipped(f"{', '.join(accepted)} accepted: this build drops a None keyword, the stand-in passes it on as "
                      "'None' and refuses it: the rehearsal was stricter, nothing to set")
    return f"{' and '.join(calls)} refused: a None keyword reaches the parser as 'None', as assumed"


def kernels_here(s, ctx):
    """NVIDIA's fused kernels of this build run on this GPU, probed as the run probes them (model.probe: the
    network's own blocks at its smallest maps and the configured batch, float16 NHWC): the fused BatchNorm, and
    NormConv in each wiring, saying which runs here. A refusal of what the config uses fails, naming the setting
    that avoids it (the other wiring where that one runs); one of what it does not use, a GPU on which NormConv runs
    though the stand-in assumes it refuses (ngc.NORMCONV_SM: the image is laxer than the rehearsal), or a fused
    BatchNorm that takes float32 (laxer than the model's float16-only gate), are information."""
    import mxnet as mx

    capability = compute_capability(ctx)
    if capability is None:
        raise Skipped("no GPU: the kernels' compute capability is a GPU's")
    sm = capability[0] * 10 + capability[1]
    assumed = sm in ngc.NORMCONV_SM
    batch, hw = s.batch_size, s.image_chw[1:]
    probes = {}  # {what: None when it ran, else MXNet's error}
    if model.fused_batchnorm_available():
        probes["fused BatchNorm"] = model.probe(model.Layout("NHWC", fused=True), batch, hw, ctx)
    if model.normconv_available():
        for wiring in model.WIRINGS:
            probes[wiring] = model.probe(model.Layout("NHWC", normconv_batch=batch, wiring=wiring), batch, hw, ctx)
    where = f"sm_{sm}, which the stand-in assumes NormConv {'takes' if assumed else 'refuses'} (ngc.NORMCONV_SM)"
    said = "; ".join(f"{'NormConv ' * (name in model.WIRINGS)}{name} "
                     f"{'ran' if refused is None else f'refused ({refused[1]})'}" for name, refused in probes.items())
    detail = f"{said}, at batch {batch} on {hw[0]}x{hw[1]} images in float16 NHWC on {where}"
    ran = [w for w in model.WIRINGS if w in probes and probes[w] is None]
    if probes.get("fused BatchNorm") and s.fused_bn:
        raise CheckFailed(f"{detail}: set RN50_FUSED_BN=0")
    if probes.get(s.normconv_wiring) and s.normconv:
        raise CheckFailed(f"{detail}: set " + (f"RN50_NORMCONV_WIRING={ran[0]}" if ran else "RN50_NORMCONV=0"))
    if probes.get("fused BatchNorm") or probes.get(s.normconv_wiring):
        raise Skipped(f"{detail} (this config has them off)")
    if ran and not assumed:
        raise Skipped(f"{detail}: NormConv runs where the rehearsal refuses it (RN50_STANDIN_SM={sm} rehearses it "
                      "refused); nothing to set")
    if probes.get("fused BatchNorm", True) is None and not float32_refused(mx, ctx):
        detail += "; fused BatchNorm ran in float32 too: the model's float16-only gate is stricter"
    return detail + (f"; this config's wiring: {s.normconv_wiring}" if ran and s.normconv else "")


def float32_refused(mx, ctx):
    """Whether BatchNorm(act_type='relu') refuses float32 NHWC data (batch_norm.cu:1110-1114 in the fork)."""
    x = mx.nd.ones((2, 4, 4, 32), ctx=ctx)
    c = [mx.nd.ones((32,), ctx=ctx) for _ in range(4)]
    try:
        with mx.autograd.train_mode():
            mx.nd.BatchNorm(x, *c, axis=3, act_type="relu", fix_gamma=False).wait_to_read()
    except mx.base.MXNetError:
        return True
    return False


def compute_capability(ctx):
    """(major, minor) of the GPU of `ctx`: the stand-in's, or the CUDA driver's; None on a CPU."""
    from . import kernels

    stood_in = standin.compute_capability()
    if stood_in is not None:
        return stood_in
    if ctx.device_type != "gpu":
        return None
    gpus = kernels.driver_gpus()
    return gpus[ctx.device_id][1] if ctx.device_id < len(gpus) else None
