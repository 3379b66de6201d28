"""The lab: a real multi-host cluster on this machine, one network namespace per host.

Each host has its own address on a private bridge, its own hostname, a private ``/srv``, its
own sshd (PID 1 of the host's PID namespace, so orphans are reaped and the whole host dies
with it), a host key pinned in the lab's known_hosts, and, unless asked otherwise, a HyperTF
agent with a static GPU source. A ZooKeeper for the lab listens on the bridge address. Names
and the subnet carry a random lab id, so two labs (or a lab and a CI run) never collide.
Everything the lab creates is recorded in ``lab.json`` and removed by ``down``.

The hosts log in as this machine's root, but each with a home of its own
(``<lab>/<host>/home``, sshd's ``SetEnv HOME``): what a host keeps in ``~/.ssh`` (the
cluster-internal offload key, its ``authorized_keys``, which that host's sshd reads beside
the lab's shared one) is that host's alone, as on real nodes, and nothing reaches the
operator's own ``~/.ssh``. Each sshd sets ``SHLVL=1``, so bash reads no ``~/.bashrc`` for
the lab's commands. ``StartupFiles`` builds the opposite, a node as users have them: each
host's user has a given ``.bashrc`` in that home that every command runs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hypertf.config.paths import state_home
from hypertf.core.errors import HyperTFError, LabError
from hypertf.node import procs
from hypertf.ops import labaccounts
from hypertf.ops.zkserver import ZooKeeperServer, ensemble, free_port

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class StartupFiles:
    """Hosts whose user has shell startup files, as real nodes do: HOME is
    ``<host dir>/home`` (sshd's SetEnv) holding ``bashrc`` as ``.bashrc``, which bash runs
    for every SSH command. The sshd of the hosts named in ``accept_shlvl`` takes SHLVL from
    the client (``AcceptEnv SHLVL``, what an admin may allow), so HyperTF's commands, which
    send SHLVL=1, skip the file there."""

    bashrc: str
    accept_shlvl: tuple[str, ...] = ()


@dataclass
class LabHost:
    name: str
    namespace: str
    veth: str
    address: str
    holder_pid: int = 0


@dataclass
class Lab:
    """What one lab created; enough to tear it down from another process."""

    lab_id: str
    directory: str
    bridge: str
    gateway: str
    hosts: list[LabHost] = field(default_factory=list)
    zookeeper: list[dict[str, object]] = field(default_factory=list)
    inventory: str = ""
    per_user: bool = False  # hypertf_user_accounts: managed (one Unix account per user)
    accounts: list[str] = field(default_factory=list)  # the Unix accounts it made
    groups: list[str] = field(default_factory=list)  # the Unix group it made (its accounts')
    opened: list[str] = field(default_factory=list)  # closed dirs its group may traverse

    @property
    def group(self) -> str:
        return f"htf{self.lab_id}"

    @property
    def account_prefix(self) -> str:
        """The lab's users' accounts are ``htf<lab id>-<user>``: two labs never share one."""
        return f"htf{self.lab_id}-"

    def user_dir(self, user: str) -> Path:
        """Where the lab keeps ``user``'s own SSH key (``id_ed25519``), as the user would."""
        return self.dir / "users" / user

    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def key_file(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    def zk_servers(self) -> list[ZooKeeperServer]:
        """The lab's ZooKeeper members (one, or an ensemble)."""
        return [
            ZooKeeperServer(str(z["address"]), int(str(z["port"])), Path(str(z["directory"])),
                            int(str(z.get("myid", 0))),
                            tuple(str(p) for p in z.get("peers", ()) or ()))  # type: ignore[attr-defined]
            for z in self.zookeeper
        ]

    def zk_server(self) -> ZooKeeperServer | None:
        servers = self.zk_servers()
        return servers[0] if servers else None

    @property
    def zookeeper_hosts(self) -> str:
        return ",".join(f"{z['address']}:{z['port']}" for z in self.zookeeper)

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise LabError(f"lab {self.lab_id} has no host {name!r}")

    def save(self) -> None:
        (self.dir / "lab.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> Lab:
        payload = json.loads((directory / "lab.json").read_text())
        payload["hosts"] = [LabHost(**h) for h in payload["hosts"]]
        return cls(**payload)

    def cut(self, name: str) -> None:
        """Take a host off the network (its link down): ssh times out, sessions expire."""
        _ip("link", "set", self.host(name).veth, "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self.host(name).veth, "up")


def labs_home() -> Path:
    path = state_home() / "labs"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def strict_modes_problem(path: Path) -> str | None:
    """Why sshd's StrictModes would refuse a key file at ``path`` (the lab's hosts log in as
    this user with keys kept there), or None. sshd checks the file and every directory up
    to / (up to the user's home when the file lies inside it): each must be owned by root
    or the user and writable by neither group nor others (Debian's sshd lets a group of
    the user alone pass; others refuse it). The sticky bit does not count: a directory
    under /tmp (mode 1777) is refused. Parts that do not exist yet are made 0700 by the
    lab and pass."""
    uid = os.getuid()
    home = Path(os.path.expanduser("~")).resolve()
    target = path.resolve()
    for directory in (target, *target.parents):
        try:
            info = directory.stat()
        except FileNotFoundError:
            continue
        if info.st_uid not in (0, uid):
            return f"{directory} is owned by uid {info.st_uid}, neither root nor this user"
        if info.st_mode & 0o022:
            who = "others" if info.st_mode & 0o002 else "its group"
            return f"{directory} is writable by {who} (mode {info.st_mode & 0o7777:o})"
        if directory == home:
            return None
    return None


def refused_keys(lab: Lab) -> list[str]:
    """What the lab hosts' sshd logged when it refused a key (StrictModes names the path)."""
    found = []
    for host in lab.hosts:
        with contextlib.suppress(OSError):
            log = (lab.dir / host.name / "sshd.log").read_text(errors="replace")
            found += [f"{host.name}: {line.strip()}" for line in log.splitlines()
                      if "Authentication refused" in line or "bad ownership or modes" in line]
    return found


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LabError(
            f"{argv[0]} is not installed (apt-get install iproute2 openssh-server)"
        ) from None
    except subprocess.CalledProcessError as err:
        raise LabError(f"{' '.join(argv)} failed: {err.stderr.strip() or err.returncode}") from None
    return done.stdout


def _ip(*argv: str) -> str:
    return _run("ip", *argv)


def _check_requirements() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, bridges, sshd)")
    for tool in ("ip", "unshare", "ssh-keygen", SSHD):
        if not shutil.which(tool):
            raise LabError(f"{tool} not found: apt-get install iproute2 openssh-server util-linux")


def _pick_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.100-10.249 that no interface or route on this machine uses."""
    used = _ip("-4", "-o", "addr", "show") + _ip("-4", "route", "show", "table", "all")
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{random.randint(100, 249)}.{random.randint(0, 255)}.0/24")
        prefix = ".".join(str(net.network_address).split(".")[:3]) + "."
        if prefix not in used:
            return net
    raise LabError("no free 10.x.y.0/24 subnet found for the lab")


def _wait_port(address: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return True
        time.sleep(0.05)
    return False


SSHD_CONFIG = """\
ListenAddress {address}
HostKey {hostdir}/ssh_host_ed25519_key
PidFile none
PermitRootLogin prohibit-password
AuthorizedKeysFile {authorized_keys} {home}/.ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
MaxStartups 100:30:200
Subsystem sftp /usr/lib/openssh/sftp-server
"""
QUIET_SHELL = "SHLVL=1"  # sshd SetEnv: bash reads no ~/.bashrc for sshd's commands (SHLVL >= 2)


def _shell_setup(hostdir: Path, host: LabHost, startup: StartupFiles | None,
                 accounts: str = "") -> str:
    """The sshd_config lines for the user's shell: a home of the host's own (with an empty
    ``.ssh``), and no startup files or the given ones. ``accounts``: the prefix of the
    lab's user accounts (a per-user lab's, or those ``hypertf auth add-user`` makes on a
    managed inventory of the lab), which log in with their own keys and homes (Match
    blocks: root keeps the host's home)."""
    home = hostdir / "home"
    (home / ".ssh").mkdir(mode=0o700, parents=True)
    home.chmod(0o700)
    if startup is None:
        lines = f"SetEnv {QUIET_SHELL} HOME={home}\n"  # one line: sshd keeps the first SetEnv
    else:
        (home / ".bashrc").write_text(startup.bashrc)
        accept = "AcceptEnv SHLVL\n" if host.name in startup.accept_shlvl else ""
        lines = f"SetEnv HOME={home}\n{accept}"
    if not accounts:
        return lines
    root = "".join(f"  {line}\n" for line in lines.splitlines())
    return (f"Match User root\n{root}"
            f"Match User {accounts}*\n  AuthorizedKeysFile %h/.ssh/authorized_keys\n"
            f"  SetEnv {QUIET_SHELL}\n")


def _cgroup_mounts() -> str:
    """Shell commands giving a host the machine's cgroup hierarchies ('ip netns exec' mounts
    a fresh /sys, which has none), as a real node has them; a failure leaves the host
    without (its agent then says 'none: ...')."""
    from hypertf.node import confine

    unified, devices = confine.mounts()
    if unified == "/sys/fs/cgroup":
        steps = ["mount -t cgroup2 cgroup2 /sys/fs/cgroup"]
    else:
        steps = ["mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup"]
        if unified:
            steps += [f"mkdir -p {unified}", f"mount -t cgroup2 cgroup2 {unified}"]
    if devices:
        steps += [f"mkdir -p {devices}", f"mount -t cgroup -o devices cgroup {devices}"]
    if not unified and not devices:
        return ""
    return "{ " + " && ".join(steps) + "; } >/dev/null 2>&1; "


def _start_host(lab: Lab, host: LabHost, all_hosts: list[LabHost],
                startup: StartupFiles | None = None) -> None:
    """A host's sshd in its namespaces. A per-user lab's host hides processes from other
    accounts (``/proc`` with ``hidepid=2``, as docs/provisioning.md asks of real nodes):
    one user's tasks cannot list another's command lines."""
    hostdir = lab.dir / host.name
    (hostdir / "srv").mkdir(parents=True)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host.name}-hostkey",
         "-f", str(hostdir / "ssh_host_ed25519_key"))
    hosts_file = "127.0.0.1 localhost\n" + "".join(
        f"{h.address} {h.name}\n" for h in all_hosts
    )
    (hostdir / "hosts").write_text(hosts_file)
    (hostdir / "sshd_config").write_text(
        SSHD_CONFIG.format(address=host.address, hostdir=hostdir,
                           authorized_keys=lab.dir / "authorized_keys", home=hostdir / "home")
        + _shell_setup(hostdir, host, startup, lab.account_prefix)
    )
    hide = "mount -o remount,hidepid=2 /proc && " if lab.per_user else ""
    script = (
        f"hostname {host.name} && {hide}mount --bind {hostdir}/srv /srv && "
        f"mount --bind {hostdir}/hosts /etc/hosts && {_cgroup_mounts()}"
        f"exec {SSHD} -D -f {hostdir}/sshd_config -E {hostdir}/sshd.log"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "--pid", "--fork",
         "--kill-child", "--mount-proc", "sh", "-c", script],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    host.holder_pid = proc.pid


def _write_inventory(lab: Lab, gpus: int, session_timeout: float,
                     settings: Mapping[str, Any]) -> Path:
    if sys.prefix == sys.base_prefix:
        raise LabError("run the lab from HyperTF's virtualenv (.venv): its hosts use it")
    ssh_args = (f"-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
                f"-o ControlMaster=no")
    inventory: dict[str, Any] = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(lab.key_file),
                "ansible_ssh_common_args": ssh_args,
                "ansible_python_interpreter": sys.executable,
                "hypertf_known_hosts": str(lab.known_hosts),
                "hypertf_venv": sys.prefix,
                "hypertf_workdir": "/srv/hypertf",
                "hypertf_zk_session_timeout": session_timeout,
                "hypertf_agent_interval": 1.0,
                "hypertf_gpu_source": "static",
                "hypertf_static_gpus": gpus,
                "hypertf_ssh_timeout": 5.0,
                # The hosts' job cgroups (docs/gpu.md "Confinement"): the machine's cgroup
                # hierarchies are shared by every lab, so each lab has a subtree of its own.
                "hypertf_cgroup_root": cgroup_root(lab),
                # Shared by the lab's hosts (only /srv is private to each).
                "hypertf_zk_credentials": str(lab.dir / "credentials"),
            },
            "children": {
                "gpu_nodes": {"hosts": {h.name: {"ansible_host": h.address} for h in lab.hosts}},
            },
        }
    }
    if lab.per_user:
        inventory["all"]["vars"].update({
            "hypertf_user_accounts": "managed",
            "hypertf_account_prefix": lab.account_prefix,
            "hypertf_user_ssh_key": str(lab.dir / "users" / "{user}" / "id_ed25519"),
        })
    inventory["all"]["vars"].update(settings)
    if lab.zookeeper:
        inventory["all"]["vars"]["hypertf_zookeeper_hosts"] = lab.zookeeper_hosts
    path = lab.dir / "inventory.yml"
    header = f"# Lab {lab.lab_id}: written by 'invoke lab.up'; removed by 'invoke lab.down'.\n"
    path.write_text(header + yaml.safe_dump(inventory, sort_keys=False))
    return path


