"""dcgm-exporter's HPC job mapping directory, as the agent keeps it (hypertf.node.dcgmmap):
one file per GPU index naming the job that holds or drains it, none for the others."""

from __future__ import annotations

from pathlib import Path

from hypertf.node import dcgmmap


def test_each_held_gpu_has_a_file_naming_its_job_and_free_ones_have_none(tmp_path: Path):
    directory = tmp_path / "dcgm"
    assert dcgmmap.write(directory, ["a.alice", 1, "draining:b.bob", 0])
    assert sorted(p.name for p in directory.iterdir()) == ["0", "2"]
    assert (directory / "0").read_text() == "a.alice\n"
    assert (directory / "2").read_text() == "b.bob\n"
    assert not dcgmmap.write(directory, ["a.alice", 1, "draining:b.bob", 0])  # no change
    assert dcgmmap.write(directory, [1, "c.carol", 1, 0])
    assert sorted(p.name for p in directory.iterdir()) == ["1"]
    assert (directory / "1").read_text() == "c.carol\n"
    assert oct((directory / "1").stat().st_mode & 0o777) == "0o644"
