"""Device check for issue 50, run as root on a lent GPU machine (not by the suite): does a
job's cgroup, made by the agent's own code (hypertf.node.confine) with the minors NVML
reports, keep the real CUDA driver off the GPUs the job was not granted, with
CUDA_VISIBLE_DEVICES unset? For each GPU i (and for none), a child joins a cgroup that
allows only GPU i and counts the devices cuInit/cuDeviceGetCount see; then a child outside
any job cgroup counts them all. Standard library plus hypertf (no TensorFlow, no pynvml:
the minors are read from /proc/driver/nvidia/gpus/*/information).

    PYTHONPATH=. python3 tests/device/confine_cuda.py   # one JSON object on stdout
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from hypertf.node import confine

CHILD = r"""
import ctypes, json, sys
from hypertf.node import confine
if sys.argv[1]:
    assert not confine.join(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
said = {"init": cuda.cuInit(0)}
count = ctypes.c_int(0)
said["count_rc"] = cuda.cuDeviceGetCount(ctypes.byref(count))
said["count"] = count.value
print(json.dumps(said))
"""


def minors() -> dict[int, int]:
    """GPU index (PCI order) -> device minor, from the driver's own /proc files."""
    found = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text().splitlines():
            if line.startswith("Device Minor:"):
                found.append(int(line.split(":")[1]))
    return dict(enumerate(found))


def count_in(procs: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-c", CHILD, procs], capture_output=True,
                          text=True, env=env, timeout=120)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}


def main() -> int:
    gpus = minors()
    root = f"hypertf-device-{secrets.token_hex(3)}"
    state = confine.detect(f"{root}/c/h", "auto")
    result: dict[str, object] = {"minors": gpus, "confinement": state.label, "runs": {}}
    cgroups = confine.JobCgroups(state)
    try:
        grants = {f"k{i}.device": frozenset({i}) for i in gpus} | {"none.device": frozenset()}
        cgroups.sync(grants, gpus)
        for key in grants:
            procs = ":".join(str(d / "cgroup.procs") for d in state.job_dirs(key))
            result["runs"][key] = count_in(procs)  # type: ignore[index]
        result["runs"]["outside"] = count_in("")  # type: ignore[index]
        ok = all(run.get("count") == (0 if key == "none.device" else 1)
                 for key, run in result["runs"].items() if key != "outside")  # type: ignore[union-attr]
        result["ok"] = ok and result["runs"]["outside"].get("count") == len(gpus)  # type: ignore[index]
    finally:
        cgroups.sync({}, gpus)
        cgroups.close()
    print(json.dumps(result, indent=1))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
