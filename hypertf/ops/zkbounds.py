"""HyperTF's bounds inside ZooKeeper: the provider that takes the digest scheme's place on
every server HyperTF starts (``zookeeper/BoundedDigestProvider.java``; docs/
zookeeper-layout.md, "Bounds"), compiled once against the server's own jars.

ZooKeeper bounds a name only by ``jute.maxbuffer`` and checks a quota against committed
data, so no client-side rule can keep one user's flood within the heap; the server must.
The Debian package has no compiler: ``javac`` comes with a JDK (default-jdk-headless).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from hypertf.core.errors import HyperTFError

SOURCE = Path(__file__).with_name("zookeeper") / "BoundedDigestProvider.java"
PROVIDER = "org.apache.zookeeper.server.BoundedDigestProvider"
# The longest znode name the provider lets anyone but ZooKeeper's super user create. Every
# name HyperTF makes is far shorter: task keys (129), host names (253 at most, DNS's), user
# accounts (32), shard and chunk numbers.
NAME_MAX = 255
# What javac needs to see: the server's classes, its records (jute) and its logging API.
BUILD_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar",
              "/usr/share/java/slf4j-api.jar")
JDK_HINT = "apt-get install default-jdk-headless (javac: the provider is compiled on the host)"


def server_flags(name_max: int = NAME_MAX) -> tuple[str, ...]:
    """The JVM flags that load the provider (with the jar on the classpath)."""
    return (f"-Dzookeeper.authProvider.hypertf={PROVIDER}",
            f"-Dhypertf.zookeeper.nameMax={name_max}")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hypertf" / "zookeeper"


def provider_jar(cache: Path | None = None) -> Path:
    """The provider's jar, built when its source or the server's jars changed (named by a
    hash of both, so servers of two versions never share one); atomic, so concurrent
    starts are safe."""
    cache = cache or cache_dir()
    digest = hashlib.sha256(SOURCE.read_bytes())
    for jar in BUILD_JARS:
        path = Path(jar)
        if not path.exists():
            raise HyperTFError(f"ZooKeeper is not installed ({jar} missing): "
                               f"apt-get install zookeeper")
        digest.update(f"{path.resolve()}:{path.stat().st_size}".encode())
    jar_path = cache / f"hypertf-bounds-{digest.hexdigest()[:16]}.jar"
    if jar_path.exists():
        return jar_path
    javac = shutil.which("javac")
    if javac is None:
        raise HyperTFError(f"no javac on this host to build HyperTF's ZooKeeper provider: "
                           f"{JDK_HINT}")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as build:
        done = subprocess.run(
            [javac, "-implicit:none", "-nowarn", "-d", build, "-cp", ":".join(BUILD_JARS),
             str(SOURCE)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise HyperTFError(f"javac could not build {SOURCE.name} against this "
                               f"ZooKeeper ({BUILD_JARS[0]}):\n{done.stderr.strip()}")
        partial = Path(build) / "provider.jar"
        with zipfile.ZipFile(partial, "w") as archive:
            for cls in sorted(Path(build).rglob("*.class")):
                archive.write(cls, cls.relative_to(build).as_posix())
        os.replace(partial, jar_path)
    return jar_path
