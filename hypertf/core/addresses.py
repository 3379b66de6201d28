"""Which address a host's tasks are reached at: the inventory's word, never an agent's alone.

An agent reports its host's data-network address (``data_addr``), but its credential is a
node's: a stolen one could name an outside listener, or another host's task, and every
other host of a job would send its TensorFlow traffic there. So the launcher takes an
agent's address only where the admin's inventory vouches for it: it lies in
``hypertf_data_network`` given as a subnet and no other host has or claims it; else it is
the inventory's own address of that host (``ansible_host``). Pure: the launcher applies it
to the records it read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import NamedTuple


class HostAddresses(NamedTuple):
    """One host as the inventory and its agent describe it."""

    inventory: str  # ansible_host: the admin's word
    claimed: str  # the agent record's data_addr
    network: str | None  # hypertf_data_network: a subnet, an interface name, or None


class Chosen(NamedTuple):
    address: str
    refused: str  # why the agent's claim was not taken ("" when it was, or agreed)


def _subnet(spec: str | None) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not spec:
        return None
    try:
        return ipaddress.ip_network(spec, strict=False)
    except ValueError:
        return None  # an interface name: nothing the controller can check a claim against


def data_addresses(hosts: Mapping[str, HostAddresses]) -> dict[str, Chosen]:
    """Each host's data address and, where its agent's claim was not taken, why."""
    claims: dict[str, list[str]] = {}
    for name, host in hosts.items():
        claims.setdefault(host.claimed, []).append(name)
        if host.inventory != host.claimed:
            claims.setdefault(host.inventory, []).append(name)
    chosen: dict[str, Chosen] = {}
    for name, host in hosts.items():
        if host.claimed == host.inventory:
            chosen[name] = Chosen(host.inventory, "")
            continue
        subnet = _subnet(host.network)
        others = sorted(set(claims.get(host.claimed, ())) - {name})
        why = ""
        if subnet is None:
            why = ("hypertf_data_network is not a subnet the inventory can check it "
                   "against" if host.network else "the inventory names no data network "
                   "(hypertf_data_network) that holds it")
        elif not _within(host.claimed, subnet):
            why = f"it is outside hypertf_data_network {host.network}"
        elif others:
            why = f"{', '.join(others)} has or claims it too"
        chosen[name] = Chosen(host.inventory if why else host.claimed, why)
    return chosen


def _within(address: str, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    try:
        return ipaddress.ip_address(address) in subnet
    except ValueError:
        return False
