"""A stand-in training script for launcher tests: behaves like a TF task, starts in 50 ms.

It reads TF_CONFIG like a TensorFlow task, listens on its own port, and then either
finishes (the roles that finish in that mode) or serves until stopped. Options make a given
task misbehave: ``--fail_on worker:1 [--fail_s 1]``, ``--never_listen_on worker:1``, ``--work_s 2``,
``--ignore_term`` (like MultiWorkerMirroredStrategy), ``--until_file PATH`` (work until the test
creates PATH, so a test that inspects a running job decides when it ends), ``--write_metrics``
(the reporting task writes ``{"score": lr + batch_size / 1000}`` from ``--lr``/``--batch_size``
to HYPERTF_METRICS_FILE, as a sweep trial does), ``--write_relative PATH`` (append the
task's name to PATH, relative to its working directory, and print where that was). Every
task prints its argv as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time


def foreign_task_processes() -> list[int]:
    """PIDs on this host (a lab host has its own PID namespace) of another job's tasks."""
    mine = os.environ.get("HYPERTF_TASK_KEY", "")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                env = handle.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        keys = [v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"HYPERTF_TASK_KEY=")]
        if keys and keys[0] != mine and state != "Z":
            found.append(int(entry))
    return found


def main() -> int:
    if "--ignore_term" in sys.argv:  # first: a stop may come while this task still starts
        signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM caught", flush=True))
    parser = argparse.ArgumentParser()
    parser.add_argument("--work_s", type=float, default=1.0)
    parser.add_argument("--fail_on", default="")
    parser.add_argument("--fail_s", type=float, help="seconds before failing (default work_s)")
    parser.add_argument("--never_listen_on", default="")
    parser.add_argument("--ignore_term", action="store_true")
    parser.add_argument("--until_file", help="work until this file exists (not --work_s)")
    parser.add_argument("--report_foreign", action="store_true",
                        help="print how many processes of other jobs live on this host")
    parser.add_argument("--lr", type=float, default=0.0)
    parser.add_argument("--batch_size", type=int, default=0)
    parser.add_argument("--write_metrics", action="store_true",
                        help="write {score: lr + batch_size/1000} to HYPERTF_METRICS_FILE")
    parser.add_argument("--metrics", default="yes", help="no: write no metrics after all")
    parser.add_argument("--fail_lr", type=float, help="fail when --lr is this ...")
    parser.add_argument("--fail_unless", help="... unless this file exists")
    parser.add_argument("--write_relative", help="append this task's name to this relative "
                        "path (directories made) and print 'wrote ABSOLUTE-PATH'")
    args, _ = parser.parse_known_args()
    config = json.loads(os.environ["TF_CONFIG"])
    role, index = config["task"]["type"], config["task"]["index"]
    me = f"{role}:{index}"
    print("argv=" + json.dumps(sys.argv[1:]), flush=True)
    print("tf_cluster=" + json.dumps(config["cluster"], sort_keys=True), flush=True)
    print("test_env=" + json.dumps({k: v for k, v in os.environ.items()
                                    if k.startswith("HYPERTF_TEST_")}, sort_keys=True),
          flush=True)
    cuda, fail_fast = os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("GRPC_FAIL_FAST")
    print(f"cuda={cuda!r} fail_fast={fail_fast}", flush=True)
    print(f"attempt={os.environ.get('HYPERTF_ATTEMPT')} "
          f"checkpoint_dir={os.environ.get('HYPERTF_CHECKPOINT_DIR')}", flush=True)
    print(f"gpu_order={os.environ.get('CUDA_DEVICE_ORDER')} "
          f"gpus={os.environ.get('HYPERTF_GPUS')!r}", flush=True)
    if args.write_relative:
        os.makedirs(os.path.dirname(args.write_relative) or ".", exist_ok=True)
        with open(args.write_relative, "a") as handle:
            handle.write(me + "\n")
        print(f"wrote {os.path.abspath(args.write_relative)}", flush=True)
    if args.report_foreign:
        print(f"foreign task processes: {len(foreign_task_processes())}", flush=True)
    if me != args.never_listen_on:
        port = int(config["cluster"][role][index].rsplit(":", 1)[1])
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen()
        print(f"{me} listening on {port}", flush=True)
    roles = set(config["cluster"])
    finishes = (role == "chief") if "chief" in roles and "ps" in roles else (
        role == "worker" if "ps" in roles else True)
    failing = me == args.fail_on or (
        args.fail_lr is not None and args.lr == args.fail_lr and finishes
        and not (args.fail_unless and os.path.exists(args.fail_unless)))
    if failing and args.fail_s is not None:
        time.sleep(args.fail_s)
    elif args.until_file:
        while not os.path.exists(args.until_file):
            time.sleep(0.1)
    else:
        time.sleep(args.work_s)
    if failing:
        print(f"{me} failing on purpose", flush=True)
        return 3
    if args.write_metrics and args.metrics != "no" and os.environ.get("HYPERTF_METRICS_FILE"):
        with open(os.environ["HYPERTF_METRICS_FILE"], "w") as handle:
            json.dump({"score": args.lr + args.batch_size / 1000}, handle)
    if finishes:
        print(f"{me} done", flush=True)
        return 0
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
