"""A stand-in for a torchrun-style script (no PyTorch: its multi-gigabyte wheel stays out of
the suite): reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
and NODE_RANK as ``torch.distributed`` would, and meets its peers over TCP on the master's
address like its TCP store: rank 0 listens on MASTER_PORT, every other rank connects and
sends what it was told. Rank 0 prints the whole world as one JSON line and answers each
rank, so every process knows the rendezvous held. The other ranks also listen on their own
port (HyperTF's TensorFlow readiness: every task of a multi-task job listens). The node's
watcher learns that a port listens by connecting to it and closing at once: rank 0 takes
such a connection, which sends nothing, as no peer (a store server must survive it)."""

from __future__ import annotations

import json
import os
import socket
import time

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
         "MASTER_PORT", "JAX_COORDINATOR_ADDRESS", "KERAS_DISTRIBUTION_PROCESS_ID")


def main() -> None:
    told = {name: os.environ[name] for name in NAMES}
    told["host"] = socket.gethostname()
    told["task"] = os.environ["HYPERTF_TASK"]
    rank, world = int(told["RANK"]), int(told["WORLD_SIZE"])
    master = (told["MASTER_ADDR"], int(told["MASTER_PORT"]))
    if rank == 0:
        server = socket.create_server(("0.0.0.0", master[1]))
        peers, conns = [told], []
        while len(peers) < world:
            conn, _ = server.accept()
            line = conn.makefile().readline()
            if not line:  # a connection that said nothing: the node's readiness probe
                conn.close()  # (tasknode connects to each task's port and closes): it
                continue  # is not a peer
            peers.append(json.loads(line))
            conns.append(conn)
        print("world=" + json.dumps(sorted(peers, key=lambda p: int(p["RANK"]))), flush=True)
        for conn in conns:
            conn.sendall(b"ok\n")
            conn.close()
        return
    own = json.loads(os.environ["TF_CONFIG"])
    port = int(own["cluster"][own["task"]["type"]][own["task"]["index"]].rpartition(":")[2])
    listener = socket.create_server(("0.0.0.0", port))  # noqa: F841 (readiness)
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection(master, timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall((json.dumps(told) + "\n").encode())
    print(f"rank {rank}: {conn.makefile().readline().strip()}", flush=True)


if __name__ == "__main__":
    main()
