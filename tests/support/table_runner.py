"""The hostile table's cases of one tool, each run in this one process as `python -m TOOL ARGV` runs it (the module's
code as __main__, its run_cli's own line and exit status), so that MXNet, DALI and Optuna load once per tool rather
than once per case (2-3 s each here). What a process gives a case for free is put back after each: its environment,
working folder, effective user, signal handlers, standard output and error, and the MLPerf logger's file.

    python tests/support/table_runner.py < cases.json      (a JSON list of cases)

A case: {"id", "module", "argv", "env" (the whole environment), "cwd", "uid" (run as this user: root reads through
chmod 0), "timeout" (seconds)}. Per case, stdout gets the line `begin ID` before it runs and then one JSON line
{"id", "code", "stdout", "stderr", "seconds", "hung"}: a case still running after its timeout is interrupted by
SIGALRM (a read blocked on a FIFO ends so) and reported hung; one that never returns to Python is found by the
caller, which sees its `begin` without a result."""
import contextlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # run as a script: its folder, not the checkout, is on sys.path

from rn50_mx import errors, mlperf_log  # noqa: E402
from tests.support.procs import PYTHONPATH  # noqa: E402


class Hung(BaseException):
    """The case ran past its timeout."""


def quit_now(line, code):
    """errors.quit_now without its os._exit: the line, then the status as SystemExit, whatever threads a case left
    (a worker blocked on a FIFO would otherwise end this process with the case)."""
    print(line, file=sys.stderr)
    raise SystemExit(code)


def alarm(signum, frame):
    raise Hung()


def linked_copy(src, dest):
    """A copy of the tree `src` at `dest` (when not there yet) whose large files are hard links (cheap: a plant
    replaces a file, the code renames, neither writes into one) and whose small ones are copies (a lock or a study
    written in place, a file a case gives to another user). Returns `dest` as text."""
    def link_or_copy(source, target):
        return os.link(source, target) if os.path.getsize(source) > 1 << 20 else shutil.copy2(source, target)
    if not os.path.exists(dest):
        shutil.copytree(src, dest, copy_function=link_or_copy)
    return str(dest)


@contextlib.contextmanager
def as_user(uid):
    """This process as user `uid` (and its group) for the duration, then root again: what a file's owner can and
    cannot read where the suite runs as root, which reads through chmod 0. Process-wide (every thread's)."""
    os.setegid(uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def reset_mllog():
    """The MLPerf logger as a new process has it: no file handler, no log file owned."""
    logger = mlperf_log._logger.logger
    for handler in list(logger.handlers):
        if hasattr(handler, "baseFilename"):
            logger.removeHandler(handler)
            try:
                handler.close()
            except OSError:  # its last lines on a full disk: the case has said so already
                handler.stream = None
    mlperf_log._file_lock = None
    mlperf_log._rank = 0


def run_case(case, saved_fds):
    """Run one case; its result dict."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    environ, cwd, argv = dict(os.environ), os.getcwd(), sys.argv
    code, hung, start = None, False, time.time()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    try:
        os.environ.clear()
        os.environ.update(case["env"])
        os.chdir(case["cwd"])
        sys.argv = [case["module"], *case["argv"]]
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(case["timeout"])
        try:
            with as_user(case["uid"]) if case.get("uid") is not None else contextlib.nullcontext():
                runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except Hung:
            hung = True
        except BaseException:  # what the interpreter would print and exit 1 with
            traceback.print_exc()
            code = 1
        finally:
            signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        reset_mllog()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = argv
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    return {"id": case["id"], "code": code, "stdout": texts[0][-4000:], "stderr": texts[1][-4000:],
            "seconds": round(time.time() - start, 3), "hung": hung}


def run_cases(cases, grace=120):
    """{id: result} of `cases` (this script's), run in as few processes as it takes: one whose case never returns
    to Python (its `begin` not followed by a result within its timeout and `grace` seconds: the first case also
    pays the imports) is killed, that case reported hung, and the cases after it run in a new process."""
    results, pending = {}, list(cases)
    while pending:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **PYTHONPATH},
                                cwd=ROOT, start_new_session=True)
        proc.stdin.write(json.dumps(pending).encode())
        proc.stdin.close()
        lines = LineReader(proc.stdout.fileno())
        current = None
        while True:
            timeout = grace + (current["timeout"] if current else 0)
            line = lines.next(timeout)
            if line is None:  # ended, or silent past its deadline
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            if line.startswith("begin "):
                current = next(case for case in pending if case["id"] == line[len("begin "):])
            elif line.startswith("{"):
                result = json.loads(line)
                results[result["id"]] = result
                current = None
        done = [case for case in pending if case["id"] in results]
        if current is not None:  # killed past its deadline, or died in it (the runner's own words kept)
            killed = proc.returncode == -signal.SIGKILL
            results[current["id"]] = {"id": current["id"], "code": None, "stdout": "", "seconds": None,
                                      "stderr": "never returned to Python: killed" if killed else
                                      f"the runner died in this case ({proc.returncode}): {lines.text[-2000:]}",
                                      "hung": killed}
        elif len(done) < len(pending):
            raise RuntimeError(f"table_runner ended before its cases ran: {lines.text[-3000:]}")
        pending = [case for case in pending if case["id"] not in results]
    return results


class LineReader:
    """Lines from a descriptor, each waited for `timeout` seconds at most; what else came is kept in `text`."""

    def __init__(self, fd):
        self.fd, self.buffer, self.text = fd, b"", ""

    def next(self, timeout):
        deadline = time.time() + timeout
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.time()))
            chunk = os.read(self.fd, 1 << 16) if ready else b""
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        text = line.decode("utf-8", "replace")
        self.text += text + "\n"
        return text


def main():
    cases = json.load(sys.stdin)
    # Imported as root, before a case runs as another user: this Python's own library lies in root's home here,
    # which nobody cannot read (a user's own Python reads its own). The tools' modules, and what they import on
    # first use only (a tool that refuses its input loads none of it).
    for module in {case["module"] for case in cases} | {"matplotlib.pyplot", "optuna", "nvidia.dali", "mxnet",
                                                        "mlperf_logging.result_summarizer.result_summarizer",
                                                        "mlperf_logging.rcp_checker.rcp_checker"}:
        __import__(module)
    errors.quit_now = quit_now
    # runpy's note that a module it runs as __main__ was imported already (here, by design): no command prints it
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    saved = (os.dup(1), os.dup(2))
    report = os.fdopen(os.dup(1), "w", buffering=1)
    for case in cases:
        report.write(f"begin {case['id']}\n")
        report.write(json.dumps(run_case(case, saved)) + "\n")
    report.close()
    os._exit(0)  # threads a case left blocked (a FIFO read) are not waited for


if __name__ == "__main__":
    main()
