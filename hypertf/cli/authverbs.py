"""``hypertf auth``, typed as in hypertf.cli.commands (the admin's verbs): init (the
credentials and the secured root), add-user (a user's credential and, on a per-user
cluster, their node account), accounts (the register of node accounts), limits and
footprint (what each user makes ZooKeeper hold; one user's junk deleted)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hypertf.config.inventory import load_inventory
from hypertf.core.errors import UsageError

if TYPE_CHECKING:
    from hypertf.config.inventory import Inventory
    from hypertf.store.footprint import FolderFootprint, Footprint


def auth(inventory: str, action: str, user: str | None = None, reset: bool = False,
         print_dir: bool = False, max_priority: int | None = None,
         gpu_limit: int | None = None, share: float | None = None,
         gpu_hours_per_month: float | None = None, no_preempt_ok: bool = False,
         preemptible: bool = False, ssh_key: str | None = None, uid: int | None = None,
         no_nodes: bool = False, as_json: bool = False,
         delete_junk: str | None = None) -> int:
    from hypertf import store
    from hypertf.store import bootstrap, credentials

    inv = load_inventory(inventory)
    if action == "accounts":
        return _accounts(inv, as_json)
    if action == "footprint":
        return _footprint(inv, as_json, delete_junk)
    if action in ("add-user", "limits") and not user:
        raise UsageError(f"hypertf auth {action} NAME: name the user")
    if action == "limits":
        if no_preempt_ok and preemptible:
            raise UsageError("--no-preempt-ok and --preemptible exclude each other: give one")
        exempt = True if no_preempt_ok else False if preemptible else None
        with store.opened(inv.cluster) as zk:
            limits = bootstrap.set_user_limits(zk.client, inv.cluster.zk_root, str(user),
                                               max_priority, gpu_limit, share,
                                               gpu_hours_per_month, exempt).of(str(user))
        cap = limits.gpu_limit or "the cluster's hypertf_user_gpu_limit"
        budget = f"{limits.gpu_hours_per_month:g} GPU-hours a month" \
            if limits.gpu_hours_per_month else "no budget"
        never = ", never preempted" if limits.no_preempt_ok else ""
        print(f"{user}: priority at most {limits.max_priority}, GPUs at most {cap}, "
              f"share {limits.share:g}, {budget}{never}")
        return 0
    users = [credentials.check_name("user", user)] if action == "add-user" and user else []
    # An inventory with a zookeeper group provisions its ZooKeeper (the role): its own.
    directory = store.secure_cluster(inv.cluster, list(inv.nodes), users, reset=reset,
                                     own_server=bool(inv.zookeeper_nodes))
    if action == "add-user":
        print(credentials.handover_note(str(user), directory, inv.cluster.zk_credentials,
                                        inv.cluster.zookeeper_hosts, inv.cluster.zk_root))
        if inv.cluster.account_policy.per_user:
            _add_account(inv, directory, str(user), ssh_key, uid, no_nodes)
    else:
        print(f"ZooKeeper root {inv.cluster.zk_root} secured; credentials in {directory}")
    if print_dir:
        print(directory)
    return 0


def _accounts(inv: Inventory, as_json: bool) -> int:
    """``hypertf auth accounts``: the admin's register of node accounts."""
    from hypertf import store
    from hypertf.ops import accounts

    rows = accounts.registered(store.credentials_dir(inv.cluster), inv.cluster.account_policy)
    if as_json:
        print(accounts.to_json(rows))
        return 0
    policy = inv.cluster.account_policy
    print(f"tasks run as: {policy.mode} accounts" + (
        "" if policy.per_user else " (every user as the inventory's ansible_user)"))
    for row in rows:
        uid = str(row.uid) if row.uid is not None else "(the site's)"
        print(f"{row.user:<16} {row.account:<24} uid {uid:<12} "
              f"{'key' if row.public_key else 'NO KEY'}")
    return 0


