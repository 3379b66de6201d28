"""Kueue: the queue HyperTF's keeper plays, on Kubernetes.

A LocalQueue admits a workload whole (every pod's quota or none): the JobSet, Volcano Job
and TFJob are each one workload, plain Jobs one each. ``--priority N`` orders the queue the
way HyperTF's keeper does through a WorkloadPriorityClass, which only Kueue reads (a
PriorityClass would also let the kube-scheduler preempt running pods).
"""

from __future__ import annotations

from typing import Any

QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"
API = "kueue.x-k8s.io/v1beta2"  # Kueue's storage version since v0.15 (v1beta1 deprecated)


def priority_class_name(priority: int) -> str:
    """--priority N as a class name ('hypertf-priority-5', '...-minus-5')."""
    return f"hypertf-priority-{'minus-' if priority < 0 else ''}{abs(priority)}"


def workload_priority_class(priority: int) -> dict[str, Any]:
    """Cluster-scoped: applied once by someone allowed to (docs/kubernetes.md)."""
    return {
        "apiVersion": API, "kind": "WorkloadPriorityClass",
        "metadata": {"name": priority_class_name(priority)},
        "value": priority,
        "description": f"hypertf --priority {priority}: queue order",
    }


def labels(queue: str | None, priority: int) -> dict[str, str]:
    """The labels that put a workload in a LocalQueue at a priority (none without --queue:
    the priority is then a PriorityClass)."""
    if not queue:
        return {}
    result = {QUEUE: queue}
    if priority:
        result[PRIORITY] = priority_class_name(priority)
    return result
