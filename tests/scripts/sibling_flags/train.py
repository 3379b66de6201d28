"""A TF1 between-graph stand-in whose legacy flags are defined in the module beside it
(cluster_flags.py), not in this file, as tf_cnn_benchmarks.py's are. Given its role, a ps
listens on its port and serves until stopped, and a worker listens, works and exits 0;
without one (no --job_name) every task trains alone and exits 0, as tf_cnn_benchmarks does.
Each task prints the flags it got."""

from __future__ import annotations

import socket
import sys
import time

from cluster_flags import parse


def main() -> int:
    args = parse()
    print(f"job_name={args.job_name or '(none)'} task_index={args.task_index} "
          f"ps_hosts={args.ps_hosts} worker_hosts={args.worker_hosts}", flush=True)
    if not args.job_name:
        print("no cluster: training alone", flush=True)
        return 0
    hosts = (args.ps_hosts if args.job_name == "ps" else args.worker_hosts).split(",")
    port = int(hosts[args.task_index].rsplit(":", 1)[1])
    server = socket.create_server(("0.0.0.0", port))  # TensorFlow binds every address too
    if args.job_name == "ps":
        while True:  # server.join(): a ps serves until it is stopped
            time.sleep(3600)
    time.sleep(args.work_s)
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
