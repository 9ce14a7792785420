"""The hostile table that grows by itself (issue 49): every input of every command, enumerated from the code, run
through the standard bad values (tests/support/bad_values.py).

The inputs:
- every command: each `python -m rn50_mx.X` (the package's modules with a __main__ block and packages with a
  __main__, found by walking the package) has parser(), its argparse parser, whose actions are its flags and
  arguments; a command built on config.tool_parser (and rn50_mx.train itself) takes training's settings too:
  config.FIELDS, each by flag and by variable, and config.REFERENCE_ONLY_ENV;
- the files each folder format holds, named by the code that writes them: the checkpoint folder (as the
  stopped_checkpoints run wrote it, and checkpoint.folder.FINISHED, which run_stop adds), a prefix's files
  (--save-model's MODEL_FILES and files.owned's lock), the study's (the search's own path functions) and a results
  folder (the reference's result logs, as rn50_mx.timing reads them).

The values:
- texts (bad_values.NAMES) given to every flag, argument and variable that takes one, through the command's own
  argument parsing, in this process: refused with an InputError (run_cli's one line) or kept exactly as given;
- plants (bad_values.PLANTS, truncated, unreadable_folder, a full disk) at every path input (path_targets), through
  the real command: one stderr line naming the path, a non-zero exit, no traceback, no hang past TIMEOUT seconds, nothing
  written outside the run's own folders (a planted link's victim intact). The cases run through
  tests/support/table_runner.py: one process imports every command once and runs each case as `python -m` would,
  so a case costs its parse and its open (an unreadable case runs as nobody: root reads through chmod 0).

Where a case is legitimately different, DIFFERENT (or the kind's rule in NOT_APPLICABLE) says why in one line.
test_every_input_is_probed_or_listed fails for an input that takes a text but is neither a path the table plants at
nor listed in NOT_PATHS with a reason: a new flag's texts are probed the day it lands, and the table asks what it is.
"""
import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import pkgutil
import resource
import shutil
import sqlite3
import stat
import tempfile
from typing import Callable

import pytest

import rn50_mx
from rn50_mx import checkpoint, config
from rn50_mx.checkpoint.folder import FINISHED
from rn50_mx.errors import InputError
from rn50_mx.search import output as search_output
from tests.support import bad_values, studies
from tests.support.procs import ENV_PATH, PYTHONPATH, ROOT
from tests.support.settings import STOPPED_RUN
from tests.support.studies import planted_study
from tests.support.table_runner import linked_copy, run_cases

TIMEOUT = 20  # seconds a case may take: a refusal takes well under one; more is a hang
NOBODY = 65534
AS_ROOT = os.geteuid() == 0  # root reads through chmod 0: an unreadable case then runs as NOBODY
LOGS = os.path.join(ROOT, "tests", "data", "inspur_nf5688m6")


# --- the inputs, from the code -------------------------------------------------------------------------------------

def tool_modules():
    """Every `python -m rn50_mx.X`: the package's modules with a __main__ block, and its packages with a __main__."""
    found = []
    for info in pkgutil.walk_packages(rn50_mx.__path__, "rn50_mx."):
        if info.name.endswith(".__main__"):
            found.append(info.name[:-len(".__main__")])
        elif not info.ispkg:
            with open(importlib.util.find_spec(info.name).origin) as f:
                if 'if __name__ == "__main__":' in f.read():
                    found.append(info.name)
    return sorted(found)


TOOLS = tool_modules()


