"""A job cgroup's device access confined by a BPF program, as Slurm's ConstrainDevices does
on cgroup v2 (which has no ``devices.deny`` file: device access is a program's answer).

The program is assembled here by hand (a few opcodes, no compiler, no libbpf) and loaded with
the raw ``bpf()`` syscall through ctypes, so a node needs nothing beyond the standard library.
It refuses (returns 0) every access to the denied (type, major, minor) devices and allows
(returns 1) everything else; it is attached with no flags (``BPF_F_ALLOW_OVERRIDE`` and
``BPF_F_ALLOW_MULTI`` unset), which gives one program per job cgroup:

- it is in force for every descendant cgroup, and none of them may attach a program of its
  own (the kernel answers EPERM), so a task cannot loosen it from below;
- a second attach on the same directory replaces the program (a non-multi cgroup holds one),
  so root can change a job's devices without stacking programs;
- programs of ancestors attached with ``BPF_F_ALLOW_MULTI`` (systemd's) still run too: an
  access must pass all of them.

The kernel keeps the program while it is attached (its fd is closed at once); removing the
cgroup directory drops it, as does ``detach``.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hypertf.core.errors import HyperTFError

if TYPE_CHECKING:
    from collections.abc import Callable

Device = tuple[str, int, int]  # ('c' or 'b', major, minor); minor -1: every minor
MAX_DEVICES = 512  # a node has a few hundred GPUs at most; 5 instructions each < BPF_MAXINSNS
MAX_MAJOR, MAX_MINOR = (1 << 12) - 1, (1 << 20) - 1  # the kernel's dev_t: 12 + 20 bits
PROG_NAME = b"hypertf_devices"

# The kernel's numbers (include/uapi/linux/bpf.h), spelled once.
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_DETACH, BPF_PROG_QUERY = 5, 8, 9, 16
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE = 15, 6
DEV_KIND = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
ATTR_SIZE = 128  # bytes of union bpf_attr we pass; the kernel zero-fills what it has beyond
SYSCALL_NR = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "riscv64": 280, "s390x": 351}
LOG_SIZE = 1 << 16

# Opcodes: class | size/op | source (BPF_K: the immediate).
LDX_MEM_W = 0x01 | 0x00 | 0x60  # BPF_LDX | BPF_W | BPF_MEM
ALU32_AND_K = 0x04 | 0x50  # BPF_ALU | BPF_AND | BPF_K
ALU64_MOV_K = 0x07 | 0xB0  # BPF_ALU64 | BPF_MOV | BPF_K
JMP_JNE_K = 0x05 | 0x50  # BPF_JMP | BPF_JNE | BPF_K
JMP_EXIT = 0x05 | 0x90  # BPF_JMP | BPF_EXIT

WHY = {  # (step, errno) -> the few words a caller says when it falls back
    ("open", errno.ENOENT): "no such cgroup directory",
    ("open", errno.ENOTDIR): "not a directory",
    ("load", errno.EPERM): "no CAP_BPF or CAP_SYS_ADMIN",
    ("load", errno.EINVAL): "kernel too old for cgroup device programs",
    ("load", errno.EACCES): "the verifier refused the program",
    ("load", errno.ENOMEM): "RLIMIT_MEMLOCK too low (kernels before 5.11)",
    ("load", errno.ENOSYS): "kernel built without bpf()",
    ("attach", errno.EPERM): "an ancestor's device program may not be overridden, or no "
                             "CAP_BPF/CAP_NET_ADMIN",
    ("attach", errno.EINVAL): "kernel too old for BPF_CGROUP_DEVICE",
    ("attach", errno.EBADF): "not a cgroup v2 directory",
    ("attach", errno.E2BIG): "too many programs on this cgroup",
}


class DeviceProgramError(HyperTFError):
    """A device program could not be built, loaded or attached; ``errno`` says why, so a
    caller can fall back (no confinement, or another mechanism) and say which."""

    def __init__(self, step: str, err: int, target: str = "", detail: str = "",
                 log: str = "") -> None:
        self.step, self.errno, self.target, self.log = step, err, target, log
        name = errno.errorcode.get(err, str(err))
        why = detail or WHY.get((step, err)) or os.strerror(err)
        where = f" on {target}" if target else ""
        last = next((line for line in reversed(log.splitlines()) if line.strip()
                     and not line.startswith(("processed ", "verification time"))), "")
        tail = f"; verifier: {last.strip()}" if last else ""
        super().__init__(f"cannot {step} the device program{where}: {name} ({why}){tail}")


# The assembler: struct bpf_insn is u8 code, u8 dst_reg:4 + src_reg:4, s16 off, s32 imm.

def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One instruction, 8 bytes in the host's order (the bitfields' nibbles follow it)."""
    regs = (src << 4 | dst) if sys.byteorder == "little" else (dst << 4 | src)
    return struct.pack("=BBhi", code, regs, off, imm)


