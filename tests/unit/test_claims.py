"""Claims the node can prove (issue 48 item 4): a process is a job's task only when the node
can prove it, not because a number sits in a pid file.

As the thieves did it, each with only what they have: a local Unix user of their own
(``nobody``) who takes a finished task wrapper's recycled PID while the job still runs; the
node account writing a pid file into another job's run directory, or running ``tasknode
start`` into it; and processes naming another job's GPU in every spelling CUDA accepts.
Real processes, real ``tasknode start`` (its CLI, as the launcher runs it over SSH), real
/proc; every process a test starts is ended by its own id (or its group, proven ours).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hypertf.core.records import GpuInfo
from hypertf.core.rundir import RunDir, read_pid_record
from hypertf.node import runcontrol, trespass
from tests.conftest import wait_for as shared_wait_for

REPO = Path(__file__).resolve().parents[2]
KEY = "20261201-090000-a1b2c3.alice"
UUIDS = ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-0b7c31e5-5e3a-4f0e-9a4b-7d2b1c0e8f11")
GPUS = [GpuInfo(index=i, name="H100", uuid=u, utilization=0.0, memory_used=0,
                memory_total=80 << 30, available=True) for i, u in enumerate(UUIDS)]
ROW = [KEY, 1]  # GPU 0 held by the job, GPU 1 free

SLEEPER = "import time\nprint('working', flush=True)\ntime.sleep(60)\n"
QUICK = "open('out.txt', 'w').write('result')\n"


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    return shared_wait_for(predicate, timeout, what, interval=0.02)


@dataclass
class Node:
    """A node's work dir and what the test started there (ended when the test ends)."""

    root: Path
    venv: Path
    runs: list[RunDir] = field(default_factory=list)
    others: list[subprocess.Popen] = field(default_factory=list)

    def request(self, run: RunDir, tasks: dict[str, str], key: str | None = None,
                **extra: object) -> dict:
        """A start request as the launcher sends it: each task runs its Python body."""
        made = []
        for name, body in tasks.items():
            script = self.root / f"{name}.py"
            script.write_text(body)
            made.append({"name": name, "port": 1, "cwd": str(run.task_dir(name)),
                         "argv": [sys.executable, str(script)],
                         "env": {"HYPERTF_TASK_KEY": key or run.task_key,
                                 "PYTHONUNBUFFERED": "1"}})
        return {"run_dir": str(run.path), "venv": str(self.venv), "tasks": made, **extra}

    def start(self, request: dict, archive: bytes = b"") -> subprocess.CompletedProcess:
        """``tasknode start`` as the launcher runs it, under the usual umask 022."""
        self.runs.append(RunDir(Path(request["run_dir"])))
        return subprocess.run(
            [sys.executable, "-m", "hypertf.node.tasknode", "start"],
            input=json.dumps(request).encode() + b"\n" + archive, cwd=REPO,
            capture_output=True, timeout=30, umask=0o022)

    def spawn(self, argv: list[str], env: dict[str, str], **how: object) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, **how)  # type: ignore[call-overload]
        self.others.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for run in self.runs:  # only groups the node proves are the run's
            for name in run.task_names() if run.local.is_dir() else ():
                pgid = runcontrol.task_group(run, name)
                if pgid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("# stand-in venv\n")
    made = Node(tmp_path, venv)
    try:
        yield made
    finally:
        made.cleanup()


def started(node: Node, run: RunDir, tasks: dict[str, str]) -> dict[str, int]:
    out = node.start(node.request(run, tasks))
    assert out.returncode == 0, out.stderr.decode()
    answer = json.loads(out.stdout.decode().splitlines()[-1])
    for name in tasks:
        wait_for(lambda n=name: read_pid_record(Path(run.pid(n))), 10, f"{name}'s pid record")
    return answer["started"]


