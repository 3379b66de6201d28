"""What the agent measures on its node: NIC addresses, a free port, and the GPUs.

GPUs come from a *source*: ``NvmlGpuSource`` reads real hardware through NVML
(``pynvml`` from nvidia-ml-py); ``StaticGpuSource`` is the clearly named stand-in for
machines without GPUs (tests, the lab, CPU-only nodes), described in the inventory or in a
JSON file that is re-read on every probe so a test can make a GPU busy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import random
import socket
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import netifaces

from hypertf.config.settings import GpuSourceKind
from hypertf.core.errors import HyperTFError, InventoryError
from hypertf.core.records import GpuInfo, GpuProcess
from hypertf.node import procs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    """Raw figures for one GPU, before the availability rules are applied; ``fault`` says
    why it could not be read (it is then unavailable, the node's other GPUs are not)."""

    index: int
    name: str
    uuid: str
    utilization: float
    memory_used: int
    memory_total: int
    processes: tuple[GpuProcess, ...] = ()  # compute processes (pid, memory); no task keys yet
    mig: bool = False
    fault: str = ""
    minor: int = -1  # its device node's minor, /dev/nvidia<minor> (-1: unknown: the index)


class GpuSource(Protocol):
    """Anything that can list the node's GPUs (and name its driver's versions)."""

    name: GpuSourceKind

    def read(self) -> list[GpuReading]: ...

    def versions(self) -> dict[str, str]: ...


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error(err: BaseException) -> str:
    """NVML's error, short: ``NVMLError_GpuIsLost: GPU is lost``."""
    return f"{type(err).__name__}: {err}"


class NvmlGpuSource:
    """Real GPUs through NVML. No driver or no GPU means zero GPUs, not an error; a GPU
    that fails to answer is reported with its fault while the others stay usable."""

    name = GpuSourceKind.NVML

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._ready = False
        self._versions: dict[str, str] | None = None

    def _init(self) -> ModuleType | None:
        if self._ready:
            return self._nvml
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
            log.info("NVML unavailable (%s): this node reports zero GPUs", err)
            return None
        self._ready = True
        return self._nvml

    def versions(self) -> dict[str, str]:
        """Driver, NVML and CUDA driver versions; what cannot be read is left out. Read once
        per NVML initialisation (a driver reload restarts NVML, and so reads them again)."""
        nvml = self._init()
        if nvml is None:
            return {}
        if self._versions is None:
            self._versions = self._read_versions(nvml)
        return self._versions

    @staticmethod
    def _read_versions(nvml: ModuleType) -> dict[str, str]:
        found = {}
        for key, function in (("driver", "nvmlSystemGetDriverVersion"),
                              ("nvml", "nvmlSystemGetNVMLVersion"),
                              ("cuda", "nvmlSystemGetCudaDriverVersion")):
            with contextlib.suppress(Exception):  # an old driver lacks the call
                value = getattr(nvml, function)()
                found[key] = (f"{value // 1000}.{value % 1000 // 10}" if isinstance(value, int)
                              else _text(value))
        return found

    def read(self) -> list[GpuReading]:
        nvml = self._init()
        if nvml is None:
            return []
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as err:  # the driver was unloaded or reloaded under us
            log.warning("NVML cannot count GPUs (%s): reporting zero until it recovers", err)
            self.close()
            return []
        readings = [self._read_one(nvml, index) for index in range(count)]
        if readings and all(r.fault for r in readings):
            self.close()  # nothing answers: start NVML afresh on the next probe
        return readings

    def _read_one(self, nvml: ModuleType, index: int) -> GpuReading:
        """One GPU; its own failure stays its own (fallen off the bus, NotSupported...)."""
        name, uuid = "unknown GPU", ""
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            mig = self._mig_enabled(nvml, handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = 0.0 if mig else float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            return GpuReading(index=index, name=name, uuid=uuid, utilization=utilization,
                              memory_used=int(memory.used), memory_total=int(memory.total),
                              processes=self._processes(nvml, handle), mig=mig,
                              minor=self._minor(nvml, handle))
        except Exception as err:
            log.warning("GPU %d (%s) cannot be read: %s", index, uuid or name, _error(err))
            return GpuReading(index=index, name=name, uuid=uuid, utilization=0.0,
                              memory_used=0, memory_total=0, fault=_error(err))

    @staticmethod
    def _mig_enabled(nvml: ModuleType, handle: object) -> bool:
        """MIG mode on: the GPU is split into instances (NotSupported: a GPU without MIG)."""
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except Exception:  # NVMLError_NotSupported, or a pynvml without the call
            return False
        enabled: bool = current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)  # pynvml: no types
        return enabled

    @staticmethod
    def _minor(nvml: ModuleType, handle: object) -> int:
        """The GPU's /dev/nvidia<minor>, which its job's cgroup allows (-1: unknown)."""
        try:
            return int(nvml.nvmlDeviceGetMinorNumber(handle))
        except Exception:  # NotSupported (a GPU without a device node), an older pynvml
            return -1

    @staticmethod
    def _processes(nvml: ModuleType, handle: object) -> tuple[GpuProcess, ...]:
        """The compute processes on the GPU (NotSupported on some devices: none known)."""
        try:
            infos = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception as err:
            log.debug("no process list from NVML: %s", err)
            return ()
        return tuple(GpuProcess(pid=int(info.pid), memory=info.usedGpuMemory) for info in infos)

    def close(self) -> None:
        if self._ready and self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._ready = False
        self._versions = None


class StaticGpuSource:
    """Fake GPUs for nodes without hardware: a count, a list of mappings, or a JSON file.

    A mapping may set ``name``, ``uuid`` (default the stable ``GPU-static-<host>-<index>``),
    ``utilization``, ``memory_used``, ``memory_total``, ``processes`` (PIDs on the GPU),
    ``mig`` and ``fault`` (an NVML error text), so tests drive every rule of ``judge``.
    """

    name = GpuSourceKind.STATIC
    DEFAULT_MEMORY = 16 * 1024**3

    def __init__(self, host: str, spec: int | Sequence[dict[str, Any]] | str) -> None:
        self._host = host
        self._spec = spec

    def _entries(self) -> list[dict[str, Any]]:
        spec: Any = self._spec
        if isinstance(spec, str):
            path = Path(spec).expanduser()
            try:
                spec = json.loads(path.read_text())
            except (OSError, ValueError) as err:
                raise HyperTFError(f"static GPU file {path} unreadable: {err}") from None
        if isinstance(spec, int) and not isinstance(spec, bool):
            return [{} for _ in range(spec)]
        if isinstance(spec, (list, tuple)) and all(isinstance(item, dict) for item in spec):
            return [dict(item) for item in spec]
        raise HyperTFError(
            f"static GPU source {self._spec!r}: expected a GPU count or a list of GPU objects"
        )

    def versions(self) -> dict[str, str]:
        return {}

    def read(self) -> list[GpuReading]:
        readings = []
        for index, entry in enumerate(self._entries()):
            readings.append(
                GpuReading(
                    index=index,
                    name=str(entry.get("name", "Static GPU")),
                    uuid=str(entry.get("uuid", f"GPU-static-{self._host}-{index}")),
                    utilization=float(entry.get("utilization", 0.0)),
                    memory_used=int(entry.get("memory_used", 0)),
                    memory_total=int(entry.get("memory_total", self.DEFAULT_MEMORY)),
                    processes=tuple(GpuProcess(pid=int(pid))
                                    for pid in entry.get("processes", ())),
                    mig=bool(entry.get("mig", False)),
                    fault=str(entry.get("fault", "")),
                    minor=int(entry.get("minor", -1)),  # -1: the index (the lab's 195:<i>)
                )
            )
        return readings


class NoGpuSource:
    """A CPU-only node by declaration."""

    name = GpuSourceKind.NONE

    def read(self) -> list[GpuReading]:
        return []

    def versions(self) -> dict[str, str]:
        return {}


def task_key_of(pid: int) -> str | None:
    """The HyperTF job a process belongs to (its ``HYPERTF_TASK_KEY``); None for any other
    process, also one whose environment this agent may not read."""
    return procs.environ_value(pid, "HYPERTF_TASK_KEY") or None


def _unavailable_because(r: GpuReading, mem_percent: float, util_max: float,
                         mem_max: float, processes: list[GpuProcess]) -> str:
    """Why the GPU cannot be granted now ("" when it can), most telling reason first."""
    if r.fault:
        return f"unreadable ({r.fault})"
    if r.mig:
        return "MIG enabled: HyperTF grants whole GPUs only"
    if r.memory_total <= 0:
        return "no memory reported"
    foreign = [p for p in processes if p.task_key is None]
    if foreign:
        return "foreign process " + ", ".join(f"pid {p.pid}" for p in foreign)
    if processes:
        return "in use by " + ", ".join(sorted({str(p.task_key) for p in processes}))
    if r.utilization > util_max:
        return f"utilisation {r.utilization:.0f}% over {util_max:g}%"
    if mem_percent > mem_max:
        return f"memory {mem_percent:.0f}% in use, over {mem_max:g}%"
    return ""


def judge(readings: list[GpuReading], util_max: float, mem_max: float,
          task_of: Callable[[int], str | None] = task_key_of) -> list[GpuInfo]:
    """A GPU is available when it answers, is not split by MIG, runs no compute process,
    and both its utilisation and its memory use are low.

    TensorFlow grabs most of a GPU's memory, so one GPU runs one task: memory in use by
    anyone else makes the GPU unavailable even when it is idle, and so does any process
    on it (an idle one holding the GPU, or a job started outside HyperTF). ``task_of``
    names each process's job, so the launcher and status can tell a job's own processes
    from foreign ones.
    """
    gpus = []
    for r in readings:
        mem_percent = 100.0 * r.memory_used / r.memory_total if r.memory_total else 100.0
        processes = [GpuProcess(pid=p.pid, memory=p.memory, task_key=task_of(p.pid))
                     for p in r.processes]
        reason = _unavailable_because(r, mem_percent, util_max, mem_max, processes)
        gpus.append(
            GpuInfo(
                index=r.index,
                name=r.name,
                uuid=r.uuid,
                utilization=r.utilization,
                memory_used=r.memory_used,
                memory_total=r.memory_total,
                available=not reason,
                reason=reason,
                mig=r.mig,
                processes=processes,
            )
        )
    return gpus


def ipv4_addresses() -> dict[str, list[str]]:
    """Every interface's IPv4 addresses (netifaces)."""
    result: dict[str, list[str]] = {}
    for iface in netifaces.interfaces():
        entries = netifaces.ifaddresses(iface).get(netifaces.AF_INET, [])
        addrs = [entry["addr"] for entry in entries if entry.get("addr")]
        if addrs:
            result[iface] = addrs
    return result


def select_address(spec: str | None, addresses: dict[str, list[str]], preferred: str) -> str:
    """Pick the address for a network given by interface name or subnet (CIDR).

    Without a spec: ``preferred`` (the inventory's ansible_host) if this node owns it, else
    the first non-loopback address, else loopback.
    """
    every = [addr for addrs in addresses.values() for addr in addrs]
    if spec:
        if spec in addresses:
            return addresses[spec][0]
        try:
            network = ipaddress.ip_network(spec, strict=False)
        except ValueError:
            raise InventoryError(
                f"network {spec!r} is neither an interface of this node "
                f"({', '.join(addresses)}) nor a subnet like 10.40.0.0/16; fix "
                f"hypertf_data_network / hypertf_mgmt_network in the inventory"
            ) from None
        for addr in every:
            if ipaddress.ip_address(addr) in network:
                return addr
        raise InventoryError(
            f"no address of this node lies in {spec} (addresses: {', '.join(every)}); "
            f"fix hypertf_data_network / hypertf_mgmt_network in the inventory"
        )
    if preferred in every:
        return preferred
    for addr in every:
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    return "127.0.0.1"


def free_port(port_range: tuple[int, int], taken: AbstractSet[int] = frozenset(),
              tries: int = 64) -> int:
    """A port in range that nothing listens on now (random order, so agents spread out)."""
    low, high = port_range
    candidates = [p for p in range(low, high + 1) if p not in taken]
    random.shuffle(candidates)
    for port in candidates[:tries]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise HyperTFError(f"no free port in {low}-{high}; widen hypertf_port_range")
