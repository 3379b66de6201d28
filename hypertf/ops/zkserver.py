"""A local standalone ZooKeeper from the Debian package: the embedded default and the lab's.

It runs ``QuorumPeerMain`` with a generated ``zoo.cfg`` and a private data directory, in its
own process session, with a pidfile; it is stopped by that PID, never by name.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from hypertf.core.errors import HyperTFError
from hypertf.node import procs
from hypertf.ops import zkbounds
from hypertf.store.fourletter import mode

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
# TLS needs netty; Debian's netty-all.jar is empty, the split jars are not.
NETTY_JARS = tuple(f"/usr/share/java/netty-{part}.jar" for part in (
    "buffer", "codec", "common", "handler", "resolver", "transport",
    "transport-native-epoll", "transport-native-unix-common"))
INSTALL_HINT = ("apt-get install zookeeper default-jdk-headless (Debian packages: the server, "
                "and javac for HyperTF's provider)")
# ZooKeeper's largest request, and so its largest name (ZooKeeper bounds names by nothing
# else): its own default, said explicitly; HyperTF's transactions need about 0.5 MiB
# (docs/zookeeper-layout.md, "Bounds"). The zookeeper role sets the same.
JUTE_MAXBUFFER = 1048575
# The per-user folders' quotas (hypertf.store.quotas.UserQuotas) refuse past their hard
# limits only with this (ZooKeeper 3.7 and later; Debian's package is 3.8).
# A server out of heap exits (to be started again on its data) rather than limp on with
# threads that died of it; HyperTF's provider bounds names and quotas (hypertf.ops.zkbounds).
SERVER_FLAGS = ("-Dzookeeper.enforceQuota=true", f"-Djute.maxbuffer={JUTE_MAXBUFFER}",
                "-XX:+ExitOnOutOfMemoryError", *zkbounds.server_flags())


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]  # an (address, port) pair, typed Any
        return port


@dataclass(frozen=True)
class ZooKeeperServer:
    """One standalone server; ``directory`` holds zoo.cfg, data, log and pidfile."""

    address: str
    port: int
    directory: Path
    myid: int = 0
    peers: tuple[str, ...] = ()  # "address:peer_port:election_port" of every member, by myid
    # TLS: a secure client port with this PEM (private key + certificate chain) and the CA
    # that clients verify it with; the plain port stays for the four-letter words.
    secure_port: int = 0
    tls_pem: str = ""
    tls_ca: str = ""

    @property
    def hosts(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def pidfile(self) -> Path:
        return self.directory / "zookeeper.pid"

    @property
    def logfile(self) -> Path:
        return self.directory / "zookeeper.log"

    def pid(self) -> int | None:
        """The PID from the pidfile if that process is still alive."""
        try:
            pid = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return None
        if not procs.alive(pid) or "QuorumPeerMain" not in procs.cmdline(pid):
            return None  # gone, or the PID now belongs to someone else
        return pid

    def mode(self) -> str | None:
        return mode(self.address, self.port)

    def write_config(self, tick_ms: int = 2000) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    f"tickTime={tick_ms}",
                    "initLimit=10",
                    "syncLimit=5",
                    f"dataDir={data}",
                    f"clientPortAddress={self.address}",
                    f"clientPort={self.port}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,stat,mntr",
                    # Quick sessions for short timeouts (the lab and tests use 2-4 s).
                    f"minSessionTimeout={2 * tick_ms}",
                    "maxClientCnxns=0",
                    *(f"server.{i}={peer}" for i, peer in enumerate(self.peers, start=1)),
                    *self._tls_config(),
                    "",
                ]
            )
        )
        if self.peers:
            (data / "myid").write_text(f"{self.myid}\n")
        return config

    def _tls_config(self) -> list[str]:
        if not self.secure_port:
            return []
        return [
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"secureClientPort={self.secure_port}",
            f"secureClientPortAddress={self.address}",
            f"ssl.keyStore.location={self.tls_pem}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls_ca}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=none",
        ]

    def start(self, heap: str = "256m", wait_s: float = 30.0, tick_ms: int = 2000,
              wait: bool = True) -> int:
        """Start (or find running) and wait until it serves; returns the PID."""
        running = self.pid()
        if running and self.mode():
            return running
        jars = ZOOKEEPER_JARS + (NETTY_JARS if self.secure_port else ())
        missing = [jar for jar in jars if not Path(jar).exists()]
        if missing:
            raise HyperTFError(f"ZooKeeper is not installed ({missing[0]} missing): {INSTALL_HINT}")
        if mode(self.address, self.port):
            raise HyperTFError(
                f"another ZooKeeper already serves {self.hosts}; stop it, or point "
                f"hypertf_zookeeper_hosts at it instead of starting one"
            )
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        jars = (*jars, str(zkbounds.provider_jar()))
        config = self.write_config(tick_ms)
        with open(self.logfile, "ab") as log:
            proc = subprocess.Popen(
                ["java", f"-Xmx{heap}", "-Dzookeeper.admin.enableServer=false", *SERVER_FLAGS,
                 "-cp", ":".join(jars),
                 "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pidfile.write_text(str(proc.pid))
        if not wait:
            return proc.pid
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = self.logfile.read_text(errors="replace").splitlines()[-5:]
                raise HyperTFError(
                    f"ZooKeeper on {self.hosts} exited at start ({proc.returncode}); "
                    f"log {self.logfile}:\n" + "\n".join(tail)
                )
            if self.mode():
                return proc.pid
            time.sleep(0.1)
        self.stop()
        raise HyperTFError(f"ZooKeeper on {self.hosts} did not serve within {wait_s:.0f} s; "
                           f"see {self.logfile}")

    def stop(self, grace_s: float = 10.0) -> bool:
        """Stop by PID (TERM, then KILL); True if it was running."""
        pid = self.pid()
        stopped = procs.stop(pid, grace_s) if pid else False
        self.pidfile.unlink(missing_ok=True)
        return stopped


def ensemble(address: str, directory: Path, members: int = 3, tick_ms: int = 500,
             heap: str = "160m", wait_s: float = 60.0) -> list[ZooKeeperServer]:
    """Start a quorum of ``members`` servers on one address (distinct ports) and wait."""
    ports = [(free_port(address), free_port(address), free_port(address)) for _ in range(members)]
    peers = tuple(f"{address}:{peer}:{election}" for _, peer, election in ports)
    servers = [ZooKeeperServer(address, client, directory / f"zookeeper{i}", i, peers)
               for i, (client, _, _) in enumerate(ports, start=1)]
    try:
        for server in servers:
            server.start(heap=heap, tick_ms=tick_ms, wait=False)
        deadline = time.monotonic() + wait_s
        while not all(server.mode() for server in servers):
            if time.monotonic() > deadline:
                raise HyperTFError(f"the ZooKeeper ensemble on {address} formed no quorum "
                                   f"within {wait_s:.0f} s; see {directory}/zookeeper*/")
            time.sleep(0.2)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def local_server(hosts: str, base: Path) -> ZooKeeperServer:
    """The server an inventory's single local ZooKeeper address describes."""
    if "," in hosts or "/" in hosts:
        raise HyperTFError(
            f"zk.start runs one local server, but the inventory names {hosts!r}; "
            f"an ensemble is deployed with the zookeeper role (cluster.setup)"
        )
    address, _, port = hosts.rpartition(":")
    if not address or not port.isdigit():
        raise HyperTFError(f"ZooKeeper address {hosts!r} must look like 127.0.0.1:2181")
    return ZooKeeperServer(address, int(port), base / f"zookeeper-{address}-{port}")
