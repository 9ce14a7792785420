from ..errors import run_cli
from . import main

run_cli(main, "python -m rn50_mx.search")
