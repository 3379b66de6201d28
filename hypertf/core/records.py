"""The JSON records HyperTF keeps in ZooKeeper (an agent's record, its GPUs) and their
encoding with a format number: pure, so the scheduler, the spec and the probes that build
or read them need no ZooKeeper client.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hypertf.core.errors import StoreError

FORMAT = 1
# ZooKeeper refuses a znode larger than jute.maxbuffer (1 MiB by default); stay under it.
MAX_ZNODE_BYTES = 1024 * 1024 - 1024
# Every record is hostile input (docs/zookeeper-layout.md, "Trust"): none HyperTF writes
# nests deeper than 6, and Python's JSON parser raises RecursionError past ~1,000.
MAX_DEPTH = 32
MAX_AGENT_RECORD_BYTES = 512 * 1024  # 64 GPUs with 1,000 processes each stay far below
MAX_HOST_GPUS = 1024  # a record's own claim; the keeper caps it lower (hypertf_host_gpus_max)
MAX_GPU_PROCESSES = 4096
MAX_REPORTS = 1024  # drained keys, trespasses
MAX_TEXT = 1024  # a name, a UUID, a reason, a version


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (NVML's list) and the HyperTF job it belongs to, if any
    (its ``HYPERTF_TASK_KEY``): any other process is foreign."""

    pid: int
    memory: int | None = None  # bytes; None when the driver does not say
    task_key: str | None = None