def ldx_w(dst: int, src: int, off: int) -> bytes:
    """dst = *(u32 *)(src + off)"""
    return insn(LDX_MEM_W, dst, src, off)


def and32(dst: int, imm: int) -> bytes:
    """dst = (u32)dst & imm"""
    return insn(ALU32_AND_K, dst, imm=imm)


def jne(dst: int, imm: int, skip: int) -> bytes:
    """if dst != imm: skip the next ``skip`` instructions"""
    return insn(JMP_JNE_K, dst, off=skip, imm=imm)


def mov(dst: int, imm: int) -> bytes:
    """dst = imm"""
    return insn(ALU64_MOV_K, dst, imm=imm)


def exit_() -> bytes:
    """return r0"""
    return insn(JMP_EXIT)


def checked(denied: Sequence[Device]) -> list[Device]:
    """The list without duplicates, each entry checked: a bad one is refused, never
    silently widened or dropped (the program would then allow what it should not)."""
    unique = list(dict.fromkeys((str(k), int(a), int(b)) for k, a, b in denied))
    if len(unique) > MAX_DEVICES:
        raise DeviceProgramError("build", errno.E2BIG, detail=(
            f"{len(unique)} devices, at most {MAX_DEVICES}"))
    for kind, major, minor in unique:
        if kind not in DEV_KIND or not 0 <= major <= MAX_MAJOR or not (
                minor == -1 or 0 <= minor <= MAX_MINOR):
            raise DeviceProgramError("build", errno.EINVAL, detail=(
                f"bad device {kind!r} {major}:{minor} (want 'c' or 'b', major 0-{MAX_MAJOR}, "
                f"minor 0-{MAX_MINOR} or -1)"))
    return unique


def assemble(denied: Sequence[Device]) -> bytes:
    """The program: r1 points at struct bpf_cgroup_dev_ctx {u32 access_type (low 16 bits the
    device type, high 16 the access), u32 major, u32 minor}. Each denied device is a block
    that jumps to the next block unless the type, major (and minor) match, else returns 0;
    after the last block, return 1. Any access (mknod, read, write) is refused alike."""
    code = [ldx_w(2, 1, 0), and32(2, 0xFFFF), ldx_w(3, 1, 4), ldx_w(4, 1, 8)]
    for kind, major, minor in checked(denied):
        tests = [(2, DEV_KIND[kind]), (3, major)] + ([(4, minor)] if minor != -1 else [])
        for i, (reg, value) in enumerate(tests):
            code.append(jne(reg, value, len(tests) - i - 1 + 2))  # past the rest and return
        code += [mov(0, 0), exit_()]
    code += [mov(0, 1), exit_()]
    return b"".join(code)


# The syscall.

@functools.cache
def _syscall() -> Callable[[int, bytearray], int]:
    """bpf(cmd, attr, size) through libc's syscall(); ctypes is imported here, on first use,
    because it costs a node's hot path ~4 ms to import."""
    import ctypes
    import platform

    nr = SYSCALL_NR.get(platform.machine())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def bpf(cmd: int, attr: bytearray) -> int:
        if nr is None:
            raise OSError(errno.ENOSYS, f"bpf() number unknown on {platform.machine()}")
        buf = (ctypes.c_char * len(attr)).from_buffer(attr)
        ret = int(libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), buf,
                               ctypes.c_long(len(attr))))
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ret

    return bpf


def _address(data: bytes) -> tuple[object, int]:
    """A C copy of ``data`` and its address (keep the copy alive while the kernel reads)."""
    import ctypes

    buf = ctypes.create_string_buffer(data, len(data))
    return buf, ctypes.addressof(buf)


def _load_attr(insns: int, count: int, license_: int, log: int = 0) -> bytearray:
    """union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level,
    log_size, log_buf, kern_version, prog_flags, prog_name[16]."""
    attr = bytearray(ATTR_SIZE)
    struct.pack_into("=IIQQIIQ", attr, 0, BPF_PROG_TYPE_CGROUP_DEVICE, count, insns,
                     license_, 1 if log else 0, LOG_SIZE if log else 0, log)
    attr[48:48 + len(PROG_NAME)] = PROG_NAME
    return attr


