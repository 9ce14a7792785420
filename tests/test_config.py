"""Settings at every entry point: a bad setting stops run_and_time.sh, train and run_with_docker.sh with one line
naming the variable; the image's and DALI's own variables pass; every config sources cleanly and validates (GPU
configs too: validation needs no GPU); an export after sourcing overrides the config; train's flags and
environment alike."""
import glob
import os
import re
import sys

import pytest

from tests.support.bfloat16 import CPU_SH_SAYS
from tests.support.procs import (ROOT, assert_one_line_naming, clean_environ, config_environ, run, run_train,
                                 sourced)


SYSTEMS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "config", "*.sh"))
                 if not p.endswith("_common.sh"))
GPU_SYSTEMS = [system for system in SYSTEMS if not system.startswith("CPU")]  # not CPU.sh, nor CPU configs on it


def settings_table(text):
    """The `--check` listing as {flag: (value, origin)}."""
    rows = (line.split() for line in text.splitlines() if line.startswith("--"))
    return {row[0]: (row[1] if len(row) == 3 else "", row[-1]) for row in rows}


BAD = [("BATCHSIZE", "abc"), ("LR", "-1"), ("DALI_THREAD", "4"), ("RN50_FOO", "1"), ("BN_GROUP", "2")]
# What NGC framework images export (DALI_VERSION, DALI_BUILD; newer ones DALI_URL_SUFFIX) and variables DALI itself
# reads: not ours, so they pass (the old check refused every unknown DALI_ name, and with it the NGC image).
FOREIGN_DALI = {"DALI_VERSION": "1.18.0", "DALI_BUILD": "6294", "DALI_URL_SUFFIX": "110", "DALI_AFFINITY_MASK": "0,1",
                "DALI_USE_VMM": "1"}


@pytest.mark.parametrize("name,value", BAD)
def test_bad_setting_stops_run_and_time_before_training(tmp_path, name, value):
    result = sourced("CPU", "./run_and_time.sh", {name: value, "DATADIR": str(tmp_path)})
    assert_one_line_naming(result, name)
    assert result.stdout.startswith("STARTING TIMING RUN AT ")


@pytest.mark.parametrize("name,value", BAD)
def test_bad_setting_stops_train(name, value):
    assert_one_line_naming(sourced("CPU", "python -m rn50_mx.train", {name: value}), name)


SMALL = ["--data-train={rec}.rec", "--data-val={rec}.rec", "--batch-size=4", "--num-classes=3"]


@pytest.mark.parametrize("module, argv, code, says", [
    ("rn50_mx.train", ["--wd=-inf"], 2, "--wd=-inf"),
    ("rn50_mx.train", ["--help"], 0, "--data-train"),
    ("rn50_mx.train", ["--data-train={tmp}/missing.rec", "--num-classes=3"], 2, "missing.rec"),
    ("rn50_mx.check", ["--batch-size=abc"], 2, "--batch-size"),
    ("rn50_mx.check", ["--env-names"], 0, "DALI_THREADS"),
    ("rn50_mx.check", SMALL, 0, "data: found "),
    ("rn50_mx.search", ["--results={tmp}/res", "--out={tmp}/cfg", "--storage=sqlite:///{tmp}/db", *SMALL], 2,
     "cannot open the study"),  # a folder where the database would be: refused after the data check
])
def test_tools_answer_before_mxnet_and_dali_load(module, argv, code, says, small_rec, tmp_path):
    """What needs no arithmetic ends before MXNet and DALI load (2 s of a CPU each time): a bad setting, train's
    --help and a data file it cannot find, and --env-names (train and check resolve settings first), the whole check
    of settings and data files (the launchers run it before every trial: it reads the .idx in plain Python,
    rn50_mx/rec_index.py), and a search refused after its data check."""
    (tmp_path / "db").mkdir()
    argv = [arg.format(rec=small_rec, tmp=tmp_path) for arg in argv]
    script = (f"import runpy, sys\nsys.argv = [{module!r}, *{argv!r}]\ntry:\n"
              "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
              "except SystemExit as end:\n"
              "    print('exit', end.code, 'loaded', {'mxnet', 'nvidia.dali'} & set(sys.modules), file=sys.stderr)\n")
    result = run([sys.executable, "-c", script], env=clean_environ())
    assert result.stderr.strip().splitlines()[-1] == f"exit {code} loaded set()", result.stdout + result.stderr
    assert says in result.stdout + result.stderr


