"""The export targets' names, in the order help lists them: the one table both the CLI's help
(every command builds it: no renderer imported) and hypertf.export.targets (one Target per
name) go by."""

from __future__ import annotations

TARGETS = ("jobset", "volcano", "k8s", "tfjob", "marathon", "docker")
RECOMMENDED = "jobset"  # the Kubernetes target: TFJob and Marathon are legacy


def target_names() -> str:
    """The targets as help text names them: 'jobset (recommended), volcano, ... or docker';
    the CLI's help says this instead of a copy that misses a new one."""
    names = [f"{name} (recommended)" if name == RECOMMENDED else name for name in TARGETS]
    return f"{', '.join(names[:-1])} or {names[-1]}"
