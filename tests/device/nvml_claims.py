"""Device check, run on a lent GPU machine (not by the suite): does the real NVML path
(hypertf.node.probes.NvmlGpuSource, the agent's code) see a process on a GPU however that
process named the GPU? The env-based trespass check reads /proc/<pid>/environ, which
shows only the environment at exec; these processes name GPU 0 in each spelling CUDA
accepts, one of them only after exec (invisible to any environ reader).

    python3 tests/device/nvml_claims.py   # one JSON object; exit 1 if a process that
                                          # opened the GPU was not seen by NVML

Needs torch (to open the GPU) and nvidia-ml-py. netifaces is not needed by the NVML path;
where it is missing a bare module stands in for it so that hypertf.node.probes imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
try:
    import netifaces  # noqa: F401
except ImportError:  # the address probe is not exercised here
    sys.modules["netifaces"] = types.ModuleType("netifaces")

from hypertf.node.probes import NvmlGpuSource

CHILD = """
import os, sys, time
if sys.argv[1] == "after-exec":
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
import torch
try:
    x = torch.ones(1 << 20, device="cuda")
except Exception as err:  # CUDA refused the spelling: the process cannot open the GPU
    print("refused by CUDA:", str(err).splitlines()[0][:160], flush=True)
    sys.exit(0)
print("ready", torch.cuda.device_count(), flush=True)
time.sleep(60)
"""


def main() -> int:
    source = NvmlGpuSource()
    readings = source.read()
    if not readings:
        print(json.dumps({"error": "NVML reports no GPU"}))
        return 2
    uuid = readings[0].uuid
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    spellings = {
        "after-exec": {},
        "index": {"CUDA_VISIBLE_DEVICES": "0"},
        "lower-case uuid": {"CUDA_VISIBLE_DEVICES": uuid.lower()},
        "uuid without GPU-": {"CUDA_VISIBLE_DEVICES": uuid.removeprefix("GPU-")},
        "uuid prefix": {"CUDA_VISIBLE_DEVICES": uuid[:12]},
        "NVIDIA_VISIBLE_DEVICES": {"NVIDIA_VISIBLE_DEVICES": uuid},
    }
    children = {name: subprocess.Popen([sys.executable, "-c", CHILD, name],
                                       env={**base, **env}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
                for name, env in spellings.items()}
    started = {}
    try:
        for name, child in children.items():
            assert child.stdout is not None
            started[name] = child.stdout.readline().strip()
        time.sleep(1.0)
        t0 = time.monotonic()
        seen = {p.pid for r in source.read() for p in r.processes}
        read_ms = (time.monotonic() - t0) * 1000
        environ = {}
        for name, child in children.items():
            try:
                text = Path(f"/proc/{child.pid}/environ").read_bytes()
                environ[name] = [v.decode() for v in text.split(b"\0")
                                 if v.startswith((b"CUDA_VISIBLE", b"NVIDIA_VISIBLE"))]
            except OSError as err:
                environ[name] = [f"unreadable: {err}"]
        result = {
            "gpu": {"name": readings[0].name, "uuid": uuid, "count": len(readings)},
            "driver": source.versions(),
            "nvml_read_ms": round(read_ms, 1),
            "children": {name: {"pid": child.pid, "started": started[name],
                                "environ_at_exec": environ[name],
                                "seen_by_nvml": child.pid in seen}
                         for name, child in children.items()},
            "nvml_pids": sorted(seen),
        }
    finally:
        for child in children.values():
            child.kill()
            child.wait()
    print(json.dumps(result, indent=1))
    missed = [name for name, c in result["children"].items()
              if c["started"].startswith("ready") and not c["seen_by_nvml"]]
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