def thief_claims(node: Node, proc: subprocess.Popen) -> tuple[str, list]:
    """What the agent makes of ``proc``: the job it is believed to be of, its trespasses."""
    seen = wait_for(lambda: trespass.scan(GPUS, str(node.root), pids=[proc.pid]), 5,
                    "the agent's scan to see the process")
    assert isinstance(seen, list) and len(seen) == 1, seen
    return seen[0].claims, trespass.judge(seen, ROW, GPUS)


# -- pid files: a recycled or forged PID is not believed -------------------------------


def _spawn_with_pid(node: Node, pid: int, argv: list[str], env: dict[str, str],
                    **how: object) -> subprocess.Popen | None:
    """A process that gets exactly ``pid`` (the kernel's next PID set through
    /proc/sys/kernel/ns_last_pid, as a thief who waits for the PID to come round would)."""
    for _ in range(50):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = node.spawn(argv, env, **how)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
        if Path(f"/proc/{pid}").exists():
            return None  # someone else's process took it meanwhile
    return None


def test_a_finished_wrappers_recycled_pid_is_not_believed(node: Node) -> None:
    """The job runs on (worker0); worker1's wrapper ended, its pid file stays. A local user
    of their own account takes that PID for a process group of their own claiming the
    job's key and naming the job's GPU: not believed (another start time), so it is a
    trespass on the job's GPU; the job's stop and drain do not take it for the job's."""
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no 'nobody' account to be the thief")
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("choosing the next PID (ns_last_pid) needs root")
    run = RunDir.of(node.root, KEY, local=True)
    pids = started(node, run, {"worker0": SLEEPER, "worker1": "pass\n"})
    wait_for(Path(run.exit("worker1")).exists, 10, "worker1 to end")
    recycled = pids["worker1"]
    wait_for(lambda: not Path(f"/proc/{recycled}").exists(), 10, "worker1's wrapper reaped")
    thief = _spawn_with_pid(node, recycled, ["sleep", "60"], {
        "HYPERTF_TASK_KEY": KEY, "CUDA_VISIBLE_DEVICES": UUIDS[0]}, user=nobody)
    if thief is None:
        pytest.skip("the recycled PID was taken by another process first")
    assert os.getpgid(thief.pid) == recycled, "the thief leads a group with the old PID"

    claims, found = thief_claims(node, thief)
    assert claims == "", "a recycled PID is believed"
    assert [(t.pid, t.gpu, t.holder, t.claims) for t in found] == [(thief.pid, 0, KEY, "")]
    assert runcontrol.wrapper(run, "worker1") is None  # the task counts as dead for the run
    assert runcontrol.task_group(run, "worker1") is None
    assert runcontrol.wrapper(run, "worker0") == pids["worker0"]  # the real task is believed
    assert runcontrol.stop(run, ["worker1"], grace=0.5) == {"worker1": "not running"}
    assert thief.poll() is None, "the job's stop signalled the thief's group"


def test_a_forged_pid_file_is_not_believed(node: Node) -> None:
    """The node account writes pid files into a running job's run directory naming a
    process group of its own (its correct start time; a bare PID; junk): none is believed,
    and the job's stop does not take the forger's processes for the job's."""
    run = RunDir.of(node.root, KEY, local=True)
    pids = started(node, run, {"worker0": SLEEPER})
    forger = node.spawn(["sleep", "60"], {"HYPERTF_TASK_KEY": KEY,
                                          "CUDA_VISIBLE_DEVICES": UUIDS[0]})
    start = Path(f"/proc/{forger.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    records = {"worker7": f"{forger.pid} {start}\n", "worker8": f"{forger.pid}\n",
               "worker9": "1 2 3\n"}
    for name, text in records.items():
        Path(run.pid(name)).write_text(text)

    claims, found = thief_claims(node, forger)
    assert claims == "", "a forged pid file is believed"
    assert [(t.gpu, t.holder) for t in found] == [(0, KEY)]
    assert {name: runcontrol.wrapper(run, name) for name in records} == dict.fromkeys(records)
    assert runcontrol.stop(run, list(records), grace=0.5) == dict.fromkeys(
        records, "not running")
    assert forger.poll() is None
    assert runcontrol.wrapper(run, "worker0") == pids["worker0"]  # the job's own, still


