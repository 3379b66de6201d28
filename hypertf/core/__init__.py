"""Pure logic: formats, the matrix, placement, admission, the cluster spec, a job's
fate. No ZooKeeper, SSH, Invoke, Ansible or terminal library (an import contract)."""

# The public modules (each holds one concept; import the module, not a name from here).
__all__ = ["admission", "diagnose", "errors", "gctune", "grants", "jobrecord",
           "jobtransitions", "layout", "limits", "matrix", "monitor", "offloadname",
           "placement", "records", "requestcheck", "rundir", "scheduler",
           "spec", "taskenv", "timeline"]
