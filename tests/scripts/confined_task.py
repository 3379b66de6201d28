"""A task for the confinement tests (docs/gpu.md "Confinement"): opens the device nodes it
is given and says what each open gave, before and after widening its own
CUDA_VISIBLE_DEVICES; with --daemon TOKEN it first double-forks a setsid daemon (as
data-loader servers and nohup helpers do) that sleeps with TOKEN (digits) in its command
line (sleep 600 0.TOKEN)."""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
import time


def opens(paths: list[str]) -> str:
    said = []
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDWR))
            said.append(f"{path}=ok")
        except OSError as err:
            said.append(f"{path}={errno.errorcode.get(err.errno or 0, err.errno)}")
    return " ".join(said)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", nargs="*", default=[])
    parser.add_argument("--daemon", default="")
    parser.add_argument("--work_s", type=float, default=0.0)
    parser.add_argument("--exit_code", type=int, default=0)
    args, _ = parser.parse_known_args()
    if args.daemon:
        # setsid: out of the task's process group and session; start_new_session in a
        # child that exits at once: the daemon is re-parented away from the task too
        subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys; subprocess.Popen("
                          "['sleep', '600', '0.' + sys.argv[1]], start_new_session=True, "
                          "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
                          "stderr=subprocess.DEVNULL); os._exit(0)", args.daemon]).wait()
        print("daemon started", flush=True)
    print(f"cuda={os.environ.get('CUDA_VISIBLE_DEVICES', '')} opens: {opens(args.devices)}",
          flush=True)
    os.environ["CUDA_VISIBLE_DEVICES"] = "all"  # a hint only: the cgroup does not read it
    print(f"widened opens: {opens(args.devices)}", flush=True)
    time.sleep(args.work_s)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