def test_mxnet_loads_without_scipy_and_scipy_still_loads_for_the_rest():
    """rn50_mx/__init__.py hides scipy.stats and scipy.sparse from MXNet's import (0.45 CPU-seconds of every process
    that loads MXNet), and from nothing else: MXNet falls back as without scipy, and the RCP checker's scipy.stats and
    the devkit reader's scipy.io load afterwards as usual, a sparse matrix's scipy.sparse too."""
    script = ("import sys, rn50_mx, mxnet\n"
              "print(sorted({'scipy.stats', 'scipy.sparse'} & set(sys.modules)), mxnet.ndarray.sparse.spsp,"
              " mxnet.contrib.quantization.stats)\n"
              "import scipy.io, scipy.sparse\n"
              "from mlperf_logging.rcp_checker import rcp_checker\n"
              "print(rcp_checker.scipy.stats.norm.cdf(0.0), scipy.sparse.eye(3).nnz, 'scipy.io' in sys.modules)\n")
    result = run([sys.executable, "-c", script], env=clean_environ())
    assert result.returncode == 0 and result.stdout.splitlines() == ["[] None None", "0.5 3 True"], result


MALLINFO = ("import ctypes\n"
            "class Info(ctypes.Structure):\n"
            "    _fields_ = [(name, ctypes.c_size_t) for name in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd',"
            " 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
            "libc = ctypes.CDLL(None)\n"
            "libc.mallinfo2.restype, libc.malloc.restype, libc.free.argtypes = Info, ctypes.c_void_p, [ctypes.c_void_p]\n"
            "before = libc.mallinfo2()\n"
            "buffer = libc.malloc(16 << 20)\n"
            "mapped = libc.mallinfo2().hblks - before.hblks\n"
            "libc.free(buffer)\n"
            "print(mapped, libc.mallinfo2().fordblks - before.fordblks >= 16 << 20)\n")


def test_a_freed_16_mib_buffer_stays_in_the_heap_for_the_next_array():
    """rn50_mx/__init__.py fixes glibc's mmap and trim thresholds at 32 and 64 MiB (MXNet's CPU arrays are each a
    malloc and a free): a 16 MiB buffer comes from the heap, not a mmap of its own, and once freed stays there for
    the next. Without the package, the same Python maps it and unmaps it at its free."""
    plain = run([sys.executable, "-c", MALLINFO], env=clean_environ())
    ours = run([sys.executable, "-c", "import rn50_mx\n" + MALLINFO], env=clean_environ())
    assert (plain.stdout, ours.stdout) == ("1 False\n", "0 True\n"), (plain, ours)


def test_the_images_and_dalis_own_variables_pass_and_a_near_miss_of_ours_is_named():
    result = sourced("NF5688M6", "python -m rn50_mx.check", FOREIGN_DALI)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    result = sourced("CPU", "python -m rn50_mx.check", {**FOREIGN_DALI, "DALI_PREFETCH_QUEUE_DEPTH": "3"})
    assert_one_line_naming(result, "DALI_PREFETCH_QUEUE_DEPTH: unknown variable; did you mean DALI_PREFETCH_QUEUE?")


def test_bad_setting_stops_run_with_docker_before_any_trial(tmp_path):
    data, logs = tmp_path / "data", tmp_path / "logs"
    data.mkdir()
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        (data / name).touch()
    result = sourced("CPU", "./run_with_docker.sh", {"LR": "-1", "DATADIR": str(data), "LOGDIR": str(logs)})
    assert_one_line_naming(result, "LR")
    assert "Beginning trial" not in result.stdout and not os.listdir(logs)


