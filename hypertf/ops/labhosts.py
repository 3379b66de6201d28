"""The lab's hosts: one network namespace each on the lab's bridge, with its own address,
hostname, private ``/srv`` and sshd (PID 1 of the host's PID namespace, so orphans are
reaped and the whole host dies with it), its host key pinned in the lab's known_hosts.

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
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hypertf.core.errors import LabError
from hypertf.node import procs

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


class Lab(Protocol):
    """What this module needs of a lab (hypertf.ops.lab.Lab, which imports this module)."""

    lab_id: str
    bridge: str
    gateway: str
    per_user: bool

    @property
    def hosts(self) -> Sequence[LabHost]: ...
    @property
    def dir(self) -> Path: ...
    @property
    def key_file(self) -> Path: ...
    @property
    def known_hosts(self) -> Path: ...
    @property
    def account_prefix(self) -> str: ...
    def save(self) -> None: ...


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


def run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LabError(
            f"{argv[0]} is not installed (apt-get install iproute2 openssh-server)"
        ) from None
    except subprocess.CalledProcessError as err:
        raise LabError(f"{' '.join(argv)} failed: {err.stderr.strip() or err.returncode}") from None
    return done.stdout


def ip(*argv: str) -> str:
    return run("ip", *argv)


def check_requirements() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, bridges, sshd)")
    for tool in ("ip", "unshare", "ssh-keygen", SSHD):
        if not shutil.which(tool):
            raise LabError(f"{tool} not found: apt-get install iproute2 openssh-server util-linux")


def pick_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.100-10.249 that no interface or route on this machine uses."""
    used = ip("-4", "-o", "addr", "show") + ip("-4", "route", "show", "table", "all")
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{random.randint(100, 249)}.{random.randint(0, 255)}.0/24")
        prefix = ".".join(str(net.network_address).split(".")[:3]) + "."
        if prefix not in used:
            return net
    raise LabError("no free 10.x.y.0/24 subnet found for the lab")


def link(lab: Lab, prefixlen: int) -> None:
    """The lab's bridge (recorded in lab.json once it exists) and each host's namespace,
    its veth on the bridge, its address and its default route through the gateway."""
    ip("link", "add", lab.bridge, "type", "bridge")
    lab.save()
    ip("addr", "add", f"{lab.gateway}/{prefixlen}", "dev", lab.bridge)
    ip("link", "set", lab.bridge, "up")
    for host in lab.hosts:
        ip("netns", "add", host.namespace)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
           "netns", host.namespace)
        ip("link", "set", host.veth, "master", lab.bridge, "up")
        ip("-n", host.namespace, "link", "set", "lo", "up")
        ip("-n", host.namespace, "addr", "add", f"{host.address}/{prefixlen}",
           "dev", "eth0")
        ip("-n", host.namespace, "link", "set", "eth0", "up")
        ip("-n", host.namespace, "route", "add", "default", "via", lab.gateway)


def start_hosts(lab: Lab, startup: StartupFiles | None) -> None:
    """The lab's SSH key, every host's sshd, their host keys in known_hosts; returns once
    each sshd listens (LabError after 15 s)."""
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hypertf-lab-{lab.lab_id}",
        "-f", str(lab.key_file))
    authorized = lab.dir / "authorized_keys"
    authorized.write_text(lab.key_file.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    for host in lab.hosts:
        _start_host(lab, host, lab.hosts, startup)
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


def stop_hosts(lab: Lab) -> None:
    """Every host's sshd and all under it (its PID namespace ends with it)."""
    for host in lab.hosts:
        if host.holder_pid and procs.alive(host.holder_pid) and "unshare" in procs.cmdline(
            host.holder_pid
        ):
            procs.stop(host.holder_pid, grace_s=0)  # unshare ignores TERM: KILL at once


def unlink(lab: Lab) -> None:
    """The hosts' namespaces and the bridge, those that exist."""
    existing = ip("netns", "list")
    for host in lab.hosts:
        if host.namespace in existing:
            with contextlib.suppress(LabError):
                ip("netns", "del", host.namespace)
    with contextlib.suppress(LabError):
        ip("link", "del", lab.bridge)


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


def _start_host(lab: Lab, host: LabHost, all_hosts: Sequence[LabHost],
                startup: StartupFiles | None = None) -> None:
    """A host's sshd in its namespaces. A per-user lab's host hides processes from other
    accounts (``/proc`` with ``hidepid=2``, as docs/provisioning.md asks of real nodes):
    one user's tasks cannot list another's command lines."""
    hostdir = lab.dir / host.name
    (hostdir / "srv").mkdir(parents=True)
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host.name}-hostkey",
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
