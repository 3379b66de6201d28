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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import netifaces

from hypertf.errors import HyperTFError, InventoryError
from hypertf.store import GpuInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    """Raw figures for one GPU, before the availability thresholds are applied."""

    index: int
    name: str
    uuid: str
    utilization: float
    memory_used: int
    memory_total: int


class GpuSource(Protocol):
    """Anything that can list the node's GPUs."""

    name: str

    def read(self) -> list[GpuReading]: ...


class NvmlGpuSource:
    """Real GPUs through NVML; no driver or no GPU means zero GPUs, not an error."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._ready = False

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

    def read(self) -> list[GpuReading]:
        nvml = self._init()
        if nvml is None:
            return []
        readings = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                readings.append(
                    GpuReading(
                        index=index,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                        utilization=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                        memory_used=int(memory.used),
                        memory_total=int(memory.total),
                    )
                )
        except Exception as err:  # a GPU fell off the bus, the driver was reloaded...
            log.warning("NVML read failed (%s): reporting zero GPUs until it recovers", err)
            self.close()
            return []
        return readings

    def close(self) -> None:
        if self._ready and self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._ready = False


class StaticGpuSource:
    """Fake GPUs for nodes without hardware: a count, a list of mappings, or a JSON file."""

    name = "static"
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
                )
            )
        return readings


class NoGpuSource:
    """A CPU-only node by declaration."""

    name = "none"

    def read(self) -> list[GpuReading]:
        return []


def judge(readings: list[GpuReading], util_max: float, mem_max: float) -> list[GpuInfo]:
    """A GPU is available when both its utilisation and its memory use are low.

    TensorFlow grabs most of a GPU's memory, so one GPU runs one task: memory in use by
    anyone else makes the GPU unavailable even when it is idle.
    """
    gpus = []
    for r in readings:
        mem_percent = 100.0 * r.memory_used / r.memory_total if r.memory_total else 100.0
        gpus.append(
            GpuInfo(
                index=r.index,
                name=r.name,
                uuid=r.uuid,
                utilization=r.utilization,
                memory_used=r.memory_used,
                memory_total=r.memory_total,
                available=r.memory_total > 0 and r.utilization <= util_max
                and mem_percent <= mem_max,
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


def free_port(port_range: tuple[int, int], taken: set[int] = frozenset(), tries: int = 64) -> int:
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