def test_several_processes_need_horovod():
    """The message names the variable that set the value (config/CPU.sh's KVSTORE), or the flag that did."""
    result = sourced("CPU", "python -m rn50_mx.check", {"DGXNGPU": "2"})
    assert_one_line_naming(result, "KVSTORE=device")
    result = sourced("CPU", "python -m rn50_mx.check --kv-store local", {"DGXNGPU": "2"})
    assert_one_line_naming(result, "--kv-store=local")


@pytest.mark.parametrize("system", SYSTEMS)
def test_config_sources_cleanly_and_validates(system):
    result = sourced(system, "echo DGXSYSTEM=$DGXSYSTEM; python -m rn50_mx.check")
    assert result.returncode == 0, result.stderr
    assert result.stderr == (CPU_SH_SAYS if system == "CPU" else "") and f"DGXSYSTEM={system}\n" in result.stdout
    table = settings_table(result.stdout)
    assert table["--batch-size"][1] == "BATCHSIZE" and table["--dgxsystem"] == (system, "DGXSYSTEM")


def test_nf5688m6_config_is_the_reference_recipe():
    table = settings_table(sourced("NF5688M6", "python -m rn50_mx.check").stdout)
    expected = {"--batch-size": "408", "--lr": "10.5", "--warmup-epochs": "2.0", "--num-epochs": "37",
                "--eval-offset": "2", "--eval-period": "4", "--wd": "5e-05", "--mom": "0.9", "--lars-eta": "0.001",
                "--label-smoothing": "0.1", "--optimizer": "sgdwfastlars", "--kv-store": "horovod",
                "--dali-threads": "5", "--dali-prefetch-queue": "15", "--dali-hw-decoder-load": "0.7",
                "--dali-tmp-buffer-hint": "355568328", "--device": "gpu", "--dtype": "float16",
                "--input-layout": "NHWC", "--image-shape": "4,224,224", "--dgxngpu": "8", "--lars-form": "submitted",
                "--num-examples": "1281167"}
    assert {flag: table[flag][0] for flag in expected} == expected


def test_export_after_sourcing_overrides_the_config():
    result = sourced("NF5688M6", "python -m rn50_mx.check", {"NUMEPOCHS": "3"})
    assert settings_table(result.stdout)["--num-epochs"] == ("3", "NUMEPOCHS")


@pytest.mark.parametrize("system", GPU_SYSTEMS)
def test_gpu_configs_export_the_normconv_support_the_reference_exports(system):
    """GPU review 3, F4: the reference (config_NF5688M6_common.sh) and NVIDIA's v4.0 24.04 configs export
    MXNET_EXTENDED_NORMCONV_SUPPORT=1, and rn50_mx runs NormConv where MXNet has it."""
    assert sourced(system, 'echo "$MXNET_EXTENDED_NORMCONV_SUPPORT"').stdout.strip() == "1"


@pytest.mark.parametrize("argv,env,name", [
    (["--batch-size", "abc"], {}, "--batch-size"),
    ([], {"LR": "-1"}, "LR"),
])
def test_a_bad_setting_is_one_line_naming_it(argv, env, name):
    result = run_train(argv, env)
    assert_one_line_naming(result, name)
    assert result.returncode == 2 and result.stderr.startswith("rn50_mx.train: error: ")


@pytest.mark.parametrize("argv,says", [
    (["--resume"], "argument --resume: expected one argument"),
    (["--resume", "--lr", "1"], "argument --resume: expected one argument"),
    (["--resume", "/x/r.resume", "--batch-size", "0"], "--batch-size=0"),
])
def test_check_refuses_a_resume_it_cannot_judge(argv, says):
    """`check --resume STATE` (trials.sh, before a stopped trial resumes): a missing state name or a bad setting is one
    line, before any checkpoint is looked at."""
    result = run([sys.executable, "-m", "rn50_mx.check", *argv], clean_environ())
    assert_one_line_naming(result, says)


