"""Python imports this at start-up when its folder is on PYTHONPATH (tests/support/stuck.py's environ): a training
process whose STALL_TEST_STUCK_READER or STALL_TEST_HELD_READER names a FIFO and a batch number gets the stuck or
held reader before any of its own code runs. Other processes (horovodrun, the search's driver) are left as they are."""
import sys

if "rn50_mx.train" in sys.orig_argv:
    from tests.support import stuck

    stuck.from_environ()
