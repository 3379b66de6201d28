"""Device check, run on a lent GPU machine (not by the suite), standard library only (ctypes
on the driver's libcuda and libnvidia-ml): which GPU does the real CUDA driver open for each
spelling of CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES that hypertf.node.trespass.claimed
reads, and does NVML list every process that opened one, including a process that set the
variable after exec (invisible in /proc/<pid>/environ)?

    python3 tests/device/cuda_spellings.py   # one JSON object on stdout
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import ctypes, json, os, sys, time
if sys.argv[1] == "after-exec":
    os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[2]
cuda = ctypes.CDLL("libcuda.so.1")
said = {"init": cuda.cuInit(0)}
count = ctypes.c_int(0)
said["count_rc"] = cuda.cuDeviceGetCount(ctypes.byref(count))
said["count"] = count.value
uuids = []
for ordinal in range(count.value):
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
    raw = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(raw, dev)
    h = bytes(raw).hex()
    uuids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
said["uuids"] = uuids
if count.value:
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    said["ctx"] = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    ptr = ctypes.c_uint64()
    said["alloc"] = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20))
print(json.dumps(said), flush=True)
time.sleep(30)
"""


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def nvml_gpus() -> list[dict]:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlInit_v2()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
    found = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
        uuid = ctypes.create_string_buffer(96)
        nvml.nvmlDeviceGetUUID(handle, uuid, 96)
        size = ctypes.c_uint(64)
        procs = (ProcessInfo * 64)()
        getter = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
            nvml.nvmlDeviceGetComputeRunningProcesses_v2
        rc = getter(handle, ctypes.byref(size), procs)
        found.append({"index": index, "uuid": uuid.value.decode(), "rc": rc,
                      "pids": [procs[i].pid for i in range(size.value)] if rc == 0 else []})
    return found


def main() -> int:
    t0 = time.monotonic()
    gpus = nvml_gpus()
    uuid = gpus[0]["uuid"]
    spellings = {
        "index": {"CUDA_VISIBLE_DEVICES": "0"},
        "uuid": {"CUDA_VISIBLE_DEVICES": uuid},
        "upper-case uuid": {"CUDA_VISIBLE_DEVICES": uuid.upper()},
        "lower-case GPU- prefix": {"CUDA_VISIBLE_DEVICES": "gpu-" + uuid[4:]},
        "uuid without GPU-": {"CUDA_VISIBLE_DEVICES": uuid[4:]},
        "short prefix": {"CUDA_VISIBLE_DEVICES": uuid[:12]},
        "short prefix without GPU-": {"CUDA_VISIBLE_DEVICES": uuid[4:10]},
        "index past the GPUs": {"CUDA_VISIBLE_DEVICES": str(len(gpus))},
        "all (not CUDA's)": {"CUDA_VISIBLE_DEVICES": "all"},
        "bogus then 0": {"CUDA_VISIBLE_DEVICES": "bogus,0"},
        "0 then bogus": {"CUDA_VISIBLE_DEVICES": "0,bogus"},
        "spaces around 0": {"CUDA_VISIBLE_DEVICES": " 0 "},
        "+0": {"CUDA_VISIBLE_DEVICES": "+0"},
        "00": {"CUDA_VISIBLE_DEVICES": "00"},
        "upper-case short prefix": {"CUDA_VISIBLE_DEVICES": uuid[:12].upper()},
        "Gpu- prefix": {"CUDA_VISIBLE_DEVICES": "Gpu-" + uuid[4:]},
        "GPU- alone": {"CUDA_VISIBLE_DEVICES": "GPU-"},
        "NVIDIA_VISIBLE_DEVICES uuid": {"NVIDIA_VISIBLE_DEVICES": uuid},
        "after-exec": {},
    }
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    children = {name: subprocess.Popen(
        [sys.executable, "-c", CHILD, name, "0"], env={**base, **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, env in spellings.items()}
    result: dict = {"gpus": [{k: g[k] for k in ("index", "uuid")} for g in gpus],
                    "children": {}}
    try:
        said = {}
        for name, child in children.items():
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            try:
                said[name] = json.loads(line)
            except json.JSONDecodeError:
                said[name] = {"error": line[:300]}
        time.sleep(1.0)
        t1 = time.monotonic()
        seen = {pid for g in nvml_gpus() for pid in g["pids"]}
        read_ms = (time.monotonic() - t1) * 1000
        for name, child in children.items():
            try:
                with open(f"/proc/{child.pid}/environ", "rb") as handle:
                    text = handle.read()
                environ = [v.decode() for v in text.split(b"\0")
                           if v.startswith((b"CUDA_VISIBLE", b"NVIDIA_VISIBLE"))]
            except OSError as err:
                environ = [f"unreadable: {err}"]
            result["children"][name] = {
                "env": spellings[name], "pid": child.pid, "cuda": said[name],
                "environ_at_exec": environ, "seen_by_nvml": child.pid in seen}
        result["nvml_pids"] = sorted(seen)
        result["nvml_read_ms"] = round(read_ms, 1)
    finally:
        for child in children.values():
            child.kill()
            child.wait()
    result["total_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
