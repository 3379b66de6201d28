"""A cgroup's device access confined by a hand-assembled BPF program (hypertf.node.bpfdevice):
the assembler's bytes, and on a real cgroup v2 directory what a process in it may open."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypertf.node import bpfdevice
from hypertf.node.bpfdevice import DeviceProgramError

# The child joins the cgroup itself, so nothing else of the test is confined, then says
# how each path opened read-write: OK or the errno's name.
CHILD = """
import errno, os, sys
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
said = []
for path in sys.argv[2:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        said.append("OK")
    except OSError as exc:
        said.append(errno.errorcode[exc.errno])
print(" ".join(said))
"""


def hexes(code: bytes) -> list[str]:
    return [code[i:i + 8].hex(" ") for i in range(0, len(code), 8)]


PROLOGUE = [
    "61 12 00 00 00 00 00 00",  # r2 = *(u32 *)(r1 + 0)
    "54 02 00 00 ff ff 00 00",  # w2 &= 0xffff
    "61 13 04 00 00 00 00 00",  # r3 = *(u32 *)(r1 + 4)
    "61 14 08 00 00 00 00 00",  # r4 = *(u32 *)(r1 + 8)
]
ALLOW = ["b7 00 00 00 01 00 00 00", "95 00 00 00 00 00 00 00"]  # r0 = 1; exit


@pytest.mark.skipif(sys.byteorder != "little", reason="the expected bytes are little-endian")
def test_the_assembler_encodes_a_known_program() -> None:
    assert bpfdevice.exit_() == bytes.fromhex("9500000000000000")
    assert hexes(bpfdevice.assemble([])) == PROLOGUE + ALLOW
    assert hexes(bpfdevice.assemble([("c", 195, 1), ("b", 8, -1), ("c", 195, 1)])) == [
        *PROLOGUE,
        "55 02 04 00 02 00 00 00",  # if r2 != 2 (char) goto +4
        "55 03 03 00 c3 00 00 00",  # if r3 != 195 goto +3
        "55 04 02 00 01 00 00 00",  # if r4 != 1 goto +2
        "b7 00 00 00 00 00 00 00",  # r0 = 0
        "95 00 00 00 00 00 00 00",  # exit
        "55 02 03 00 01 00 00 00",  # if r2 != 1 (block) goto +3
        "55 03 02 00 08 00 00 00",  # if r3 != 8 goto +2 (every minor: no minor test)
        "b7 00 00 00 00 00 00 00",
        "95 00 00 00 00 00 00 00",
        *ALLOW,  # the duplicate of 195:1 is dropped
    ]


@pytest.mark.parametrize("denied", [
    [("x", 195, 0)], [("c", 4096, 0)], [("c", -1, 0)], [("c", 195, 1 << 20)],
    [("c", 195, -2)], [("c", 195, m) for m in range(bpfdevice.MAX_DEVICES + 1)],
])
def test_a_bad_or_absurd_list_is_refused_before_any_syscall(denied: list[bpfdevice.Device]):
    with pytest.raises(DeviceProgramError, match="cannot build the device program") as err:
        bpfdevice.assemble(denied)
    assert err.value.step == "build"


def test_the_cgroup2_mount_is_read_from_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
        "41 31 0:38 / /sys/fs/cgroup/my\\040v2 rw,relatime shared:9 - cgroup2 cgroup2 rw\n")
    assert bpfdevice.cgroup2_mount(info) == Path("/sys/fs/cgroup/my v2")
    info.write_text("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n")
    assert bpfdevice.cgroup2_mount(info) is None
    assert bpfdevice.cgroup2_mount(tmp_path / "absent") is None


def registered_char_majors() -> set[int]:
    text = Path("/proc/devices").read_text().split("Block devices:")[0]
    return {int(line.split()[0]) for line in text.splitlines() if line[:4].strip().isdigit()}


def free_major() -> int:
    """195 (NVIDIA's) where no driver holds it, so an allowed open fails with ENXIO."""
    taken = registered_char_majors()
    return next(m for m in (195, *range(240, 255)) if m not in taken)


def empty_and_remove(cgroup: Path, home: Path) -> None:
    """Move any process left in ``cgroup`` (or below) to ``home``, then remove the tree."""
    below = sorted((p for p in cgroup.rglob("*") if p.is_dir()), reverse=True)
    for directory in [*below, cgroup]:
        deadline = time.monotonic() + 5
        while True:
            for pid in (directory / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    (home / "cgroup.procs").write_text(pid)
            try:
                directory.rmdir()
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A fresh cgroup v2 directory, removed afterwards even when the test fails."""
    if os.geteuid() != 0:
        pytest.skip("needs root: cgroup writes, mknod and CAP_BPF")
    mount = bpfdevice.cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 mount in /proc/self/mountinfo")
    if (reason := bpfdevice.available()) is not None:
        pytest.skip(f"no cgroup device programs here: {reason}")
    own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if line.startswith("0::"))
    path = mount / f"hypertf-test-bpfdevice-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        empty_and_remove(path, mount / own.lstrip("/"))


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[int, list[str]]:
    """Character device nodes MAJOR:0 and MAJOR:1 (no driver behind them), and /dev/null."""
    if os.statvfs(tmp_path).f_flag & os.ST_NODEV:
        pytest.skip(f"{tmp_path} is mounted nodev")
    major = free_major()
    paths = []
    for minor in (0, 1):
        path = tmp_path / f"dev{minor}"
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
        paths.append(str(path))
    return major, [*paths, "/dev/null"]


def opens(cgroup: Path, paths: list[str]) -> list[str]:
    """How each path opens read-write for a new process in ``cgroup``."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, str(cgroup / "cgroup.procs"),
                           *paths], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


def test_a_denied_device_is_refused_to_the_cgroup_and_every_cgroup_below(
        cgroup: Path, nodes: tuple[int, list[str]]) -> None:
    major, paths = nodes
    assert opens(cgroup, paths) == ["ENXIO", "ENXIO", "OK"]  # no program: no driver
    bpfdevice.deny_devices(cgroup, [("c", major, 1)])
    assert bpfdevice.attached(cgroup) == 1
    assert opens(cgroup, paths) == ["ENXIO", "EPERM", "OK"]
    assert opens(cgroup, paths) == ["ENXIO", "EPERM", "OK"]

    # a second call replaces the program, it does not stack beside it
    bpfdevice.deny_devices(cgroup, [("c", major, 0)])
    assert bpfdevice.attached(cgroup) == 1
    assert opens(cgroup, paths) == ["EPERM", "ENXIO", "OK"]

    # a cgroup below inherits the refusal and may not attach a looser program of its own
    below = cgroup / "task0"
    below.mkdir()
    assert opens(below, paths) == ["EPERM", "ENXIO", "OK"]
    with pytest.raises(DeviceProgramError, match="EPERM") as err:
        bpfdevice.deny_devices(below, [])
    assert (err.value.step, err.value.errno) == ("attach", errno.EPERM)
    assert opens(below, paths) == ["EPERM", "ENXIO", "OK"]

    # every minor of a major
    bpfdevice.deny_devices(cgroup, [("b", major, -1), ("c", major, -1)])
    assert opens(below, paths) == ["EPERM", "EPERM", "OK"]

    assert bpfdevice.detach(cgroup)
    assert not bpfdevice.detach(cgroup)
    assert bpfdevice.attached(cgroup) == 0
    assert opens(below, paths) == ["ENXIO", "ENXIO", "OK"]


def test_each_failure_names_its_step_and_errno(cgroup: Path, tmp_path: Path) -> None:
    with pytest.raises(DeviceProgramError, match=r"open .*ENOENT \(no such cgroup directory"):
        bpfdevice.deny_devices(cgroup / "absent", [])
    with pytest.raises(DeviceProgramError, match=r"attach .*EBADF \(not a cgroup v2 directory"):
        bpfdevice.deny_devices(tmp_path, [])  # a plain directory
    with pytest.raises(DeviceProgramError, match=r"EACCES .*verifier: R0 !read_ok") as err:
        bpfdevice.load(bpfdevice.exit_())  # returns r0 without setting it
    assert "R0 !read_ok" in err.value.log