def tasknode_children(pgid: int) -> list[int]:
    from hypertf.node.procs import group_members

    return [pid for pid in group_members(pgid) if pid != pgid]


# -- tasknode start into another run ---------------------------------------------------


def test_start_into_another_jobs_run_is_refused(node: Node) -> None:
    """A second start into a run that has tasks, a start whose tasks are another job's,
    and a start through a link to another run: one line on stderr, a non-zero exit,
    nothing started and the running job untouched."""
    run = RunDir.of(node.root, KEY, local=True)
    pids = started(node, run, {"worker0": SLEEPER})
    before = sorted(p.name for p in run.local.iterdir())

    again = node.start(node.request(run, {"worker1": SLEEPER}))
    other_key = node.start(node.request(run, {"worker2": SLEEPER},
                                        key="20261201-090001-ffffff.mallory"))
    link = RunDir.of(node.root, "20261201-090002-eeeeee.mallory", local=True)
    link.local.symlink_to(run.local)
    through_link = node.start(node.request(link, {"worker3": SLEEPER}))
    for out, why in ((again, "already has tasks"), (other_key, "is not the run directory"),
                     (through_link, "is not a directory of this job")):
        err = out.stderr.decode().strip()
        assert out.returncode != 0 and why in err and len(err.splitlines()) == 1, err
        assert "Traceback" not in err
    assert sorted(p.name for p in run.local.iterdir()) == before
    assert runcontrol.wrapper(run, "worker0") == pids["worker0"]


def test_two_starts_into_one_fresh_run_start_once(node: Node) -> None:
    """The 'started' mark is taken with O_EXCL: a start into a run that another start took
    (its tasks not yet written) is refused too."""
    run = RunDir.of(node.root, KEY, local=True)
    run.local.mkdir(parents=True)
    Path(run.started).write_text('["worker0"]\n')
    out = node.start(node.request(run, {"worker1": SLEEPER}))
    assert out.returncode != 0 and "taken by another start" in out.stderr.decode()
    assert run.task_names() == []


# -- file modes ------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_run_dirs_logs_code_and_checkpoints_are_private(node: Node) -> None:
    """Under the usual umask 022: the run directory, each task's directory, the synced
    code and the checkpoint directory 0700; pid, exit and log files, the synced files and
    what the task writes 0600."""
    code = io.BytesIO()
    with tarfile.open(fileobj=code, mode="w:gz") as packed:
        for name, mode, data in (("code", 0o755, None), ("code/train.py", 0o644, b"pass\n"),
                                 ("code/lib", 0o777, None), ("code/lib/x.py", 0o666, b"")):
            info = tarfile.TarInfo(name)
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                packed.addfile(info)
            else:
                info.size = len(data)
                packed.addfile(info, io.BytesIO(data))
    archive = code.getvalue()
    run = RunDir.of(node.root, KEY, local=True)
    checkpoints = node.root / "checkpoints" / KEY
    request = node.request(run, {"worker0": QUICK}, make_dirs=[str(checkpoints)],
                           archive=len(archive))
    out = node.start(request, archive)
    assert out.returncode == 0, out.stderr.decode()
    wait_for(Path(run.exit("worker0")).exists, 10, "the task's end")

    private_dirs = [run.local, Path(run.task_dir("worker0")), Path(run.code),
                    Path(run.code) / "lib", checkpoints]
    private_files = [Path(run.pid("worker0")), Path(run.exit("worker0")),
                     Path(run.log("worker0")), Path(run.started), Path(run.code) / "train.py",
                     Path(run.code) / "lib" / "x.py",
                     Path(run.task_dir("worker0")) / "out.txt"]
    assert {str(p): oct(_mode(p)) for p in private_dirs} == dict.fromkeys(
        map(str, private_dirs), oct(0o700))
    assert {str(p): oct(_mode(p)) for p in private_files} == dict.fromkeys(
        map(str, private_files), oct(0o600))
    # the node's shared folders keep the node's umask: other users' jobs make theirs there
    assert _mode(node.root / "checkpoints") == 0o755
    assert _mode(RunDir.runs(node.root)) == 0o755
    # the agent's drain mark on a run it never saw started
    drained = RunDir.of(node.root, "20261201-090003-dddddd.bob", local=True)
    runcontrol.mark_drained(drained)
    assert (_mode(drained.local), _mode(Path(drained.drained))) == (0o700, 0o600)