# --- DTYPE=bfloat16: where it can run ------------------------------------------------------------------------------

CPUINFO_FLAGS = "processor\t: {n}\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f{extra}\n\n"


def planted_cpuinfo(monkeypatch, tmp_path, extra):
    """A /proc/cpuinfo of two processors whose flags add `extra` to an AVX-512 CPU's, read instead of the real one."""
    from rn50_mx import config
    path = tmp_path / "cpuinfo"
    path.write_text("".join(CPUINFO_FLAGS.format(n=n, extra=extra) for n in range(2)))
    monkeypatch.setattr(config, "CPUINFO", str(path))
    return path


@pytest.mark.parametrize("extra", [" avx512_bf16", " amx_bf16 amx_tile"])
def test_bfloat16_is_taken_on_a_cpu_with_either_instruction(monkeypatch, tmp_path, extra):
    from rn50_mx import config
    planted_cpuinfo(monkeypatch, tmp_path, extra)
    s = config.load(["--dtype", "bfloat16"], {})
    assert (s.dtype, s.input_dtype) == ("bfloat16", "float32")  # DALI delivers float32; the network casts
    assert config.load([], {"DTYPE": "bfloat16"}).dtype == "bfloat16"


@pytest.mark.parametrize("argv,env,says", [
    (["--dtype", "bfloat16"], {}, "--dtype=bfloat16: this CPU has neither avx512_bf16 nor amx_bf16 ({}): use float32, "
                                  "or --bfloat16-fallback=1 to fall back to it"),
    ([], {"DTYPE": "bfloat16"}, "DTYPE=bfloat16: this CPU has neither avx512_bf16 nor amx_bf16 ({}): use float32, or "
                                "RN50_BFLOAT16_FALLBACK=1 to fall back to it"),
])
def test_bfloat16_is_refused_on_a_cpu_without_the_instructions(monkeypatch, tmp_path, argv, env, says):
    from rn50_mx import config
    path = planted_cpuinfo(monkeypatch, tmp_path, " avx512_vnni")  # AVX-512, but no bfloat16 (Ice Lake, Zen 3)
    with pytest.raises(config.SettingsError) as err:
        config.load(argv, env)
    assert str(err.value) == says.format(path)
    path.unlink()  # no cpuinfo at all (not Linux): nothing says the CPU has them
    with pytest.raises(config.SettingsError, match="this CPU has neither"):
        config.load(argv, env)


@pytest.mark.parametrize("argv,says", [
    (["--device", "gpu"], "--dtype=bfloat16: the CPU's low precision; on the GPU use float16"),
    (["--kv-store", "horovod"], "--dtype=bfloat16: one process only: Horovod's MXNet allreduce takes no bfloat16"),
])
def test_bfloat16_is_refused_on_the_gpu_and_under_horovod(monkeypatch, tmp_path, argv, says):
    from rn50_mx import config
    planted_cpuinfo(monkeypatch, tmp_path, " avx512_bf16")
    with pytest.raises(config.SettingsError, match="^" + says):
        config.load(["--dtype", "bfloat16", *argv], {})


@pytest.mark.parametrize("argv,env,says", [
    ([], {"DTYPE": "bfloat16", "RN50_BFLOAT16_FALLBACK": "1"},
     "DTYPE=bfloat16: this CPU has neither avx512_bf16 nor amx_bf16 ({}): training in float32 "
     "(RN50_BFLOAT16_FALLBACK=1)"),
    (["--dtype", "bfloat16", "--bfloat16-fallback", "1"], {},
     "--dtype=bfloat16: this CPU has neither avx512_bf16 nor amx_bf16 ({}): training in float32 "
     "(--bfloat16-fallback=1)"),
])
def test_the_fallback_trains_in_float32_on_a_cpu_without_the_instructions_saying_why(monkeypatch, tmp_path, capsys,
                                                                                      argv, env, says):
    from rn50_mx import config
    path = planted_cpuinfo(monkeypatch, tmp_path, " avx512_vnni")
    s, origins = config.resolve(argv, env)
    assert (s.dtype, s.input_dtype, s.bfloat16_fallback) == ("float32", "float32", True)
    assert capsys.readouterr().err == ""  # resolving says nothing: a tool that refuses next says one line
    config.say_fallback(origins)
    assert capsys.readouterr().err == says.format(path) + "\n"
    assert origins["dtype"] == ("flag" if argv else "RN50_BFLOAT16_FALLBACK")  # the listing says what chose float32
    child = config.resolve(config.as_flags(s), {})  # a child given the settings: float32, with nothing to say
    config.say_fallback(child[1])
    assert child[0].dtype == "float32" and capsys.readouterr().err == ""


