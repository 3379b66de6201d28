"""A fake ``pynvml`` for the boundary of ``NvmlGpuSource``: the machines here have no GPU.

It copies the parts of nvidia-ml-py's API that HyperTF calls, with its error classes
(``NVMLError`` and the ``NVMLError_<Name>`` subclasses), so faults, MIG and process lists
can be staged per GPU. Each GPU is a ``FakeGpu``; ``faults`` maps a call name (``name``,
``uuid``, ``memory``, ``util``, ``mig``, ``processes``, ``handle``) to the error it raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
GIB = 1024**3


class NVMLError(Exception):
    """As in pynvml: every NVML failure is one of these."""


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_GpuIsLost(NVMLError):
    def __str__(self) -> str:
        return "GPU is lost"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self) -> str:
        return "Driver Not Loaded"


class NVMLError_Uninitialized(NVMLError):
    def __str__(self) -> str:
        return "Uninitialized"


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    util: int = 0
    used: int = 0
    total: int = 80 * GIB
    mig: int | None = NVML_DEVICE_MIG_DISABLE  # None: the device does not support MIG
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    faults: dict[str, NVMLError] = field(default_factory=dict)


class FakeNvml:
    """The module's state: its GPUs, the calls made, and whether NVML is initialised."""

    def __init__(self, gpus: list[FakeGpu], init_error: NVMLError | None = None,
                 count_error: NVMLError | None = None,
                 versions: tuple[str, str, int] = ("550.54.15", "12.550.54.15", 12040)):
        self.gpus = gpus
        self.init_error = init_error
        self.count_error = count_error
        self.versions = versions
        self.calls: list[str] = []
        self.initialised = False

    def _gpu(self, call: str, handle: int) -> FakeGpu:
        self.calls.append(call)
        if not self.initialised:
            raise NVMLError_Uninitialized()
        gpu = self.gpus[handle]
        if call in gpu.faults:
            raise gpu.faults[call]
        return gpu

    def module(self) -> SimpleNamespace:
        def init() -> None:
            self.calls.append("init")
            if self.init_error:
                raise self.init_error
            self.initialised = True

        def shutdown() -> None:
            self.calls.append("shutdown")
            self.initialised = False

        def count() -> int:
            self.calls.append("count")
            if self.count_error:
                raise self.count_error
            return len(self.gpus)

        def mig_mode(handle: int) -> list[int]:
            gpu = self._gpu("mig", handle)
            if gpu.mig is None:
                raise NVMLError_NotSupported()
            return [gpu.mig, gpu.mig]

        def util(handle: int) -> SimpleNamespace:
            gpu = self._gpu("util", handle)
            if gpu.mig == NVML_DEVICE_MIG_ENABLE:  # as the driver does for a MIG parent
                raise NVMLError_NotSupported()
            return SimpleNamespace(gpu=gpu.util, memory=0)

        def memory(handle: int) -> SimpleNamespace:
            gpu = self._gpu("memory", handle)
            return SimpleNamespace(used=gpu.used, total=gpu.total, free=gpu.total - gpu.used)

        def processes(handle: int) -> list[SimpleNamespace]:
            gpu = self._gpu("processes", handle)
            return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

        def handle(index: int) -> int:
            self._gpu("handle", index)
            return index

        return SimpleNamespace(
            NVMLError=NVMLError,
            NVML_DEVICE_MIG_ENABLE=NVML_DEVICE_MIG_ENABLE,
            nvmlInit=init,
            nvmlShutdown=shutdown,
            nvmlSystemGetDriverVersion=lambda: self.versions[0],
            nvmlSystemGetNVMLVersion=lambda: self.versions[1],
            nvmlSystemGetCudaDriverVersion=lambda: self.versions[2],
            nvmlDeviceGetCount=count,
            nvmlDeviceGetHandleByIndex=handle,
            nvmlDeviceGetName=lambda h: self._gpu("name", h).name,
            nvmlDeviceGetUUID=lambda h: self._gpu("uuid", h).uuid,
            nvmlDeviceGetMigMode=mig_mode,
            nvmlDeviceGetUtilizationRates=util,
            nvmlDeviceGetMemoryInfo=memory,
            nvmlDeviceGetComputeRunningProcesses=processes,
        )
