"""``hypertf lab``, typed as in hypertf.cli.commands: up, down, list, and the inventory
that provisions a lab's bare hosts (hypertf.ops.lab)."""

from __future__ import annotations

from pathlib import Path


def lab_up(hosts: int = 3, gpus: int = 4, agents: bool = True, zookeeper_members: int = 1,
           per_user: bool = True) -> int:
    from hypertf.ops import lab

    built = lab.up(hosts=hosts, gpus=gpus, agents=agents, zookeeper_members=zookeeper_members,
                   per_user=per_user)
    for host in built.hosts:
        print(f"{host.name} {host.address} (namespace {host.namespace})")
    print(f"ZooKeeper {built.zookeeper_hosts}" if built.zookeeper else "no ZooKeeper")
    if built.per_user:
        print(f"each user's tasks run as {built.account_prefix}<user> (keys in "
              f"{built.dir / 'users'}; 'hypertf auth add-user' on this inventory adds one)")
    print(built.inventory)
    return 0


def lab_down(name: str | None = None) -> int:
    from hypertf.ops import lab

    labs = lab.find(name)
    for each in labs:
        lab.down(each)
        print(f"lab {each.lab_id} removed")
    if not labs:
        print("no lab to remove")
    return 0


def lab_list() -> int:
    from hypertf.ops import lab

    for each in lab.find(None):
        print(f"{each.lab_id} {len(each.hosts)} hosts {each.inventory}")
    return 0


def lab_inventory(inventory: str, zookeeper: str = "h1", tensorflow: str = "tensorflow-cpu",
                  operator_dir: str | None = None, name: str = "provision.yml") -> int:
    """An inventory that provisions a lab's bare hosts; prints its path."""
    from hypertf.ops.labprovision import lab_inventory as write

    print(write(Path(inventory).resolve().parent, name=name,
                zookeeper=[h for h in zookeeper.split(",") if h], tensorflow=tensorflow,
                operator_dir=operator_dir))
    return 0