def test_the_fallback_changes_nothing_where_bfloat16_runs_and_never_takes_the_gpu(monkeypatch, tmp_path, capsys):
    from rn50_mx import config
    planted_cpuinfo(monkeypatch, tmp_path, " avx512_bf16")
    assert config.load([], {"DTYPE": "bfloat16", "RN50_BFLOAT16_FALLBACK": "1"}).dtype == "bfloat16"
    assert config.load([], {"DTYPE": "float16", "RN50_BFLOAT16_FALLBACK": "1", "DEVICE": "gpu"}).dtype == "float16"
    assert capsys.readouterr().err == ""
    with pytest.raises(config.SettingsError, match="^DTYPE=bfloat16: the CPU's low precision; on the GPU use float16$"):
        config.load([], {"DTYPE": "bfloat16", "RN50_BFLOAT16_FALLBACK": "1", "DEVICE": "gpu"})
    with pytest.raises(config.SettingsError, match="^RN50_BFLOAT16_FALLBACK='float32': "):
        config.load([], {"DTYPE": "bfloat16", "RN50_BFLOAT16_FALLBACK": "float32"})


def test_under_horovod_the_fallback_trains_in_float32_even_where_the_cpu_has_the_instructions(monkeypatch, tmp_path,
                                                                                           capsys):
    from rn50_mx import config
    planted_cpuinfo(monkeypatch, tmp_path, " amx_bf16")
    s, origins = config.resolve([], {"DTYPE": "bfloat16", "RN50_BFLOAT16_FALLBACK": "1", "KVSTORE": "horovod"})
    assert s.dtype == "float32"
    config.say_fallback(origins)
    assert capsys.readouterr().err.startswith("DTYPE=bfloat16: one process only: Horovod's MXNet allreduce takes no "
                                              "bfloat16")


@pytest.mark.parametrize("extra,dtype", [(" avx512_bf16", "bfloat16"), (" avx512_vnni", "float32")])
def test_make_demos_config_takes_bfloat16_where_the_cpu_has_it_and_float32_elsewhere(monkeypatch, tmp_path, capsys,
                                                                                     extra, dtype):
    """config/CPU.sh's own environment, resolved by the check every launch runs first, on each kind of CPU."""
    from rn50_mx import check, config
    env = config_environ("CPU")
    for name in config.env_names():
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = planted_cpuinfo(monkeypatch, tmp_path, extra)
    assert check.main([]) == 0
    out, err = capsys.readouterr()
    table = settings_table(out)
    assert table["--dtype"] == (dtype, "RN50_BFLOAT16_FALLBACK" if dtype == "float32" else "DTYPE")
    assert err == ("" if dtype == "bfloat16" else f"DTYPE=bfloat16: this CPU has neither avx512_bf16 nor amx_bf16 "
                                                  f"({path}): training in float32 (RN50_BFLOAT16_FALLBACK=1)\n")


def test_cpu_flags_are_the_first_processor_s(tmp_path):
    from rn50_mx import config
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO_FLAGS.format(n=0, extra=" avx512_bf16") + CPUINFO_FLAGS.format(n=1, extra=""))
    assert config.cpu_flags(path) == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16"}
    assert config.cpu_flags(os.devnull) == set()


