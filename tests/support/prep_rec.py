"""Running `python -m rn50_mx.prep_rec` as a user would, and reading what it wrote."""
import subprocess
import sys

import mxnet as mx


def cli(*args):
    """Run `python -m rn50_mx.prep_rec ARGS` as a user would, without a terminal."""
    return subprocess.run([sys.executable, "-m", "rn50_mx.prep_rec", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def assert_one_line_error(result, name):
    """Failed with exactly one stderr line, which names `name`, and no traceback."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(name) in lines[0] and "Traceback" not in result.stderr


def read_records(prefix):
    """{key: (IRHeader, image bytes)} of PREFIX.rec through mxnet's own reader, and the keys in .idx order."""
    records = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r")
    try:
        return {key: mx.recordio.unpack(records.read_idx(key)) for key in records.keys}, list(records.keys)
    finally:
        records.close()


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()