def actions(parser, prefix=""):
    """(label, action, the (sub)parser) of every flag and argument of `parser`, subcommands' as 'COMMAND name'."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from actions(sub, f"{prefix}{name} ")
            continue
        yield prefix + (action.option_strings[0] if action.option_strings else action.dest), action, parser


def is_settings_parser(parser):
    """config.settings_parser's: every flag a setting (rn50_mx.train's parser). A parser with no flag at all (a
    command of subcommands, or of none) is not one: its own inputs are enumerated."""
    flags = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    return bool(flags) and flags <= set(config.FIELDS)


def takes_settings(parser):
    return parser.epilog == config.DATA_FLAGS_HELP or is_settings_parser(parser)


def action_kind(action):
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return "choice"
    return "number" if action.type is not None else "text"


def field_kind(f):
    if f.metadata["choices"] or f.type is bool:
        return "choice"
    return "text" if f.type is str else "number"


@dataclasses.dataclass(frozen=True)
class Input:
    tool: str  # the command's module, or "settings": training's, taken by every command SETTINGS_USERS names
    name: str  # "--plot", "paths", "pack src_dir", a setting's flag, or its variable
    kind: str  # switch, number, choice or text

    def __str__(self):
        return f"{self.tool.replace('rn50_mx.', '')} {self.name}"


def enumerate_inputs():
    found, users = [], []
    for tool in TOOLS:
        parser = importlib.import_module(tool).parser()
        if takes_settings(parser):
            users.append(tool)
        if not is_settings_parser(parser):
            found += [Input(tool, label, action_kind(action)) for label, action, _ in actions(parser)]
    for f in config.FIELDS.values():
        found.append(Input("settings", config.flag_name(f.name), field_kind(f)))
        if f.metadata["env"]:
            found.append(Input("settings", f.metadata["env"], field_kind(f)))
    found += [Input("settings", name, "choice") for name in config.REFERENCE_ONLY_ENV]
    return found, users


INPUTS, SETTINGS_USERS = enumerate_inputs()
BY_ENV = {f.metadata["env"]: f for f in config.FIELDS.values() if f.metadata["env"]}
BY_FLAG = {config.flag_name(f.name): f for f in config.FIELDS.values()}


# --- layer 1: texts through each command's own argument parsing ---------------------------------------------------

# Values for the arguments a probe does not give, where the command requires them (argparse's `required`).
REQUIRED = {"--gpus-per-node": "8"}


def argv_for(tool, name, text):
    """The command line that gives `text` to input `name` of `tool` (its subcommand, its other positional arguments
    and required flags given placeholder values)."""
    parser = importlib.import_module(tool).parser()
    [(label, action, owner)] = [(lb, a, p) for lb, a, p in actions(parser) if lb == name]
    argv = label.split(" ")[:-1]  # the subcommand, if any
    for other in owner._actions:
        given = other is action
        if not other.option_strings and not isinstance(other, (argparse._SubParsersAction, argparse._HelpAction)):
            argv.append(text if given else ("1" if other.type is int else "x"))
        elif other.option_strings and (given or other.required):
            argv.append(f"{other.option_strings[0]}={text if given else REQUIRED[other.option_strings[0]]}")
    return argv, action


def parse_tool(tool, argv):
    """The namespace `tool` parses `argv` into: its parse_args (the checks it makes of its arguments) where it has
    one, else its parser (training's flags handed on, as the command does)."""
    module = importlib.import_module(tool)
    if hasattr(module, "parse_args"):
        parsed = module.parse_args(argv)
        return parsed[0] if isinstance(parsed, tuple) else parsed
    parser = module.parser()
    return parser.parse_known_args(argv)[0] if takes_settings(parser) else parser.parse_args(argv)


def parsed_value(item, text):
    """What `item` holds after `text` is given to it, or the InputError that refused it."""
    try:
        if item.tool != "settings":
            argv, action = argv_for(item.tool, item.name, text)
            return getattr(parse_tool(item.tool, argv), action.dest)
        if item.name.startswith("--"):
            return getattr(config.load([f"{item.name}={text}"], environ={}), BY_FLAG[item.name].name)
        s = config.load([], environ={item.name: text})
        return getattr(s, BY_ENV[item.name].name) if item.name in BY_ENV else text
    except InputError as err:
        return err


def kept(item, text, value):
    """Whether an accepted `value` is `text` as given: a text input keeps it (an --append input as its one item);
    a variable set empty is unset (config.from_environ), its setting's default."""
    if item.tool == "settings" and not item.name.startswith("--") and text == "":
        return item.name not in BY_ENV or value == BY_ENV[item.name].default
    return item.kind == "text" and value in (text, [text])


@pytest.mark.parametrize("item", [i for i in INPUTS if i.kind != "switch"], ids=str)
def test_a_text_given_to_an_input_is_refused_in_one_line_or_kept_as_given(item, monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipe's --config-dir defaults to config/
    for label, text in bad_values.NAMES.items():
        value = parsed_value(item, text)
        if isinstance(value, InputError):
            continue  # run_cli prints it as one line (errors.printable)
        assert kept(item, text, value), f"{item} given {label} {text!r}: accepted as {value!r}"


# Training's settings with a fallback to say (Horovod allreduces no bfloat16: on every CPU), and a refusal after it.
FALLING_BACK = {"DTYPE": "bfloat16", "RN50_BFLOAT16_FALLBACK": "1", "KVSTORE": "horovod"}
REFUSED = ["--min-random-area", "0.9", "--max-random-area", "0.5"]


def test_a_refused_setting_is_one_line_where_the_settings_fall_back_to_float32():
    """Every command that takes training's settings, given config/CPU.sh's bfloat16 where it falls back (said by a
    run that starts) and a setting it refuses: one line, the refusal's. The fallback was said as the settings were
    resolved, before the refusal, on every CPU without avx512_bf16: the suite's one-line probes failed there."""
    cases = [{"id": tool, "module": tool, "argv": REFUSED, "env": {**os.environ, **PYTHONPATH, **FALLING_BACK},
              "cwd": ROOT, "uid": None, "timeout": TIMEOUT} for tool in SETTINGS_USERS]
    results = run_cases(cases)
    for tool in SETTINGS_USERS:
        lines = results[tool]["stderr"].splitlines()
        assert results[tool]["code"] == 2 and len(lines) == 1 and "--min-random-area" in lines[0], results[tool]


# --- layer 2: things planted at every path input, through the real command ----------------------------------------

@dataclasses.dataclass
class Case:
    """One command run with something planted at `path`: module, arguments, the run's own folders (what it may
    write), and a good file put at `path` first (what truncated and unreadable start from; the others replace it)."""
    module: str
    argv: list
    path: str
    own: tuple = ()
    good: str = ""


@dataclasses.dataclass
class Target:
    """A path input: `kind` (file: read; folder: read; out: a file written; outdir: a folder written) and how the
    command reaches it: arrange(root, fixtures) -> Case."""
    kind: str
    arrange: Callable


PLANTS = {**bad_values.PLANTS, "truncated": bad_values.truncated, "full disk": None}
FOLDER_PLANTS = {"unreadable": bad_values.unreadable_folder}  # where a folder is expected
# What a kind of input never meets, in one line: these cases are listed, not run.
NOT_APPLICABLE = {
    ("file", "full disk"): "read, never written",
    ("folder", "full disk"): "read, never written",
    ("folder", "truncated"): "a folder is not cut short; its files are (their own rows)",
    ("outdir", "truncated"): "a folder is not cut short; its files are (their own rows)",
    ("outdir", "missing"): "created: the normal case, where the command then does its work",
    ("outdir", "directory"): "an empty folder: the normal case, where the command then does its work",
    ("out", "missing"): "a new output: the normal case, where the command then does its work",
}


def train_flags(data):
    return ["--data-train", f"{data}/train.rec", "--data-val", f"{data}/val.rec", "--num-classes", "5",
            "--image-shape", "3,32,32", "--batch-size", "4", "--num-epochs", "1", "--warmup-epochs", "0",
            "--eval-offset", "0", "--dali-threads", "1"]


def data_file(name, flag=None):
    """A data file of the shared set, given by its flag (the .idx by --data-*-idx): the train set's to training, which
    asks what each file is before any work and reads the train index whole when it sizes the epoch, before run_start;
    the val set's to `check`, the data check every command but training runs before its work (training reads no val
    byte before run_start, where the MLPerf clock starts: tests/test_hostile.py gives it a FIFO val .rec)."""
    def arrange(root, fx):
        data = fx["data"](root)
        flags = train_flags(data) + ([flag, f"{data}/{name}"] if flag else [])
        return Case("rn50_mx.check" if name.startswith("val") else "rn50_mx.train", flags, f"{data}/{name}",
                    good=f"{data}/{name}")
    return arrange


def datadir(root, fx):
    data = fx["data"](root)
    flags = [f for f in train_flags(data)[4:]] + ["--datadir", data]
    shutil.rmtree(data)
    return Case("rn50_mx.train", flags, data)


def train_output(flag, name, own="out"):
    """An output of training at ROOT/OWN/NAME (the folder the run's own): --mllog-file, --save-model's files."""
    def arrange(root, fx):
        folder = os.path.join(root, own)
        os.makedirs(folder, exist_ok=True)
        value = os.path.join(folder, name.split(":")[0])
        path = os.path.join(folder, name.split(":")[-1])
        return Case("rn50_mx.train", ["--synthetic", "1", "--num-examples", "8", *train_flags("")[4:], flag, value],
                    path, own=(folder,), good=fx["log"](path) if flag == "--mllog-file" else "")
    return arrange


def checkpoint_dir(root, fx):
    return Case("rn50_mx.train", [*STOPPED_RUN, "--checkpoint-dir", os.path.join(root, "ckpt")],
                os.path.join(root, "ckpt"), own=(os.path.join(root, "ckpt"),))


def checkpoint_file(name, command="train"):
    """A file of the stopped run's checkpoint folder (a copy), met by a resume (train) or `check --resume`."""
    def arrange(root, fx):
        folder = fx["checkpoints"](root)
        path = os.path.join(folder, name)
        if command == "check":
            return Case("rn50_mx.check", ["--resume", os.path.join(root, "trial.resume"), *STOPPED_RUN,
                                          "--checkpoint-dir", folder], path, own=(folder,), good=path)
        return Case("rn50_mx.train", [*STOPPED_RUN, "--checkpoint-dir", folder], path, own=(folder,), good=path)
    return arrange


def evaluate_model(suffix):
    def arrange(root, fx):
        prefix = fx["model"](root)
        return Case("rn50_mx.evaluate", ["--model", prefix, *train_flags(fx["data"](root))[2:]], prefix + suffix,
                    good=prefix + suffix)
    return arrange


def evaluate_checkpoint_dir(root, fx):
    return Case("rn50_mx.evaluate", ["--checkpoint-dir", os.path.join(root, "ckpt"),
                                     *train_flags(fx["data"](root))[2:]], os.path.join(root, "ckpt"))


def timing_log(root, fx):
    logs = fx["logs"](root)
    return Case("rn50_mx.timing", [f"{logs}/result_1.txt"], f"{logs}/result_1.txt", good=f"{logs}/result_1.txt")


def timing_folder_file(root, fx):
    logs = fx["logs"](root)
    for name in os.listdir(logs):  # two of the reference's results: a folder of logs (compliance checks cost)
        if name not in ("result_1.txt", "result_2.txt"):
            os.remove(os.path.join(logs, name))
    return Case("rn50_mx.timing", [logs], f"{logs}/result_1.txt", good=f"{logs}/result_1.txt")


def timing_folder(root, fx):
    return Case("rn50_mx.timing", [os.path.join(root, "logs")], os.path.join(root, "logs"))


def timing_plot(root, fx):
    logs = fx["logs"](root)
    os.makedirs(os.path.join(root, "out"))
    return Case("rn50_mx.timing", [f"{logs}/result_1.txt", "--plot", os.path.join(root, "out", "plot.png")],
                os.path.join(root, "out", "plot.png"), own=(os.path.join(root, "out"),))


# The search's study: its names from the search's own functions (search.lock_path, output.*, launchers.log_path).
STUDY_SEED = 900_000
PLACE = "/place-of-the-case"  # in a study's records, replaced by a case's folder in its copy


def search_argv(root, fx, *extra):
    return studies.search_argv(os.path.join(root, "res"), os.path.join(root, "cfg"), fx["data"](root), *extra)


def search_args(root, fx):
    """The search's own reading of its arguments: where its study's files go."""
    from rn50_mx import search
    return search.prepare(search_argv(root, fx))[1]


def study_file(which, study="", *extra):
    """A file or folder of the study in --results, met by `python -m rn50_mx.search` with the study `study` there
    (fixtures' studies: "" none, "done" a finished trial, "ended" one with an ended finalist)."""
    def arrange(root, fx):
        from rn50_mx import search
        from rn50_mx.search import launchers
        args = search_args(root, fx)
        if study:
            fx["study"](root, study)
        finals = os.path.join(search_output.finals_parent(args.results, args.study), "1", "sourced")
        paths = {"lock": search.lock_path(args), "database": args.storage[len("sqlite:///"):],
                 "trials": search_output.trials_folder(args.results, args.study),
                 "finals": search_output.finals_parent(args.results, args.study),
                 "finalist's log": launchers.log_path("local", finals, STUDY_SEED),
                 "picture": os.path.join(args.results, args.study + ".png"), "fragment": args.fragment}
        path = paths[which]
        good = path if which in ("database", "finalist's log") and os.path.exists(path) else ""
        own = (args.results, os.path.dirname(args.fragment))
        return Case("rn50_mx.search", search_argv(root, fx, *extra), path, own=own, good=good)
    return arrange


def search_folder(flag):
    def arrange(root, fx):
        path = os.path.join(root, "res" if flag == "--results" else "cfg")
        own = (os.path.join(root, "res"), os.path.join(root, "cfg"))
        return Case("rn50_mx.search", search_argv(root, fx), path, own=own)
    return arrange


def tune_out(root, fx):
    return Case("rn50_mx.tune", ["--out", os.path.join(root, "cfg"), "--budget", "0",
                                 *train_flags(fx["data"](root))[:2], *train_flags("")[4:]], os.path.join(root, "cfg"),
                own=(os.path.join(root, "cfg"),))


def recipe_dir(root, fx):
    folder = os.path.join(root, "cfg")
    return Case("rn50_mx.recipe", ["--nodes", "1", "--gpus-per-node", "8", "--config-dir", folder, "--system", "t"],
                folder, own=(folder,))


def recipe_config(root, fx):
    folder = os.path.join(root, "cfg")
    os.makedirs(folder)
    shutil.copy(os.path.join(ROOT, "config", "gpu_common.sh"), folder)
    return Case("rn50_mx.recipe", ["--nodes", "1", "--gpus-per-node", "8", "--config-dir", folder, "--system", "t"],
                os.path.join(folder, "t.sh"), own=(folder,))


def rehearse_work(root, fx):
    return Case("rn50_mx.rehearse", ["--work", os.path.join(root, "work"), "--quick"], os.path.join(root, "work"),
                own=(os.path.join(root, "work"),))


def pack(which):
    """`prep_rec pack SRC OUT [--list LST | --classes-from LST]` with the plant at `which`."""
    def arrange(root, fx):
        jpegs, data = fx["jpegs"](root), fx["data"](root)
        out = os.path.join(root, "out")
        os.makedirs(out)
        argv = ["pack", jpegs, f"{out}/x", "--workers", "1"]
        if which == "--list":
            argv += ["--list", f"{data}/val.lst"]
        if which == "--classes-from":
            argv += ["--classes-from", f"{data}/val.lst"]
        path = {"src_dir": jpegs, "out_prefix": f"{out}/x.rec.lock", "--list": f"{data}/val.lst",
                "--classes-from": f"{data}/val.lst"}[which]
        if which == "src_dir":
            shutil.rmtree(jpegs)
        return Case("rn50_mx.prep_rec", argv, path, own=(out,), good=path if which.startswith("--") else "")
    return arrange


def imagenet(which):
    """`prep_rec imagenet SRC OUT_DIR`, SRC an ImageNet in its train/ and val/ folders layout (the shared JPEGs)."""
    def arrange(root, fx):
        src, out = os.path.join(root, "imagenet"), os.path.join(root, "out")
        for split in ("train", "val"):
            linked_copy(fx["jpegs"](root), os.path.join(src, split))
        if which == "src":
            shutil.rmtree(src)
        return Case("rn50_mx.prep_rec", ["imagenet", src, out, "--workers", "1", "--classes", "5"],
                    src if which == "src" else out, own=(out,))
    return arrange


def fashion_mnist(root, fx):
    out = os.path.join(root, "out")
    return Case("rn50_mx.prep_rec", ["fashion-mnist", out, "--size", "32", "--train-per-class", "1",
                                     "--val-per-class", "1", "--workers", "1"], out, own=(out,))


def verify(suffix):
    def arrange(root, fx):
        data = fx["data"](root)
        return Case("rn50_mx.prep_rec", ["verify", f"{data}/val", "--workers", "1"], f"{data}/val{suffix}",
                    good=f"{data}/val{suffix}")
    return arrange


def checkpoint_names(folder):
    """The files of the checkpoint folder the stopped run wrote, and the mark run_stop adds: relative names."""
    names = [os.path.relpath(os.path.join(top, name), folder) for top, _, names in os.walk(folder) for name in names]
    return sorted(names) + [FINISHED]


def path_targets(checkpoint_folder):
    """{(command, input): Target} of every input that names a path, and of every file of a folder format."""
    targets = {
        ("settings", "--data-train"): Target("file", data_file("train.rec")),
        ("settings", "--data-val"): Target("file", data_file("val.rec")),
        ("settings", "--data-train-idx"): Target("file", data_file("train.idx", "--data-train-idx")),
        ("settings", "--data-val-idx"): Target("file", data_file("val.idx", "--data-val-idx")),
        ("settings", "--datadir"): Target("folder", datadir),
        ("settings", "--mllog-file"): Target("out", train_output("--mllog-file", "mlperf.log")),
        ("settings", "--checkpoint-dir"): Target("outdir", checkpoint_dir),
        ("rn50_mx.evaluate", "--model"): Target("file", evaluate_model(checkpoint.MODEL_FILES[0])),
        ("rn50_mx.timing", "paths"): Target("file", timing_log),
        ("rn50_mx.timing", "--plot"): Target("out", timing_plot),
        ("rn50_mx.search", "--results"): Target("outdir", search_folder("--results")),
        ("rn50_mx.search", "--out"): Target("outdir", search_folder("--out")),
        ("rn50_mx.tune", "--out"): Target("outdir", tune_out),
        ("rn50_mx.recipe", "--config-dir"): Target("folder", recipe_dir),
        ("rn50_mx.rehearse", "--work"): Target("outdir", rehearse_work),
        ("rn50_mx.prep_rec", "pack src_dir"): Target("folder", pack("src_dir")),
        ("rn50_mx.prep_rec", "pack out_prefix"): Target("out", pack("out_prefix")),
        ("rn50_mx.prep_rec", "pack --list"): Target("file", pack("--list")),
        ("rn50_mx.prep_rec", "pack --classes-from"): Target("file", pack("--classes-from")),
        ("rn50_mx.prep_rec", "imagenet src"): Target("folder", imagenet("src")),
        ("rn50_mx.prep_rec", "imagenet out_dir"): Target("outdir", imagenet("out_dir")),
        ("rn50_mx.prep_rec", "fashion-mnist out_dir"): Target("outdir", fashion_mnist),
        ("rn50_mx.prep_rec", "verify prefix"): Target("file", verify(".rec")),
    }
    # the files of the folder formats
    for suffix in checkpoint.MODEL_FILES[1:]:
        targets[("rn50_mx.evaluate", f"--model PATH{suffix}")] = Target("file", evaluate_model(suffix))
    for suffix in (*checkpoint.MODEL_FILES, ".lock"):
        targets[("settings", f"--save-model PATH{suffix}")] = Target("out", train_output("--save-model",
                                                                                        f"model:model{suffix}"))
    targets[("rn50_mx.prep_rec", "verify prefix PREFIX.idx")] = Target("file", verify(".idx"))
    for name in checkpoint_names(checkpoint_folder) if checkpoint_folder else ():
        kind = "out" if name in ("lock", FINISHED) else "file"
        targets[("checkpoint folder", name)] = Target(kind, checkpoint_file(name))
    targets[("checkpoint folder", f"{FINISHED} (check --resume)")] = Target("file", checkpoint_file(FINISHED, "check"))
    targets[("rn50_mx.evaluate", "--checkpoint-dir")] = Target("folder", evaluate_checkpoint_dir)
    targets[("results folder", "result_1.txt")] = Target("file", timing_folder_file)
    targets[("results folder", "(the folder)")] = Target("folder", timing_folder)
    for which, study, kind, extra in (("lock", "", "out", ()), ("database", "done", "out", ()),
                                      ("finalist's log", "ended", "file", ()), ("trials", "", "outdir", ()),
                                      ("finals", "done", "outdir", ("--finalists", "1")),
                                      ("picture", "done", "out", ()), ("fragment", "done", "out", ())):
        targets[("study", which)] = Target(kind, study_file(which, study, *extra))
    return targets


# Inputs that take a text but name no path the table plants at, each with why.
NOT_PATHS = {
    ("rn50_mx.check", "--resume"): "the launcher's state file is named in the refusal, never opened",
    ("rn50_mx.bind", "--sysfs"): "read only for the GPUs nvidia-smi lists (none here); tests/test_bind.py plants one",
    ("rn50_mx.bind", "--visible"): "a list of GPU indexes, parsed as text (layer 1)",
    ("rn50_mx.recipe", "--ruleset"): "a ruleset's name: the checker's own file is found by it (layer 1)",
    ("rn50_mx.recipe", "--predict"): "a list of node counts (layer 1)",
    ("rn50_mx.recipe", "--system"): "a config's name, checked against config.SYSTEM_NAME (layer 1)",
    ("rn50_mx.search", "--knob"): "NAME=LOW:HIGH, parsed by search.space.parse_knob (layer 1, tests/test_search.py)",
    ("rn50_mx.search", "--storage"): "a database URL: the default one's file is the study's database (its own row)",
    ("rn50_mx.search", "--study"): "a name, checked against config.SYSTEM_NAME (layer 1)",
    ("settings", "--image-shape"): "C,H,W (layer 1)",
    ("settings", "--mom-schedule"): "EPOCH:MOMENTUM points (layer 1)",
    ("settings", "--batch-schedule"): "EPOCH:FACTOR points (layer 1)",
    ("settings", "--submission-org"): "a name logged as given (layer 1)",
    ("settings", "--dgxsystem"): "a system name, checked against config.SYSTEM_NAME (layer 1)",
    ("settings", "--save-model"): "a prefix: each file it names has its own row (--save-model PATH-...)",
}
# Cases that are legitimately different: (input, value) -> (what is expected, why). "accepted": it runs, exits 0,
# and the rest holds (victim intact, nothing outside its folders written); "skip": listed, not run (its work would
# run); "reports": a non-zero exit whose stdout names the path (the command's job is to report it).
OUTPUT_REPLACED = "an output written under a temporary name and renamed: what is at its name is replaced, never " \
                  "written through"
DIFFERENT = {
    (("settings", "--mllog-file"), "empty"): ("skip", "an empty file is a new log: the run then trains"),
    (("settings", "--save-model PATH.lock"), "empty"): ("skip", "an empty lock is a lock: the run then trains"),
    (("settings", "--save-model PATH.lock"), "truncated"): ("skip", "a lock holds nothing to cut"),
    (("checkpoint folder", "lock"), "missing"): ("skip", "created: a resume, which then trains"),
    (("checkpoint folder", "lock"), "empty"): ("skip", "an empty lock is a lock: a resume, which then trains"),
    (("checkpoint folder", "lock"), "truncated"): ("skip", "a lock's note holds nothing a run reads"),
    (("checkpoint folder", "lock"), "full disk"): ("skip", "the folder's own row (--checkpoint-dir) has it"),
    (("checkpoint folder", FINISHED), "missing"): ("skip", "the run there has not ended: a resume, which trains"),
    (("checkpoint folder", FINISHED), "truncated"): ("skip", "the mark's words are shown, whatever they are"),
    (("checkpoint folder", FINISHED), "full disk"): ("skip", "written at run_stop, under a temporary name"),
    (("checkpoint folder", f"{FINISHED} (check --resume)"), "missing"): (
        "skip", "the run there has not ended: check goes on to the data"),
    (("checkpoint folder", f"{FINISHED} (check --resume)"), "truncated"): (
        "skip", "the mark's words are shown, whatever they are"),
    (("rn50_mx.timing", "--plot"), "missing"): ("accepted", "a new plot"),
    (("results folder", "result_1.txt"), "fifo"): ("accepted", "not a regular file, so no log: the other is"),
    **{(("rn50_mx.timing", "--plot"), plant): ("accepted", OUTPUT_REPLACED) for plant in ("unreadable", "empty")},
    (("rn50_mx.timing", "--plot"), "truncated"): ("skip", "an existing plot, replaced whole (as empty)"),
    (("rn50_mx.timing", "paths"), "truncated"): ("accepted", "a log cut short is a run without run_stop: shown, "
                                                             "and scored as not finished"),
    (("results folder", "result_1.txt"), "missing"): ("accepted", "a folder holds the logs it holds: the other"),
    (("results folder", "result_1.txt"), "directory"): ("accepted", "a folder named *.txt is no log: the other is"),
    (("results folder", "result_1.txt"), "truncated"): ("accepted", "a log cut short is a run without run_stop"),
    (("study", "lock"), "missing"): ("skip", "created: the search then runs its trials"),
    (("study", "lock"), "empty"): ("skip", "an empty lock is a lock: the search then runs its trials"),
    (("study", "lock"), "truncated"): ("skip", "a lock's note holds nothing a driver reads"),
    (("study", "database"), "missing"): ("skip", "a new study: the search then runs its trials"),
    (("study", "database"), "empty"): ("skip", "SQLite takes an empty file for a new database: trials run"),
    (("study", "picture"), "missing"): ("accepted", "a new picture"),
    **{(("study", "picture"), plant): ("accepted", OUTPUT_REPLACED) for plant in ("fifo", "link elsewhere",
                                                                                    "unreadable", "empty")},
    (("study", "picture"), "truncated"): ("skip", "an existing picture, replaced whole (as empty)"),
    (("study", "fragment"), "missing"): ("accepted", "no fragment is written here: the sourced set stays"),
    **{(("study", "fragment"), plant): ("accepted", "a regular file where the fragment goes is replaced only when "
                                                    "a winner is written (atomically), not here")
       for plant in ("unreadable", "empty", "truncated")},
    (("rn50_mx.prep_rec", "pack out_prefix"), "empty"): ("skip", "an empty lock is a lock: the pack then runs"),
    (("rn50_mx.prep_rec", "pack out_prefix"), "truncated"): ("skip", "a lock holds nothing to cut"),
    (("rn50_mx.prep_rec", "fashion-mnist out_dir"), "missing"): ("accepted", "created, the set packed (20 images)"),
    (("rn50_mx.prep_rec", "fashion-mnist out_dir"), "directory"): ("accepted", "an empty folder: the set packed"),
    (("rn50_mx.prep_rec", "pack --list"), "truncated"): ("refused", "its cut last line names an image not there: "
                                                                    "the line names that image"),
    (("rn50_mx.prep_rec", "pack --classes-from"), "truncated"): ("refused", "the cut map lacks classes: the line "
                                                                           "names the first folder it lacks"),
    **{(("rn50_mx.prep_rec", f"verify prefix{suffix}"), plant): ("reports", "what verify is for: it names each "
                                                                            "problem on stdout and exits 1")
       for suffix in ("", " PREFIX.idx") for plant in ("link elsewhere", "empty", "truncated")},
}


def expectation(key, kind, plant):
    """(expected, why): refused (the default), accepted, reports or skip."""
    if (kind, plant) in NOT_APPLICABLE:
        return "skip", NOT_APPLICABLE[(kind, plant)]
    if plant == "full disk" and not AS_ROOT:
        return "skip", "needs root: a tmpfs mounted and filled"
    return DIFFERENT.get((key, plant), ("refused", ""))


# --- running the plants ---------------------------------------------------------------------------------------------

RUNNER_CPU = []  # the CPU seconds the runner took (its imports included), for the summary line

# The rows a test of its own checks: every target but the checkpoint folder's files, which are named by the folder the
# stopped run wrote (a fixture, made after collection): one test checks them all.
TEST_KEYS = [key for key in path_targets(None) if key[0] != "checkpoint folder"] + [("checkpoint folder", "*")]


def snapshot(root, own):
    """{path: (kind, size, mtime)} of everything under `root` outside the run's own folders."""
    found = {}
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in own]
        for name in names + dirs:
            path = os.path.join(top, name)
            if path not in own:
                st = os.lstat(path)
                regular = stat.S_ISREG(st.st_mode)
                found[path] = (stat.S_IFMT(st.st_mode), st.st_size * regular, st.st_mtime_ns * regular)
    return found


def plant(case, kind, name, mounts):
    """Put plant `name` at case.path (the good file there replaced, unless the plant starts from it)."""
    path = case.path
    if name in ("truncated", "unreadable") and kind in ("file", "out") and case.good:
        PLANTS[name](path)
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if name == "full disk":
        mounts.enter_context(bad_values.full_disk(path if kind == "outdir" else os.path.dirname(path)))
    elif kind in ("folder", "outdir") and name in FOLDER_PLANTS:
        FOLDER_PLANTS[name](path)
    else:
        PLANTS[name](path)


def open_up(root, keep):
    """Every folder under `root` but `keep` writable by anyone: a case run as nobody writes its own folders."""
    for top, _, _ in os.walk(root):
        if top != keep:
            os.chmod(top, 0o777)


def give_to_nobody(root, keep):
    """What a case run as nobody finds in its folder is nobody's (the user's own files), but `keep` (the plant) and
    the hard links its large files share with the suite's fixtures (read only: readable by anyone)."""
    for top, dirs, names in os.walk(root):
        for path in [os.path.join(top, name) for name in dirs + names]:
            if path != keep and os.lstat(path).st_nlink == 1 and not os.path.islink(path):
                os.chown(path, NOBODY, NOBODY)


@dataclasses.dataclass
class Row:
    key: tuple
    plant: str
    kind: str
    expected: str
    why: str
    case: Case = None
    folder: str = ""
    result: dict = None
    untouched: bool = True  # nothing outside the run's own folders changed
    victim: bool = True  # a planted link's victim holds its own content

    def __str__(self):
        return f"{self.key[0]} {self.key[1]}: {self.plant}"

    def problems(self):
        """What the row breaks, in words (none for a row listed, not run)."""
        r, found = self.result, []
        if self.case is None:
            return found
        lines = r["stderr"].strip().splitlines()
        if r["hung"]:
            return [f"hung past {TIMEOUT} s"]
        if "Traceback" in r["stderr"]:
            return ["a traceback: " + r["stderr"][-1500:]]
        if not self.untouched:
            found.append("wrote outside the run's own folders")
        if not self.victim:
            found.append("wrote through the planted link: its victim changed")
        name = os.path.basename(self.case.path)
        if self.plant == "full disk":  # the line names the full folder, or a file in it
            name = os.path.basename(self.case.path if self.kind == "outdir" else os.path.dirname(self.case.path))
        if self.expected == "accepted" and r["code"] != 0:
            found.append(f"exit {r['code']}, expected 0 ({self.why}): {r['stderr'][-600:]}")
        if self.expected == "reports" and (r["code"] in (0, None) or not r["stdout"].strip()):
            found.append(f"exit {r['code']}, expected a report on stdout: {r['stderr'][-600:]}")
        if self.expected == "refused":
            if r["code"] in (0, None):
                found.append(f"exit {r['code']}, expected a refusal: {(r['stderr'] or r['stdout'])[-600:]}")
            elif len(lines) != 1:
                found.append(f"{len(lines)} stderr lines, expected one: {r['stderr'][-900:]}")
            elif name not in lines[0] and not self.why:  # a why says what the line names instead
                found.append(f"the line does not name {name}: {lines[0]}")
        return found


def table_rows(fx, root):
    """A Row for every path input and value, its case arranged in a folder of its own under `root` (skips: none)."""
    rows = []
    for key, target in path_targets(fx["checkpoint folder"]).items():
        for name in PLANTS:
            expected, why = expectation(key, target.kind, name)
            row = Row(key, name, target.kind, expected, why)
            rows.append(row)
            if expected == "skip":
                continue
            row.folder = os.path.join(root, str(len(rows)))
            os.mkdir(row.folder)
            row.case = target.arrange(row.folder, fx)
            if name == "truncated" and not row.case.good:
                row.expected, row.why, row.case = "skip", "no file there to cut: the command makes it", None
    return rows


@pytest.fixture(scope="module")
def fixtures(shared, stopped_checkpoints, tmp_path_factory):
    """Builders of a case's inputs in its folder, each a cheap copy of the suite's shared ones."""
    import mxnet as mx
    from rn50_mx.checkpoint.model_file import MODEL_FIELDS

    base = tmp_path_factory.mktemp("table_inputs")
    model = base / "model"
    model.mkdir()
    data = mx.sym.Variable("data")  # a model evaluate loads: a network of one layer, its parameters, its settings
    mx.sym.FullyConnected(mx.sym.flatten(data), num_hidden=5, name="fc").save(str(model / "m-symbol.json"))
    mx.nd.save(str(model / "m-0000.params"), {"arg:fc_weight": mx.nd.zeros((5, 3072)), "arg:fc_bias": mx.nd.zeros(5)})
    s = config.load(train_flags(shared["data"]), environ={})
    (model / "m-settings.json").write_text(json.dumps({name: getattr(s, name) for name in MODEL_FIELDS}))
    studies = {"done": base / "done", "ended": base / "ended"}
    planted_study(studies["done"], finished={"EVAL_OFFSET": 1})
    planted_study(studies["ended"], finished={"EVAL_OFFSET": 1}, finals=[dict(  # an ended finalist: its folder in
        set="sourced", params={"EVAL_OFFSET": 1}, seed=STUDY_SEED, launcher="local", record=["pgid", 99999, 1],
        folder=f"{PLACE}/res/CPU.finals/1/sourced", ended=True)])               # the case's own (study() puts it)

    def study(root, which):
        res = os.path.join(root, "res")
        os.makedirs(res, exist_ok=True)
        shutil.copy(studies[which] / "CPU.db", os.path.join(res, "CPU.db"))
        if which == "ended":
            with contextlib.closing(sqlite3.connect(os.path.join(res, "CPU.db"))) as db, db:
                db.execute("UPDATE study_user_attributes SET value_json = replace(value_json, ?, ?)", (PLACE, root))
            folder = os.path.join(res, "CPU.finals", "1", "sourced")
            os.makedirs(folder)
            shutil.copy(os.path.join(LOGS, "result_1.txt"), os.path.join(folder, f"seed{STUDY_SEED}.log"))

    def log(path):
        shutil.copy(os.path.join(LOGS, "result_1.txt"), path)
        return path

    return {"data": lambda root: linked_copy(shared["data"], os.path.join(root, "data")),
            "jpegs": lambda root: linked_copy(shared["jpegs"], os.path.join(root, "jpegs")),
            "checkpoints": lambda root: linked_copy(stopped_checkpoints, os.path.join(root, "ckpt")),
            "logs": lambda root: linked_copy(LOGS, os.path.join(root, "logs")),
            "model": lambda root: os.path.join(linked_copy(model, os.path.join(root, "model")), "m"),
            "study": study, "log": log, "checkpoint folder": stopped_checkpoints}


def case_env():
    return {"PATH": ENV_PATH, "HOME": "/tmp", "OMP_NUM_THREADS": "1", **PYTHONPATH}


@pytest.fixture(scope="module")
def table(fixtures):
    """Every Row, run: the runner's result and what is on disk afterwards."""
    root = tempfile.mkdtemp(prefix="rn50-table-")  # under /tmp, open to nobody (pytest's own folders are not)
    os.chmod(root, 0o755)
    try:
        with contextlib.ExitStack() as mounts:
            rows = table_rows(fixtures, root)
            cases, before = [], {}
            for index, row in enumerate(rows):
                if row.case is None:
                    continue
                plant(row.case, row.kind, row.plant, mounts)
                open_up(row.folder, keep=row.case.path if row.plant == "unreadable" else None)
                as_nobody = row.plant == "unreadable" and AS_ROOT
                if as_nobody:
                    give_to_nobody(row.folder, keep=row.case.path)
                before[index] = snapshot(row.folder, row.case.own)
                cases.append({"id": str(index), "module": row.case.module, "argv": row.case.argv, "env": case_env(),
                              "cwd": row.folder, "uid": NOBODY if as_nobody else None,
                              "timeout": TIMEOUT})
            before_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
            results = run_cases(cases)
            after_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
            RUNNER_CPU.append(after_cpu.ru_utime + after_cpu.ru_stime - before_cpu.ru_utime - before_cpu.ru_stime)
            for index, row in enumerate(rows):
                if row.case is None:
                    continue
                row.result = results[str(index)]
                row.untouched = before[index] == snapshot(row.folder, row.case.own)
                if row.plant == "link elsewhere" and os.path.lexists(row.case.path + ".victim"):
                    row.victim = bad_values.victim_intact(row.case.path)
        yield rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("key", TEST_KEYS, ids=lambda key: f"{key[0]} {key[1]}")
def test_a_thing_planted_at_a_path_input_is_one_line_naming_it(key, table):
    """Each value planted at this input: one line naming it, non-zero, no traceback, no hang, nothing written
    outside the run's folders; or what DIFFERENT says instead."""
    rows = [row for row in table if row.key == key or key[1] == "*" and row.key[0] == key[0]]
    assert rows, key
    failures = [f"{row}: {problem}" for row in rows for problem in row.problems()]
    assert not failures, "\n".join(failures)


def test_every_input_is_probed_or_listed(table, capsys):
    """Every input that takes a text is a path the table plants at or is listed with a reason; every listed one is
    still an input (a stale entry is a row no one probes). Prints the table's size."""
    targets = {key for key in path_targets(None)}
    texts = [(("settings" if i.tool == "settings" else i.tool), i.name) for i in INPUTS if i.kind == "text"
             and not (i.tool == "settings" and not i.name.startswith("--"))]
    unlisted = [key for key in texts if key not in targets and key not in NOT_PATHS]
    assert not unlisted, f"inputs neither probed (PATHS) nor listed (NOT_PATHS) with a reason: {unlisted}"
    stale = [key for key in NOT_PATHS if key not in texts]
    assert not stale, f"NOT_PATHS lists what is no input: {stale}"
    texted = [i for i in INPUTS if i.kind != "switch"]
    run = [row for row in table if row.case is not None]
    inputs = {row.key for row in table}
    settings = sum(i.tool == "settings" for i in texted)
    by_command = {}
    for row in run:
        by_command[row.case.module] = by_command.get(row.case.module, 0) + (row.result["seconds"] or 0)
    with capsys.disabled():
        print(f"\ninput table: {len(texted)} inputs ({settings} of training's settings, which {len(SETTINGS_USERS)} "
              f"commands take) x {len(bad_values.NAMES)} texts = "
              f"{len(texted) * len(bad_values.NAMES)} parses; {len(inputs)} path inputs x {len(PLANTS)} plants = "
              f"{len(table)} cases: {len(run)} run, {len(table) - len(run)} listed with a reason "
              f"(the runner: {sum(RUNNER_CPU):.1f} CPU s; its cases {sum(r.result['seconds'] or 0 for r in run):.1f} s: "
              + ", ".join(
                  f"{module.replace('rn50_mx.', '')} {seconds:.1f} s" for module, seconds in sorted(
                      by_command.items(), key=lambda item: -item[1])) + ")")