# -- every spelling of a GPU in the environment ----------------------------------------

SPELLINGS = {
    "index": ({"CUDA_VISIBLE_DEVICES": "0"}, [0]),
    "second index": ({"CUDA_VISIBLE_DEVICES": "1"}, [1]),
    "uuid": ({"CUDA_VISIBLE_DEVICES": UUIDS[0]}, [0]),
    "index with a sign, zeros, spaces": ({"CUDA_VISIBLE_DEVICES": " +01 "}, [1]),
    "upper-case uuid": ({"CUDA_VISIBLE_DEVICES": UUIDS[0].upper()}, [0]),
    "upper-case hex": ({"CUDA_VISIBLE_DEVICES": "GPU-" + UUIDS[1][4:].upper()}, [1]),
    "short prefix": ({"CUDA_VISIBLE_DEVICES": "GPU-8932"}, [0]),
    "upper-case short prefix": ({"CUDA_VISIBLE_DEVICES": "GPU-0B7C3"}, [1]),
    "list with spaces": ({"CUDA_VISIBLE_DEVICES": f"1, {UUIDS[0]}"}, [1, 0]),
    "a valid entry, then junk": ({"CUDA_VISIBLE_DEVICES": "1,bogus,0"}, [1]),
    "NVIDIA_VISIBLE_DEVICES uuid": ({"NVIDIA_VISIBLE_DEVICES": UUIDS[0]}, [0]),
    "NVIDIA_VISIBLE_DEVICES index": ({"NVIDIA_VISIBLE_DEVICES": "1"}, [1]),
    "NVIDIA_VISIBLE_DEVICES prefix": ({"NVIDIA_VISIBLE_DEVICES": "GPU-0B7C"}, [1]),
    "an index inside a container's GPUs": (
        {"NVIDIA_VISIBLE_DEVICES": UUIDS[1], "CUDA_VISIBLE_DEVICES": "0"}, [1]),
    "all, then an index": ({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"},
                           [0]),
}

NO_CLAIM = {
    "no GPU": {"CUDA_VISIBLE_DEVICES": ""},
    "minus one": {"CUDA_VISIBLE_DEVICES": "-1"},
    "an index past the GPUs": {"CUDA_VISIBLE_DEVICES": "2"},
    "a prefix of both": {"CUDA_VISIBLE_DEVICES": "GPU-"},
    # what the CUDA driver refuses (measured on an H100, driver 580: it opens no GPU)
    "junk first": {"CUDA_VISIBLE_DEVICES": "bogus,0"},
    "lower-case GPU- prefix": {"CUDA_VISIBLE_DEVICES": UUIDS[0].lower()},
    "uuid without GPU-": {"CUDA_VISIBLE_DEVICES": UUIDS[0].removeprefix("GPU-")},
    "CUDA's all": {"CUDA_VISIBLE_DEVICES": "all"},
    "another host's uuid": {"CUDA_VISIBLE_DEVICES": "GPU-ffff0000-0000-0000-0000-000000000000"},
    # names no GPU: like no variable at all, every GPU can be opened; NVML tells (gpu.md)
    "all": {"NVIDIA_VISIBLE_DEVICES": "all"},
    "none": {"NVIDIA_VISIBLE_DEVICES": "none"},
    "outside the container's GPUs": {"NVIDIA_VISIBLE_DEVICES": UUIDS[1],
                                     "CUDA_VISIBLE_DEVICES": UUIDS[0]},
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_each_spelling_is_a_claim_on_the_right_gpu(spelling: str) -> None:
    env, gpus = SPELLINGS[spelling]
    assert trespass.claimed(env, GPUS) == gpus


@pytest.mark.parametrize("spelling", sorted(NO_CLAIM))
def test_spellings_that_name_no_gpu_of_this_host(spelling: str) -> None:
    assert trespass.claimed(NO_CLAIM[spelling], GPUS) == []


def test_the_nodes_own_container_value_is_no_claim() -> None:
    """A node that is itself a container started with NVIDIA_VISIBLE_DEVICES hands it to
    every process: the agent's own value names the node's GPUs, not a claim on one."""
    env = {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert trespass.claimed(env, GPUS, baseline="0,1") == []
    assert trespass.claimed({**env, "CUDA_VISIBLE_DEVICES": "1"}, GPUS, baseline="0,1") == [1]


def test_a_process_naming_the_jobs_gpu_in_any_spelling_is_a_trespass(node: Node) -> None:
    """Real processes, one per spelling, none of them the job's: the agent's scan sees each
    on the GPU it names, and every one on the job's GPU is a trespass."""
    procs = {name: node.spawn(["sleep", "60"], env) for name, (env, _) in SPELLINGS.items()}
    seen = wait_for(lambda: (lambda s: s if len(s) == len(procs) else None)(
        trespass.scan(GPUS, str(node.root), pids=[p.pid for p in procs.values()])), 5,
        "every process seen")
    assert isinstance(seen, list)
    by_pid = {s.pid: s for s in seen}
    for name, proc in procs.items():
        assert sorted(by_pid[proc.pid].gpus) == sorted(SPELLINGS[name][1]), name
        assert set(by_pid[proc.pid].gpus.values()) == {"env"}
    on_the_jobs_gpu = {t.pid for t in trespass.judge(seen, ROW, GPUS)}
    assert on_the_jobs_gpu == {p.pid for name, p in procs.items() if 0 in SPELLINGS[name][1]}


def test_a_task_of_the_job_naming_its_gpu_is_no_trespass(node: Node) -> None:
    """The real thing stays believed: a task started by 'tasknode start' for the job, its
    GPU named by index, is the job's (its wrapper is proven) and no trespass."""
    run = RunDir.of(node.root, KEY, local=True)
    request = node.request(run, {"worker0": SLEEPER})
    request["tasks"][0]["env"]["CUDA_VISIBLE_DEVICES"] = "0"
    out = node.start(request)
    assert out.returncode == 0, out.stderr.decode()
    wrapper = json.loads(out.stdout.decode().splitlines()[-1])["started"]["worker0"]
    task = wait_for(lambda: tasknode_children(wrapper), 10, "the task under its wrapper")
    assert isinstance(task, list)
    seen = wait_for(lambda: trespass.scan(GPUS, str(node.root), pids=task), 5, "the task")
    assert isinstance(seen, list)
    assert {s.claims for s in seen} == {KEY}
    assert trespass.judge(seen, ROW, GPUS) == []


def test_checks_are_quick(node: Node) -> None:
    """The proof is a few /proc reads: cheap enough for every watch poll of every task."""
    run = RunDir.of(node.root, KEY, local=True)
    started(node, run, {"worker0": SLEEPER})
    t0 = time.perf_counter()
    for _ in range(200):
        assert runcontrol.wrapper(run, "worker0")
    assert (time.perf_counter() - t0) / 200 < 0.005