def up(hosts: int = 3, gpus: int = 4, agents: bool = True, zookeeper: bool = True,
       session_timeout: float = 6.0, base: Path | None = None, zookeeper_members: int = 1,
       startup_files: StartupFiles | None = None,
       settings: Mapping[str, Any] | None = None, per_user: bool = False) -> Lab:
    """Build a lab; on any failure, remove what was built and raise LabError.

    ``zookeeper_members`` > 1 runs a quorum ensemble on the bridge address instead of one
    standalone server. ``settings``: more ``hypertf_*`` settings for every host (what
    the agents read at their start: hypertf_preempt...). ``startup_files``: the hosts'
    user has these (see StartupFiles); by default the lab's commands read none.
    ``per_user``: every HyperTF user of the lab is a Unix account of its own
    (``htf<lab id>-<user>``, removed with the lab) that runs that user's tasks and logs in
    with that user's own key; each host keeps only its own credentials, as a real node does
    (hypertf.ops.labaccounts).
    """
    if not 1 <= hosts <= 50:
        raise LabError(f"--hosts must be between 1 and 50, not {hosts}")
    if not 0 <= gpus <= 64:
        raise LabError(f"--gpus must be between 0 and 64, not {gpus}")
    _check_requirements()
    lab_id = secrets.token_hex(3)
    directory = (base or labs_home()) / lab_id
    problem = strict_modes_problem(directory / "authorized_keys")
    if problem:
        raise LabError(f"sshd's StrictModes would refuse the lab's SSH keys under {directory}: "
                       f"{problem}; build the lab under a private directory (HYPERTF_HOME, "
                       f"default ~/.hypertf)")
    directory.mkdir(mode=0o700, parents=True)
    net = _pick_subnet()
    addresses = list(net.hosts())
    lab = Lab(lab_id=lab_id, directory=str(directory), bridge=f"htf{lab_id}",
              gateway=str(addresses[0]), per_user=per_user)
    lab.hosts = [
        LabHost(name=f"h{i}", namespace=f"htf-{lab_id}-h{i}", veth=f"htf{lab_id}-{i}",
                address=str(addresses[10 + i]))
        for i in range(1, hosts + 1)
    ]
    lab.save()
    try:
        _ip("link", "add", lab.bridge, "type", "bridge")
        lab.save()
        _ip("addr", "add", f"{lab.gateway}/{net.prefixlen}", "dev", lab.bridge)
        _ip("link", "set", lab.bridge, "up")
        for host in lab.hosts:
            _ip("netns", "add", host.namespace)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                "netns", host.namespace)
            _ip("link", "set", host.veth, "master", lab.bridge, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/{net.prefixlen}",
                "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "route", "add", "default", "via", lab.gateway)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hypertf-lab-{lab_id}",
             "-f", str(lab.key_file))
        authorized = lab.dir / "authorized_keys"
        authorized.write_text(lab.key_file.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        for host in lab.hosts:
            _start_host(lab, host, lab.hosts, startup_files)
        lab.save()
        lines = []
        for host in lab.hosts:
            kind, key = (lab.dir / host.name / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            lines.append(f"{host.address} {kind} {key}\n")
        lab.known_hosts.write_text("".join(lines))
        deadline = time.monotonic() + 15
        for host in lab.hosts:
            if not _wait_port(host.address, 22, deadline):
                raise LabError(f"sshd of lab host {host.name} ({host.address}) did not start; "
                               f"see {lab.dir / host.name / 'sshd.log'}")
        if zookeeper and zookeeper_members > 1:
            servers = ensemble(lab.gateway, lab.dir, zookeeper_members)
            lab.zookeeper = [{"address": s.address, "port": s.port, "myid": s.myid,
                              "peers": list(s.peers), "directory": str(s.directory)}
                             for s in servers]
            lab.save()
        elif zookeeper:
            server = ZooKeeperServer(lab.gateway, free_port(lab.gateway), lab.dir / "zookeeper")
            lab.zookeeper = [{"address": server.address, "port": server.port,
                              "directory": str(server.directory)}]
            lab.save()
            server.start(heap="192m", tick_ms=500)
        lab.inventory = str(_write_inventory(lab, gpus, session_timeout, settings or {}))
        lab.save()
        if per_user:
            labaccounts.open_path(lab)
        if zookeeper:
            secure_lab_root(lab)
        if agents:
            start_lab_agents(lab)
    except BaseException:
        down(lab)
        raise
    return lab


def secure_lab_root(lab: Lab) -> None:
    """Credentials for the lab's admin, agents and this user, and the secured root."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory

    inventory = load_inventory(lab.inventory)
    store.secure_cluster(inventory.cluster, list(inventory.nodes))
    if lab.per_user:
        from hypertf.store.auth import job_owner

        labaccounts.add_accounts(lab, [job_owner()])
        labaccounts.node_credentials(lab, inventory)


def add_users(lab: Lab, users: Sequence[str],
              max_priority: Mapping[str, int] | None = None) -> None:
    """Register ``users`` on the lab's store (credentials in the lab's folder, as
    'hypertf auth add-user' makes them) and give some a higher --priority ceiling."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory
    from hypertf.store.auth import set_user_limits

    cluster = load_inventory(lab.inventory).cluster
    store.secure_cluster(cluster, [h.name for h in lab.hosts], users=list(users))
    if lab.per_user:
        labaccounts.add_accounts(lab, list(users))
    admin = store.connect(cluster, identity="admin")
    try:
        for user, ceiling in (max_priority or {}).items():
            set_user_limits(admin, cluster.zk_root, user, ceiling, None)
    finally:
        store.close(admin)


def start_lab_agents(lab: Lab, wait_s: float = 30.0) -> None:
    """Start every host's agent over SSH and wait until each has registered."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory
    from hypertf.ops import agentctl

    inventory = load_inventory(lab.inventory)
    try:
        agentctl.start_agents(inventory, node_inventory=labaccounts.node_inventory
                              if lab.per_user else None)
    except HyperTFError as err:
        refused = refused_keys(lab)
        if not refused:
            raise
        raise LabError(f"{err}; their sshd says: {'; '.join(refused[:3])}") from None
    client = store.connect(inventory.cluster)
    try:
        layout = store.Layout(inventory.cluster.zk_root)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if set(inventory.nodes) <= set(store.Store(client, layout).records()):
                return
            time.sleep(0.1)
        missing = set(inventory.nodes) - set(store.Store(client, layout).records())
        raise LabError(f"agents of {', '.join(sorted(missing))} did not register within "
                       f"{wait_s:.0f} s; see /srv/hypertf/agent.log under {lab.dir}/<host>/srv")
    finally:
        store.close(client)


def down(lab: Lab) -> None:
    """Remove everything the lab created; safe to call twice and on half-built labs."""
    for host in lab.hosts:
        if host.holder_pid and procs.alive(host.holder_pid) and "unshare" in procs.cmdline(
            host.holder_pid
        ):
            procs.stop(host.holder_pid, grace_s=0)  # unshare ignores TERM: KILL at once
    for server in lab.zk_servers():
        server.stop()
    existing = _ip("netns", "list")
    for host in lab.hosts:
        if host.namespace in existing:
            with contextlib.suppress(LabError):
                _ip("netns", "del", host.namespace)
    with contextlib.suppress(LabError):
        _ip("link", "del", lab.bridge)
    labaccounts.remove_accounts(lab)
    _remove_cgroups(lab)
    shutil.rmtree(lab.dir, ignore_errors=True)


def cgroup_root(lab: Lab) -> str:
    """The lab's hypertf_cgroup_root: its own subtree of each cgroup hierarchy."""
    return f"hypertf-lab-{lab.lab_id}"


def _remove_cgroups(lab: Lab) -> None:
    """The job cgroups the lab's agents left (SIGKILLed with their hosts): their processes
    died with the hosts' PID namespaces, so only empty directories remain, deepest first."""
    from hypertf.node import confine

    for mount in confine.mounts():
        top = Path(mount) / cgroup_root(lab) if mount else None
        if top is not None and top.is_dir():
            for folder, _, _ in sorted(os.walk(top), key=lambda walked: -len(walked[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)


def all_labs(base: Path | None = None) -> list[Lab]:
    home = base or labs_home()
    labs = []
    for directory in sorted(home.iterdir()):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            labs.append(Lab.load(directory))
    return labs


def find(lab_id: str | None, base: Path | None = None) -> list[Lab]:
    """One lab by id, or every lab when ``lab_id`` is None."""
    labs = all_labs(base)
    if lab_id is None:
        return labs
    chosen = [lab for lab in labs if lab.lab_id == lab_id]
    if not chosen:
        known = ", ".join(each.lab_id for each in labs) or "none"
        raise LabError(f"no lab {lab_id!r}; labs: {known}")
    return chosen
