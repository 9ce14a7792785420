"""The tests' stand-in devices are the rehearsal's (rn50_mx.standin.devices): a model on cpu(1), not the default
context cpu(0), with mixed contexts refused, device id included. A whole run goes on them with --standin devices
(support.runs.on_rank_devices)."""
from rn50_mx.standin.devices import device, host_save, install, same_context_check

__all__ = ["RUN_CONTEXT", "host_save", "install", "same_context_check"]
RUN_CONTEXT = device(0)  # the stand-in for one rank's GPU: not the default context, which is cpu(0)
