"""The job's hosts as ZooKeeper knows them: the inventory's GPU nodes whose agent is up,
and each one's agent record with the data address the inventory vouches for.

Read at the plan, again after every wait in the queue (addresses and GPU UUIDs may have
changed meanwhile), and before a restart. ``records`` is the dict the job's attempts read
(their tasks' addresses and GPUs): it is refreshed in place, never replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypertf.config.inventory import Inventory
from hypertf.core.addresses import HostAddresses, data_addresses
from hypertf.core.errors import HyperTFError
from hypertf.core.records import AgentRecord
from hypertf.store import Store, outage_patience

__all__ = ["Roster"]


class Roster:
    """The live agents' records, read through ``store`` for the inventory's nodes."""

    def __init__(self, store: Store, inventory: Inventory, say: Callable[[str], None],
                 records: dict[str, AgentRecord]) -> None:
        self.store = store
        self.inventory = inventory
        self.say = say
        self.records = records
        self._said_refused: set[tuple[str, str]] = set()  # (host, claim) told about

    def live_hosts(self) -> list[str]:
        """The inventory's GPU nodes whose agent is up (their records kept for the start)."""
        cluster = self.inventory.cluster
        # an agent that lost ZooKeeper's data gives up its client after outage_patience and
        # retries every 2 s, then probes: that long after 'auth init', records may yet come
        interval = max((n.settings.agent_interval for n in self.inventory.nodes.values()),
                       default=5.0)
        window = outage_patience(cluster) + 2.0 + interval + 5.0
        records = self.store.records_soon(self.inventory.nodes, window, self.say)
        vouched = self._vouched(records)
        self.records.clear()
        self.records.update(vouched)
        hosts = [name for name in self.inventory.nodes if name in self.records]
        if not hosts:
            raise HyperTFError(
                f"no agent is running on any host of {self.inventory.path}: start them with "
                f"'invoke agent.start -i {self.inventory.path}' (status: hypertf status)"
            )
        return hosts

    def _vouched(self, records: dict[str, AgentRecord]) -> dict[str, AgentRecord]:
        """The records with each host's data address as the inventory vouches for it
        (hypertf.core.addresses): an agent's claim the inventory cannot check is replaced
        by the host's inventory address, said once per host and claim."""
        nodes = self.inventory.nodes
        chosen = data_addresses({
            host: HostAddresses(nodes[host].address, record.data_addr,
                                nodes[host].settings.data_network)
            for host, record in records.items() if host in nodes})
        vouched = dict(records)
        for host, (address, refused) in chosen.items():
            if refused and (host, records[host].data_addr) not in self._said_refused:
                self._said_refused.add((host, records[host].data_addr))
                self.say(f"hypertf: notice: {host}'s agent reports the data address "
                         f"{records[host].data_addr}, not taken ({refused}): its tasks use "
                         f"the inventory's address {address}")
            if address != records[host].data_addr:
                vouched[host] = replace(records[host], data_addr=address)
        return vouched
