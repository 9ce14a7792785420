"""Python imports this at start-up when its folder is on PYTHONPATH (tests/support/stuck.py's environ): a process
whose STALL_TEST_STUCK_READER names a FIFO and a batch number gets the stuck reader before any of its own code runs."""
import os

if os.environ.get("STALL_TEST_STUCK_READER"):
    from tests.support import stuck

    never, at = os.environ["STALL_TEST_STUCK_READER"].rsplit(" ", 1)
    stuck.stick(never, int(at))
