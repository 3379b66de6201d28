"""Offload listens narrowly (issue 38 item 3): during an offload job on the lab, every port
its world opened is found with ``ss`` on each host. None but hydra's control port is on a
wildcard address: MPICH's mpiexec (4.0.2) binds it on every address whatever it is told, so
it is held to the inventory's hypertf_offload_port_range instead. Garbage sent from another
lab host to every port ends neither the agent nor the job's offloading: the agent's and the
processors' ports change nothing, and hydra's own (hydra ends the whole world on a
connection that is not one of its proxies: "cannot find proxy with ID") costs one world,
which the task's runner starts again and the hook attaches to, so every product is still
offloaded (docs/offload.md, "What listens")."""

from __future__ import annotations

import shlex

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.core.rundir import RunDir
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import all_free, summaries
from tests.offload.test_hook import check_results
from tests.offload.test_launch import nothing_left, start_paused

WORLD = ("mpiexec", "hydra_pmi_proxy", "hypertf.offload")
WILDCARD = ("0.0.0.0", "*", "::", "")
# From another host: random bytes, an HTTP request, a connection closed at once, each port.
GARBAGE = ("import os, socket, sys\n"
           "for port in map(int, sys.argv[2:]):\n"
           "    for payload in (os.urandom(65536), b'GET / HTTP/1.0\\r\\n\\r\\n', b''):\n"
           "        try:\n"
           "            with socket.create_connection((sys.argv[1], port), timeout=5) as s:\n"
           "                s.sendall(payload)\n"
           "        except OSError as err:\n"
           "            print(port, err)\n"
           "print('sent')\n")


def world_pids(inventory, host: str, word: str) -> list[str]:
    """The PIDs of the processes on ``host`` whose command line has ``word`` (mpiexec's,
    which names every rank's command, left out)."""
    return [line.split()[0] for line in on_host(inventory, host, "ps -eo pid,args").splitlines()
            if word in line and "mpiexec" not in line and "ps -eo" not in line]


def world_listeners(inventory, host: str) -> list[tuple[str, int, str]]:
    """(address, port, processes) of every TCP socket on ``host`` that a process of an
    offload world listens on (``ss`` names the processes; their command lines say)."""
    pids = {line.split()[0] for line in on_host(inventory, host, "ps -eo pid,args").splitlines()
            if any(word in line for word in WORLD)}
    found = []
    for line in on_host(inventory, host, "ss -Hltnp").splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        users = " ".join(fields[5:])
        if any(f"pid={pid}," in users for pid in pids):
            found.append((address.strip("[]"), int(port), users))
    return found


@pytest.mark.lab
def test_offload_listens_narrowly_and_survives_garbage_on_its_ports(lab, tmp_path):
    job, key, out, go = start_paused(lab, tmp_path)
    inventory = load_inventory(lab.inventory)
    low, high = inventory.node("h1").settings.offload_port_range
    opened = {host: world_listeners(inventory, host) for host in inventory.nodes}
    assert opened["h1"] and opened["h2"] and opened["h3"], opened
    for host, listening in opened.items():
        address = inventory.node(host).address
        for bound, port, users in listening:
            if bound in WILDCARD:  # hydra's control port only, from the setting
                assert "mpiexec" in users and low <= port <= high, (host, bound, port, users)
            else:
                assert bound == address, (host, bound, port, users)
    for host, listening in opened.items():
        sender = "h3" if host != "h3" else "h1"
        ports = " ".join(str(port) for bound, port, _ in listening if bound not in WILDCARD)
        said = on_host(inventory, sender, f"/usr/bin/python3 -c {shlex.quote(GARBAGE)} "
                                          f"{inventory.node(host).address} {ports}")
        assert said.strip().endswith("sent"), said
    assert job.poll() is None
    # hydra's control port last: it ends the world, the runner starts another
    (agent,) = world_pids(inventory, "h1", "hypertf.offload.agent")
    (hydra,) = [port for bound, port, users in opened["h1"] if bound in WILDCARD]
    said = on_host(inventory, "h3", f"/usr/bin/python3 -c {shlex.quote(GARBAGE)} "
                                    f"{inventory.node('h1').address} {hydra}")
    assert said.strip().endswith("sent"), said
    private = RunDir.of(inventory.node("h1").settings.workdir, key).offload_dir("worker0")
    wait_for(lambda: world_pids(inventory, "h1", "hypertf.offload.agent") not in ([], [agent])
             and "ready-" in on_host(inventory, "h1", f"ls {shlex.quote(str(private))}"),
             90, "the runner to start a new world")
    assert job.poll() is None
    go.touch()
    output, _ = job.communicate(timeout=120)
    assert job.returncode == 0, output
    (summary,) = summaries(tmp_path)
    offload = summary["offload"]
    assert (offload["ops"], offload["fallbacks"], offload["failed"]) == (8, 0, {}), offload
    assert offload["restarts"] == 1, offload
    assert "the offload world was started again 1 time(s)" in output
    check_results(out)
    assert nothing_left(lab.inventory, key)
    assert all_free(lab.inventory)