def test_train_refuses_bfloat16_in_one_line_and_its_help_names_it():
    result = run_train(["--dtype", "bfloat16", "--device", "gpu"], {})
    assert_one_line_naming(result, "--dtype=bfloat16: the CPU's low precision; on the GPU use float16")
    help_text = run_train(["--help"], {}).stdout
    assert "bfloat16" in help_text and "avx512_bf16" in help_text


@pytest.mark.parametrize("name", ["../x", "CPU\ntouch x", "a b"])
def test_a_system_name_is_a_file_name(name):
    """DGXSYSTEM names config/<SYSTEM>.sh and the fragments the tuner and the search write beside it: the recipe's
    rule for a config name holds for every tool (a newline became a shell line in the search's fragment)."""
    from rn50_mx import config
    from rn50_mx.config import SettingsError

    with pytest.raises(SettingsError, match=r"^DGXSYSTEM=.*: a system name is letters, digits"):
        config.load([], {"DGXSYSTEM": name})


@pytest.mark.parametrize("env, says", [
    ({"RN50_EVAL_LAST_EPOCH": "1"}, "RN50_EVAL_LAST_EPOCH=True: an open-division lever"),  # an off-schedule eval
    ({"RN50_MOM_SCHEDULE": "  ", "SUBMISSION_DIVISION": "open"}, "RN50_MOM_SCHEDULE='  ': '' is not EPOCH:MOMENTUM"),
])
def test_a_lever_is_on_only_with_a_value_and_in_the_open_division(env, says):
    """A blank momentum schedule turned the lever on (the run logged open) with no schedule; a closed run with an
    eval at the last epoch, off the MLPerf schedule, converged there and was logged closed."""
    from rn50_mx import config

    with pytest.raises(config.SettingsError, match=re.escape(says)):
        config.load([], env)


def test_the_recipe_never_names_a_config_like_a_fragment(tmp_path):
    """recipe --system CPU_hparams wrote a GPU config at config/CPU_hparams.sh, which CPU launches source as the
    search's fragment."""
    result = run([sys.executable, "-m", "rn50_mx.recipe", "--nodes", "1", "--gpus-per-node", "8", "--system", "CPU_hparams",
                  "--config-dir", str(tmp_path)])
    assert_one_line_naming(result, "--system CPU_hparams: config/<SYSTEM>_tuned and _hparams.sh are the fragments")
    assert os.listdir(tmp_path) == []


def test_a_cpuinfo_that_is_not_utf8_gives_its_flags(monkeypatch, tmp_path):
    """Issue 42 item 11: a VM's model name may be any bytes; config/CPU.sh's bfloat16 reads the flags at every
    command (7c8846a: UnicodeDecodeError in config.cpu_flags)."""
    from rn50_mx import config
    path = planted_cpuinfo(monkeypatch, tmp_path, " avx512_bf16")
    path.write_bytes(b"model name\t: \xff\xfe Virtual \xe9CPU\n" + path.read_bytes())
    assert config.load(["--dtype", "bfloat16"], {}).dtype == "bfloat16"


@pytest.mark.parametrize("argv,env,refused", [
    (["--device", "gpu", "--num-layers", "14"], {}, "--num-layers=14: a GPU run trains ResNet-50 (50)"),
    (["--device", "gpu"], {"RN50_NUM_LAYERS": "26"}, "RN50_NUM_LAYERS=26: a GPU run trains ResNet-50 (50)"),
    (["--device", "gpu", "--num-layers", "26", "--standin", "gpu"], {}, None),  # the rehearsal's shrunk run
    (["--num-layers", "14"], {}, None),  # the CPU's tests
    (["--num-layers", "13"], {}, "--num-layers=13: must be one of 14, 26, 50"),
])
def test_fewer_layers_are_for_shrunk_runs_and_a_gpu_run_trains_resnet_50(argv, env, refused):
    from rn50_mx import config
    if refused:
        with pytest.raises(config.SettingsError, match="^" + re.escape(refused)):
            config.load(argv, env)
    else:
        assert config.load(argv, env).num_layers == int(argv[argv.index("--num-layers") + 1])