def load(code: bytes) -> int:
    """Load ``code`` as a cgroup device program; its fd (close-on-exec), the caller closes
    it. On a refusal it is loaded again with a verifier log, which the error carries: the
    first try goes without, as logging costs the verifier time on every load."""
    bpf = _syscall()
    keep, insns = _address(code)
    keep_license, license_ = _address(b"GPL\0")
    for _ in range(3):  # EAGAIN: the verifier was interrupted; libbpf retries too
        try:
            return bpf(BPF_PROG_LOAD, _load_attr(insns, len(code) // 8, license_))
        except OSError as exc:
            err = exc.errno or errno.EIO
            if err != errno.EAGAIN:
                break
    keep_log, log = _address(bytes(LOG_SIZE))
    text = ""
    try:
        os.close(bpf(BPF_PROG_LOAD, _load_attr(insns, len(code) // 8, license_, log)))
    except OSError:
        import ctypes

        text = ctypes.string_at(log).decode(errors="replace")
    del keep, keep_license, keep_log
    # EINVAL with a log: the verifier read the program and found it malformed; without
    # one: the kernel knows no cgroup device programs
    detail = "the verifier refused the program" if text.strip() else ""
    raise DeviceProgramError("load", err, detail=detail, log=text)


def _cgroup_fd(cgroup_dir: Path) -> int:
    try:
        return os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise DeviceProgramError("open", exc.errno or errno.EIO, str(cgroup_dir)) from None


def deny_devices(cgroup_dir: Path, denied: Sequence[Device]) -> None:
    """Refuse the processes of ``cgroup_dir`` and of every cgroup below it any access to
    the ``denied`` devices (minor -1: all minors of that major); replaces the program an
    earlier call attached there. Raises DeviceProgramError (``.errno``) on any failure."""
    code = assemble(denied)
    cgroup_fd = _cgroup_fd(cgroup_dir)
    try:
        prog_fd = load(code)
        try:
            attr = bytearray(ATTR_SIZE)  # target_fd, attach_bpf_fd, attach_type, flags (0)
            struct.pack_into("=IIII", attr, 0, cgroup_fd, prog_fd, BPF_CGROUP_DEVICE, 0)
            _syscall()(BPF_PROG_ATTACH, attr)
        except OSError as exc:
            raise DeviceProgramError("attach", exc.errno or errno.EIO,
                                     str(cgroup_dir)) from None
        finally:
            os.close(prog_fd)  # the attachment holds the program
    finally:
        os.close(cgroup_fd)


def detach(cgroup_dir: Path) -> bool:
    """Take the device program off ``cgroup_dir``; False if none was attached there.
    (Removing the directory drops it too: a finished job needs no detach.)"""
    cgroup_fd = _cgroup_fd(cgroup_dir)
    try:
        attr = bytearray(ATTR_SIZE)  # no program fd: a non-multi cgroup's one program goes
        struct.pack_into("=IIII", attr, 0, cgroup_fd, 0xFFFFFFFF, BPF_CGROUP_DEVICE, 0)
        _syscall()(BPF_PROG_DETACH, attr)
        return True
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise DeviceProgramError("detach", exc.errno or errno.EIO, str(cgroup_dir)) from None
    finally:
        os.close(cgroup_fd)


def attached(cgroup_dir: Path) -> int:
    """How many device programs are attached to ``cgroup_dir`` itself (not inherited): the
    node's proof that a job's cgroup is confined, read from the kernel."""
    cgroup_fd = _cgroup_fd(cgroup_dir)
    try:
        attr = bytearray(ATTR_SIZE)  # target_fd, attach_type, query_flags, attach_flags,
        struct.pack_into("=II", attr, 0, cgroup_fd, BPF_CGROUP_DEVICE)  # prog_ids, prog_cnt
        _syscall()(BPF_PROG_QUERY, attr)
        return int(struct.unpack_from("=I", attr, 24)[0])
    except OSError as exc:
        raise DeviceProgramError("query", exc.errno or errno.EIO, str(cgroup_dir)) from None
    finally:
        os.close(cgroup_fd)


def cgroup2_mount(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where cgroup v2 is mounted in this mount namespace: /sys/fs/cgroup on a pure v2 host,
    /sys/fs/cgroup/unified on a hybrid one; None where it is not."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, sep, rest = line.partition(" - ")
        if sep and rest.split(" ", 1)[0] == "cgroup2" and len(parts := fields.split()) > 4:
            return Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[4]))
    return None


@functools.cache
def available() -> str | None:
    """None when a device program can be attached on this host, else why not in a few
    words. Loads (and closes) a two-instruction program once per process."""
    mount = cgroup2_mount()
    if mount is None:
        return "no cgroup2 mount"
    if os.statvfs(mount).f_flag & os.ST_RDONLY:
        return f"cgroup2 mount {mount} is read-only"
    try:
        os.close(load(mov(0, 1) + exit_()))
    except DeviceProgramError as exc:
        return f"{WHY.get(('load', exc.errno), os.strerror(exc.errno))} " \
               f"({errno.errorcode.get(exc.errno, exc.errno)})"
    return None
