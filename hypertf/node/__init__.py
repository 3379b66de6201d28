"""What runs on each GPU server: the resource agent, its probes and metrics, and the
node side of a job (tasknode). Imports nothing of the launcher, the CLI or ops."""

# The public modules (import the module, not a name from here).
__all__ = ["agent", "dcgmmap", "metrics", "probes", "procs", "runcontrol", "service",
           "tasknode", "taskwatch", "trespass"]
