"""The JSON records HyperTF keeps in ZooKeeper (an agent's record, its GPUs) and their
encoding with a format number: pure, so the scheduler, the spec and the probes that build
or read them need no ZooKeeper client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hypertf.core.errors import StoreError

FORMAT = 1
# ZooKeeper refuses a znode larger than jute.maxbuffer (1 MiB by default); stay under it.
MAX_ZNODE_BYTES = 1024 * 1024 - 1024


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (NVML's list) and the HyperTF job it belongs to, if any
    (its ``HYPERTF_TASK_KEY``): any other process is foreign."""

    pid: int
    memory: int | None = None  # bytes; None when the driver does not say
    task_key: str | None = None


OPTIONAL_GPU_FIELDS = ("reason", "mig", "processes")  # left out of the JSON when empty
OPTIONAL_RECORD_FIELDS = ("drained", "trespasses")


@dataclass(frozen=True)
class Trespass:
    """A process on a GPU of this host that is not granted to its job: ``claims`` the job
    its HYPERTF_TASK_KEY names ("" for none), ``holder`` the job the GPU is granted to
    ("" when it is granted to none), ``how`` how the agent saw it ("nvml": on the GPU;
    "env": its CUDA_VISIBLE_DEVICES names the GPU's UUID), ``stopped`` whether the agent
    stopped its process group (``hypertf_gpu_enforce: stop``)."""

    pid: int
    gpu: int
    uuid: str
    claims: str
    holder: str
    how: str
    stopped: bool = False
    user: str = ""  # the process's owner (a login name)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the agent saw it; ``reason`` says why it is not available."""

    index: int
    name: str
    uuid: str
    utilization: float  # percent
    memory_used: int  # bytes
    memory_total: int  # bytes
    available: bool
    reason: str = ""
    mig: bool = False
    processes: list[GpuProcess] = field(default_factory=list)

    def foreign_processes(self, task_key: str | None) -> list[GpuProcess]:
        """Processes on this GPU that are not of ``task_key`` (the job holding it)."""
        return [p for p in self.processes if task_key is None or p.task_key != task_key]

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> GpuInfo:
        """From the record's JSON (80,000 of them at 10,000 hosts: no work when no GPU
        has processes, the usual case)."""
        processes = payload.pop("processes", None)
        if processes:
            payload["processes"] = [GpuProcess(**p) for p in processes]
        return cls(**payload)


@dataclass(frozen=True)
class AgentRecord:
    """The per-node record of the original design, plus detail.

    ``gpu`` and ``gpu_avail_list`` keep the original field names: 4 GPUs of which #1, #2
    and #4 are idle give ``gpu=4, gpu_avail_list=[0, 1, 3]``.
    """

    host: str
    mgmt_addr: str
    data_addr: str
    port: int
    gpu: int
    gpu_avail_list: list[int]
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_source: str = "none"
    gpu_driver: dict[str, str] = field(default_factory=dict)  # driver, NVML, CUDA versions
    heartbeat: float = 0.0
    pid: int = 0
    hostname: str = ""
    # The agent's reports (it decides nothing): ended jobs whose processes it has seen dead
    # on this host (the keeper frees their draining cells here), and processes on GPUs of
    # this host not granted to their job (docs/gpu.md, "Trespasses").
    drained: list[str] = field(default_factory=list)
    trespasses: list[Trespass] = field(default_factory=list)

    def to_json(self) -> bytes:
        """The record; a GPU's ``reason``, ``mig`` and ``processes`` only when they say
        something (1000 hosts' records are read whole: every byte counts 8000 times), and
        the reports only when there are some."""
        payload = asdict(self)
        for key in OPTIONAL_RECORD_FIELDS:
            if not payload[key]:
                del payload[key]
        for gpu in payload["gpus"]:
            for key in OPTIONAL_GPU_FIELDS:
                if not gpu[key]:
                    del gpu[key]
        return encode(payload)

    @classmethod
    def from_json(cls, data: bytes) -> AgentRecord:
        record, gpus = cls.without_gpus(data)
        try:
            return replace(record, gpus=[GpuInfo.from_dict(gpu) for gpu in gpus])
        except (TypeError, AttributeError) as err:  # missing or unknown fields, wrong shapes
            raise _unreadable(record.host, err) from None

    @classmethod
    def without_gpus(cls, data: bytes) -> tuple[AgentRecord, list[dict[str, Any]]]:
        """The record with no GpuInfo built (``gpus`` empty; ``gpu`` and
        ``gpu_avail_list`` kept) and its GPUs as the JSON's mappings: at 10,000 hosts,
        building 80,000 GpuInfo was most of a ``hypertf status`` that shows a few fields."""
        payload = decode(data, "agent record")
        gpus = payload.pop("gpus", [])
        try:
            if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
                raise TypeError("'gpus' is not a list of objects")
            drained = payload.get("drained", [])
            if not isinstance(drained, list) or not all(isinstance(k, str) for k in drained):
                raise TypeError("'drained' is not a list of task keys")
            if "trespasses" in payload:
                payload["trespasses"] = [Trespass(**t) for t in payload["trespasses"]]
            return cls(**payload), gpus
        except (TypeError, AttributeError) as err:  # missing or unknown fields, wrong shapes
            raise _unreadable(payload.get("host", "?"), err) from None


def _unreadable(host: object, err: Exception) -> StoreError:
    return StoreError(f"ZooKeeper holds an unreadable agent record (host {host!r}): "
                      f"{err}; restart that host's agent to rewrite it")


def encode(payload: Mapping[str, Any], fmt: int = FORMAT) -> bytes:
    """JSON bytes with the format number first (``fmt``: a record whose layout changed
    has its own); refuses what ZooKeeper would refuse."""
    fields = {key: value for key, value in payload.items() if key != "format"}
    data = json.dumps({"format": fmt, **fields}, separators=(",", ":")).encode()
    if len(data) > MAX_ZNODE_BYTES:
        raise StoreError(
            f"a record of {len(data)} bytes is over ZooKeeper's 1 MiB znode limit "
            f"(jute.maxbuffer): split the cluster into several hypertf_zk_root roots, or "
            f"raise jute.maxbuffer on every ZooKeeper server and client"
        )
    return data


def decode(data: bytes, what: str, fmt: int = FORMAT) -> dict[str, Any]:
    """Parse a record, refusing formats this version does not know (``fmt``: the one)."""
    try:
        payload = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StoreError(f"ZooKeeper holds an unreadable {what}: {err}") from None
    if not isinstance(payload, dict):
        raise StoreError(
            f"ZooKeeper holds an unreadable {what}: expected a JSON object, "
            f"got {type(payload).__name__}"
        )
    version = payload.pop("format", None)
    if type(version) is not int or version != fmt:
        raise StoreError(
            f"ZooKeeper holds a {what} in format {version!r}; this HyperTF reads format "
            f"{fmt}: upgrade HyperTF on every node, or use another hypertf_zk_root"
        )
    return payload


