"""What the launcher tells a task's offload runner, and what it makes of the counts: pure,
with no MPI, numpy or shared memory, so a controller without hypertf[offload] can launch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypertf.core.jobrecord import OffloadSummary
from hypertf.offload import DEFAULT_MIN_FLOPS

DEFAULT_PORT_RANGE = (21000, 21999)  # hypertf_offload_port_range's default


@dataclass(frozen=True)
class OffloadHost:
    """An offload host as the task's node reaches it over SSH."""

    address: str
    port: int = 22
    user: str | None = None
    python: str = "python3"  # its venv's python


@dataclass(frozen=True)
class Spec:
    """What the launcher tells a task's runner (JSON on its command line)."""

    hosts: tuple[OffloadHost, ...]
    channel: str  # POSIX name of the task's channel (shared memory, semaphores)
    local_address: str  # this node's address on the data network: the interface to use
    known_hosts: str
    key_file: str | None = None
    min_flops: int = DEFAULT_MIN_FLOPS
    start_timeout: float = 60.0
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE  # mpiexec's control port (hydra)

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "hosts": [h.__dict__ for h in self.hosts]},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        fields = json.loads(text)
        low, high = fields.get("port_range", DEFAULT_PORT_RANGE)
        return cls(**{**fields, "hosts": tuple(OffloadHost(**h) for h in fields["hosts"]),
                      "port_range": (int(low), int(high))})


def command(spec: Spec, private: str, out: str, argv: Sequence[str]) -> list[str]:
    """The task's command line with its runner (the launcher builds it)."""
    return ["python", "-m", "hypertf.offload.runner", "--spec", spec.to_json(),
            "--private", private, "--out", out, "--", *argv]


def summarize(per_task: Mapping[str, dict[str, Any]], hosts: Sequence[str]) -> OffloadSummary:
    """The job's offload over its ``hosts``, summed over its tasks (summary.json, the
    launcher's last line)."""
    def total(key: str) -> int:
        return sum(t.get(key, 0) for t in per_task.values())

    seconds = round(sum(float(t.get("seconds", 0.0)) for t in per_task.values()), 3)
    failed = {name: t["failed"] for name, t in per_task.items() if t.get("failed")}
    return OffloadSummary(ops=total("ops"), bytes=total("bytes"), fallbacks=total("fallbacks"),
                          local=total("local"), restarts=total("restarts"), seconds=seconds,
                          hosts=list(hosts), failed=failed, tasks=dict(per_task))


def line(summary: OffloadSummary) -> str:
    """``offloaded N matmuls (X GB, Y s) over K hosts``, and the fallbacks if any."""
    text = (f"hypertf: offloaded {summary['ops']} matmuls ({summary['bytes'] / 1e9:.3g} GB, "
            f"{summary['seconds']:.1f} s) over {len(summary['hosts'])} hosts")
    if summary["fallbacks"] or summary["failed"]:
        text += (f"; {summary['fallbacks']} computed locally after a failure "
                 f"({'; '.join(f'{k}: {v}' for k, v in sorted(summary['failed'].items()))})")
    if summary.get("restarts"):
        text += f"; the offload world was started again {summary['restarts']} time(s)"
    return text
