"""The offload channel's name: spelled in one module only, and what a node's cleanup removes
is what the launcher named (a drift leaks /dev/shm segments)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_offload_channel_name_is_spelled_in_one_module_only() -> None:
    """The launcher, the channel and the node's cleanup spelled it apart; a drift leaks
    /dev/shm segments."""
    spelled = sorted(str(path.relative_to(REPO)) for path in (REPO / "hypertf").rglob("*.py")
                     if "hypertf-offload" in path.read_text())
    assert spelled == ["hypertf/core/offloadname.py"]


def test_what_the_node_removes_is_what_the_launcher_named(tmp_path: Path) -> None:
    """tasknode stop's cleanup, on a /dev/shm of its own, takes every name of the job's
    channels (shared memory and semaphores, each generation) and nothing of another job."""
    from hypertf.core.offloadname import channel_name
    from hypertf.node import runcontrol

    key, other = "20261122-085000-a1b2c3.alice", "20261122-085000-ffffff.bob"
    mine = [channel_name(key, "worker0")[1:] + suffix for suffix in ("", "-d1")]
    mine += ["sem." + channel_name(key, "ps0")[1:] + suffix for suffix in ("-req", "-done")]
    theirs = [channel_name(other, "worker0")[1:], "sem." + channel_name(other, "worker0")[1:]]
    for name in mine + theirs:
        (tmp_path / name).write_text("")
    runcontrol.unlink_offload_channels(key, shm=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)
