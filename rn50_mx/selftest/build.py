"""Whether the installed MXNet is the build the stand-ins model (rn50_mx/standin: NVIDIA's MXNet as its public fork
shows it, and the assumptions docs/rehearsal.md lists): on an NGC image, in a few rows and a minute, where a
rehearsal was wrong about it, each naming the assumption and the setting that avoids it. On stock MXNet one line.

Each check returns its detail (report.attempt's contract) or raises CheckFailed; Skipped where it does not apply."""
from .. import model, standin
from ..errors import InputError
from ..standin import ngc, python_layer
from .report import CheckFailed, Row, Skipped, attempt

SETTING = {"BatchNorm": "RN50_FUSED_BN=0", "BatchNormAddRelu": "RN50_FUSED_BN=0"}  # the others: RN50_NORMCONV=0


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
    attempt(rows, "fused operators", fused_operators)
    attempt(rows, "None keywords", none_keywords)
    attempt(rows, "kernels on this GPU", kernels_here, s, ctx)
    return rows


def gluon_layers():
    """NVIDIA's Gluon: BatchNorm's `_kwargs` hold act_type None, bn_group 1 and xbuf_ptr 0; Conv2D's hold the cuDNN
    algorithm choices; Dense passes cublas_algo_fwd_prec (standin/python_layer.py). A BatchNorm difference fails:
    the fused blocks hand `_kwargs` to NVIDIA's kernels; the others are information, as the layers and their
    operators come from one build."""
    from mxnet.gluon import nn

    batchnorm = nn.BatchNorm()._kwargs
    wanted = python_layer.BATCHNORM_KEYS
    differ = {k: batchnorm.get(k, "absent") for k in wanted if batchnorm.get(k, "absent") != wanted[k]}
    if differ:
        raise CheckFailed(f"Gluon BatchNorm's _kwargs have {differ}, the stand-in assumed {wanted} "
                          "(sneaxiy/NVIDIA-MxNet basic_layers.py:344-348): the fused blocks pass them on; "
                          f"{SETTING['BatchNorm']} avoids them")
    conv = set(python_layer.CONV_KEYS) - set(nn.Conv2D(8, 3)._kwargs)
    dense = not hasattr(nn.Dense(8), "cublas_algo_fwd_prec")
    if conv or dense:
        raise Skipped(f"BatchNorm's _kwargs as assumed {wanted}; Conv2D's lack {sorted(conv)}"
                      f"{', Dense has no cublas_algo_fwd_prec' if dense else ''}: the stand-in's Gluon gives them, "
                      "nothing to set (the layers and their operators come from this one build)")
    return f"BatchNorm's _kwargs {wanted}, Conv2D's cuDNN choices and Dense's cublas_algo_fwd_prec, as assumed"


def fused_operators():
    """Each operator the stand-ins stand in for takes, in this build's registry, every argument the stand-in gives
    it (standin.ngc: the arrays and the parameters our network passes); BatchNormAddRelu takes every key Gluon's
    BatchNorm holds but act_type (model.BatchNormReLU.fused_kwargs hands it the rest); the multi-tensor LARS kernels
    are there under one of their two names (optim.momentum_kernels)."""
    from mxnet.gluon import nn

    present = set(standin.operators())
    missing = {}
    for op in ("BatchNorm",) + ngc.OPERATORS:
        if op not in present:
            continue
        picture = ngc.batchnorm_arguments() if op == "BatchNorm" else ngc.operator_arguments(op)
        lacks = sorted(set(picture) - set(standin.operator_arguments(op).names))
        if lacks:
            missing[op] = lacks
    if "BatchNormAddRelu" in present:
        handed = set(nn.BatchNorm()._kwargs) - {"act_type"}
        lacks = sorted(handed - set(standin.operator_arguments("BatchNormAddRelu").names))
        if lacks:
            missing.setdefault("BatchNormAddRelu", []).extend(lacks)
    if missing:
        raise CheckFailed("; ".join(f"{op} lacks {lacks}, which the stand-in gives it: "
                                    f"{SETTING.get(op, 'RN50_NORMCONV=0')} avoids it" for op, lacks in missing.items()))
    kernels = [name for name in ("preloaded_multi_mp_sgd_mom_update", "lars_multi_mp_sgd_mom_update")
               if name in present]
    if not kernels:
        raise CheckFailed("no multi-tensor LARS kernel (preloaded_multi_* nor lars_multi_*): OPTIMIZER=sgd avoids "
                          "LARS")
    ops = [op for op in ("BatchNorm",) + ngc.OPERATORS if op in present]
    family = kernels[0].replace("_mp_sgd_mom_update", "_*")
    return f"{', '.join(ops)} take every argument the stand-ins give them; LARS kernels {family}"


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
    """NVIDIA's fused kernels of this build run on this GPU in float16 NHWC (model.check_fused_kernels, the
    run's own check), against the stand-in's assumption for its compute capability (ngc.NORMCONV_SM); fused
    BatchNorm refuses float32, as the model's float16-only gate assumes (the build taking it is only laxer)."""
    import mxnet as mx

    capability = compute_capability(ctx)
    if capability is None:
        raise Skipped("no GPU: the kernels' compute capability is a GPU's")
    sm = capability[0] * 10 + capability[1]
    assumed = sm in ngc.NORMCONV_SM
    fused, normconv = model.fused_batchnorm_available(), model.normconv_available()
    layout = model.Layout("NHWC", fused=fused, normconv_batch=2 if normconv else 0)
    where = f"sm_{sm}, which the stand-in assumes they {'take' if assumed else 'refuse'} (ngc.NORMCONV_SM)"
    try:
        model.check_fused_kernels(layout, ctx)
    except InputError as err:
        used = s.normconv if "NormConv" in str(err) else s.fused_bn
        detail = f"{err}; {where}"
        if used:
            raise CheckFailed(detail) from None
        raise Skipped(detail + " (this config has them off)") from None
    if normconv and not assumed:
        raise CheckFailed(f"the NormConv kernels ran on {where}: the rehearsal refused what runs here "
                          f"(RN50_STANDIN_SM={sm} rehearses them refused; nothing to set for training)")
    ran = " and ".join(name for name, on in (("fused BatchNorm", fused), ("NormConv", normconv)) if on)
    detail = f"{ran} ran in float16 NHWC on sm_{sm}" + (", as NORMCONV_SM assumes" if normconv else "")
    if fused and not float32_refused(mx, ctx):
        detail += "; fused BatchNorm ran in float32 too: the model's float16-only gate is stricter"
    return detail


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