def _footprint(inv: Inventory, as_json: bool, delete_junk: str | None) -> int:
    """``hypertf auth footprint``: each user's folders as ZooKeeper holds them, largest
    first; ``--delete-junk USER``: that user's junk names deleted first (admin only)."""
    import json

    from hypertf import store
    from hypertf.store import footprint

    with store.opened(inv.cluster) as zk:
        footprints = footprint.StoreFootprint(zk)
        footprints.require_admin("run 'hypertf auth footprint'")
        deleted = footprints.delete_junk(delete_junk) if delete_junk else None
        seen = footprints.footprint()
    if as_json:
        print(json.dumps({**seen.as_dict(),
                          **({"deleted": deleted.as_dict()} if deleted else {})}, indent=2))
        return 0
    if deleted:
        refused = (f"; {len(deleted.refused)} refused (their ACL shuts the admin out: "
                   f"ZooKeeper's super user can delete them)" if deleted.refused else "")
        print(f"{deleted.user}: deleted {deleted.names} junk names ({deleted.znodes} znodes, "
              f"{deleted.data_bytes:,} data bytes, {deleted.name_bytes:,} name bytes)"
              f"{refused}")
    print(footprint_table(seen))
    return 0


FOOTPRINT_COLUMNS = (("USER", 16), ("LEASES", 13), ("LEASE DATA", 19), ("JOBS", 13),
                     ("JOB DATA", 15), ("NAME BYTES", 12), ("JUNK", 7), ("TOTAL BYTES", 13))


def _used(used: int | None, limit: int | None, unit: str = "") -> str:
    """``used/limit`` (``-``: not known, or no limit)."""
    return (f"{'-' if used is None else f'{used:,}'}{unit}/"
            f"{'-' if limit is None else f'{limit:,}'}")


def _folder_cells(folder: FolderFootprint) -> list[str]:
    if not folder.listed:
        return ["(no folder)", "-"]
    quota = folder.quota
    return [_used(quota.znodes, quota.znode_limit), _used(quota.data_bytes, quota.byte_limit)]


def footprint_table(seen: Footprint) -> str:
    """The footprint as a table: a row per user (znodes/limit and data bytes/limit of each
    folder, its names' bytes, its junk names, data and names together), then the total."""
    lines = [" ".join(f"{name:<{width}}" for name, width in FOOTPRINT_COLUMNS).rstrip()]
    for row in seen.users:
        cells = [row.user, *_folder_cells(row.leases), *_folder_cells(row.jobs),
                 f"{row.name_bytes:,}", f"{row.junk:,}", f"{row.total_bytes:,}"]
        lines.append(" ".join(f"{cell:<{width}}" for cell, (_, width)
                              in zip(cells, FOOTPRINT_COLUMNS, strict=True)).rstrip())
    users = len(seen.users)
    lines.append(f"total: {users} user{'' if users == 1 else 's'}, "
                 f"{seen.data_bytes:,} data bytes, {seen.name_bytes:,} name bytes, "
                 f"{seen.junk:,} junk names, {seen.total_bytes:,} bytes in all")
    return "\n".join(lines)


def _add_account(inv: Inventory, directory: Path, user: str, ssh_key: str | None,
                 uid: int | None, no_nodes: bool) -> None:
    """``auth add-user`` on a per-user cluster: the account registered, its key made or
    taken, and made on every node (the user_accounts role) unless ``no_nodes``."""
    from hypertf.ops import accounts, provision

    policy = inv.cluster.account_policy
    row, made = accounts.register(directory, policy, user,
                                  Path(ssh_key).expanduser() if ssh_key else None, uid)
    print(f"{user}'s tasks run as the account {row.account}"
          + (f" (uid {row.uid} on every node)" if row.uid is not None else
             " (the site's own account, on every node)"))
    if made is not None:
        where = inv.cluster.user_ssh_key.replace("{user}", user)
        print(f"{made}: {user}'s SSH private key for it: give it to {user} with the "
              f"credential (mode 0600, as {where} on the machine they launch from)")
    remote = [n for n in inv.nodes.values() if not n.local]
    if no_nodes or not remote:
        print("the nodes get the account at the next 'invoke cluster.setup'" if remote else "")
        return
    run = provision.run_playbook(provision.ACCOUNTS, inv.path, tags=["accounts"],
                                 extra_vars={"hypertf_gpu_group": inv.cluster.gpu_group})
    provision.recap(run)
    if not run.succeeded:
        raise provision.ProvisionError(f"{user}'s account was registered but not made on "
                                       f"every node; see {run.log}, fix it and run "
                                       f"'invoke cluster.setup --tags accounts'", run)