OPTIONAL_GPU_FIELDS = ("reason", "mig", "processes")  # left out of the JSON when empty
OPTIONAL_RECORD_FIELDS = ("drained", "trespasses", "confine")


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
        has processes, the usual case), typed and ranged: TypeError names what is wrong."""
        processes = payload.pop("processes", None)
        if processes:
            _check(isinstance(processes, list) and len(processes) <= MAX_GPU_PROCESSES,
                   "a GPU's 'processes' is not a list of at most "
                   f"{MAX_GPU_PROCESSES} processes")
            payload["processes"] = [_process(p) for p in processes]
        gpu = cls(**payload)
        _check(_is_int(gpu.index) and 0 <= gpu.index < MAX_HOST_GPUS,
               f"a GPU's 'index' is not an integer below {MAX_HOST_GPUS}")
        _check(_is_text(gpu.name) and _is_text(gpu.uuid) and _is_text(gpu.reason),
               f"GPU {gpu.index}'s name, uuid or reason is not a short text")
        _check(_is_number(gpu.utilization) and _is_count(gpu.memory_used)
               and _is_count(gpu.memory_total),
               f"GPU {gpu.index}'s utilization or memory is not a finite number")
        _check(type(gpu.available) is bool and type(gpu.mig) is bool,
               f"GPU {gpu.index}'s available or mig is not true/false")
        return gpu


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
    # What the node enforces (hypertf.node.confine): 'devices+cgroup', 'cgroup' or
    # 'none: <why>'; '' from an agent older than confinement.
    confine: str = ""

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
        """The whole record, every field typed and ranged (StoreError naming the host and
        the field otherwise): what the keeper and the launcher decide by."""
        record, gpus = cls.without_gpus(data)
        try:
            built = [GpuInfo.from_dict(gpu) for gpu in gpus]
            indices = [gpu.index for gpu in built]
            _check(len(set(indices)) == len(indices)
                   and all(index < record.gpu for index in indices),
                   f"'gpus' holds indices {indices[:8]} for a host of {record.gpu} GPUs")
            return replace(record, gpus=built)
        except (TypeError, AttributeError) as err:  # missing or unknown fields, wrong shapes
            raise _unreadable(record.host, err) from None

    @classmethod
    def without_gpus(cls, data: bytes) -> tuple[AgentRecord, list[dict[str, Any]]]:
        """The record with no GpuInfo built (``gpus`` empty; ``gpu`` and
        ``gpu_avail_list`` kept) and its GPUs as the JSON's mappings: at 10,000 hosts,
        building 80,000 GpuInfo was most of a ``hypertf status`` that shows a few fields."""
        payload = decode(data, "agent record", limit=MAX_AGENT_RECORD_BYTES)
        gpus = payload.pop("gpus", [])
        try:
            _check(isinstance(gpus, list) and len(gpus) <= MAX_HOST_GPUS
                   and all(isinstance(g, dict) for g in gpus),
                   "'gpus' is not a list of objects")
            drained = payload.get("drained", [])
            _check(isinstance(drained, list) and len(drained) <= MAX_REPORTS
                   and all(_is_text(k) for k in drained),
                   "'drained' is not a list of task keys")
            if "trespasses" in payload:
                trespasses = payload["trespasses"]
                _check(isinstance(trespasses, list) and len(trespasses) <= MAX_REPORTS,
                       f"'trespasses' is not a list of at most {MAX_REPORTS}")
                payload["trespasses"] = [_trespass(t) for t in trespasses]
            record = cls(**payload)
            _check_record(record)
            return record, gpus
        except (TypeError, AttributeError) as err:  # missing or unknown fields, wrong shapes
            raise _unreadable(payload.get("host", "?"), err) from None


def _check(ok: object, what: str) -> None:
    """TypeError saying ``what`` is wrong unless ``ok``: the record parsers turn it into a
    StoreError naming the host."""
    if not ok:
        raise TypeError(what)


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_count(value: object) -> bool:
    """A non-negative integer (memory in bytes, a PID)."""
    return type(value) is int and value >= 0


def _is_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _is_text(value: object, limit: int = MAX_TEXT) -> bool:
    return type(value) is str and len(value) <= limit


def _is_address(value: object) -> bool:
    """An IP address literal (never a name: a name would be resolved by whoever reads)."""
    if not isinstance(value, str) or len(value) > 64:
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _process(payload: object) -> GpuProcess:
    _check(isinstance(payload, dict), "a GPU's process is not an object")
    process = GpuProcess(**payload)  # type: ignore[arg-type]
    _check(_is_count(process.pid) and (process.memory is None or _is_count(process.memory))
           and (process.task_key is None or _is_text(process.task_key)),
           "a GPU process's pid, memory or task_key is of the wrong type")
    return process


def _trespass(payload: object) -> Trespass:
    _check(isinstance(payload, dict), "a trespass is not an object")
    found = Trespass(**payload)  # type: ignore[arg-type]
    _check(_is_count(found.pid) and _is_int(found.gpu) and type(found.stopped) is bool
           and all(_is_text(v) for v in (found.uuid, found.claims, found.holder, found.how,
                                         found.user)),
           "a trespass's fields are of the wrong types")
    return found


def _check_record(record: AgentRecord) -> None:
    """The top-level fields typed and ranged: GPU counts are integers up to
    MAX_HOST_GPUS (the keeper caps them lower), the available list within them, addresses
    IP literals, the port a port, times finite."""
    _check(_is_text(record.host, 255) and _is_text(record.hostname, 255),
           "'host' or 'hostname' is not a short text")
    _check(_is_address(record.mgmt_addr) and _is_address(record.data_addr),
           "'mgmt_addr' or 'data_addr' is not an IP address")
    _check(_is_int(record.port) and 0 <= record.port <= 65535,
           "'port' is not an integer from 0 to 65535")
    _check(_is_int(record.gpu) and 0 <= record.gpu <= MAX_HOST_GPUS,
           f"'gpu' is not an integer from 0 to {MAX_HOST_GPUS}")
    avail = record.gpu_avail_list
    _check(isinstance(avail, list) and all(_is_int(i) and 0 <= i < record.gpu for i in avail)
           and len(set(avail)) == len(avail),
           f"'gpu_avail_list' holds indices outside the host's {record.gpu} GPUs")
    _check(_is_text(record.gpu_source) and isinstance(record.gpu_driver, dict)
           and len(record.gpu_driver) <= 16
           and all(_is_text(k) and _is_text(v) for k, v in record.gpu_driver.items()),
           "'gpu_source' or 'gpu_driver' is not text")
    _check(_is_number(record.heartbeat) and _is_count(record.pid),
           "'heartbeat' or 'pid' is not a finite number")
    _check(_is_text(record.confine, 300) and record.confine.isprintable(),
           "'confine' is not a short printable text")


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


def decode(data: bytes, what: str, fmt: int = FORMAT,
           limit: int = MAX_ZNODE_BYTES, walk: bool = True) -> dict[str, Any]:
    """Parse a record, refusing formats this version does not know (``fmt``: the one).
    Every record is hostile input: one over ``limit`` bytes, nested deeper than MAX_DEPTH
    or not JSON is a StoreError like any unreadable record (never a RecursionError that
    would stop the reader for everyone). ``walk`` False: the caller checks the shape of
    every value itself (a matrix shard: flat rows), so the depth walk is left out."""
    if len(data) > limit:
        raise StoreError(f"ZooKeeper holds an unreadable {what}: {len(data):,} bytes, "
                         f"over the {limit:,} one may have")
    try:
        payload = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else err
        raise StoreError(f"ZooKeeper holds an unreadable {what}: {reason}") from None
    if walk and data.count(b"[") + data.count(b"{") > MAX_DEPTH and too_deep(payload):
        raise StoreError(f"ZooKeeper holds an unreadable {what}: nested deeper than "
                         f"{MAX_DEPTH} levels")
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




def plain_text(value: object, limit: int | None = None, instead: str = "") -> str:
    """Text a record's writer chose, as another user's terminal may show it: at most
    ``limit`` characters, each control character (an escape sequence that retitles, clears
    or rewrites the terminal) replaced by ``instead``; "" for anything but text."""
    if not isinstance(value, str):
        return ""
    text = value if limit is None else value[:limit]
    return text if text.isprintable() else "".join(c if c.isprintable() else instead
                                                   for c in text)


def too_deep(payload: object, limit: int = MAX_DEPTH) -> bool:
    """Whether ``payload`` nests lists and objects deeper than ``limit`` (a walk with its
    own stack: a reader that recursed would be the thing it guards)."""
    stack: list[tuple[object, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
