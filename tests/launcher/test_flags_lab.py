"""Issue 54 item 1 on the 3-host lab: a script whose legacy flags are defined in a module
beside it (as tf_cnn_benchmarks.py's are, in benchmark_cnn.py) gets them without --sync, and
a ps that ran without its role (exit 0, no cluster) is named with the fix."""

from __future__ import annotations

from pathlib import Path

from hypertf.core.diagnose import ROLELESS
from tests.launcher.helpers import FAKE, all_free, hypertf

# train.py defines no flag itself: cluster_flags.py, which it imports, does (argparse, strict)
SIBLING_FLAGS = str(Path(FAKE).with_name("sibling_flags") / "train.py")


def test_flags_defined_in_an_imported_module_reach_every_task_without_sync(lab, tmp_path):
    """The node's preflight reads cluster_flags.py through train.py's import: every task
    gets its role, the ps serves (stopped at the end) and the workers finish. A TF1 script:
    no word of --chief."""
    done = hypertf("train", "-i", lab.inventory, "--script", SIBLING_FLAGS, "--worker", "2",
                   "--ps", "1", cwd=tmp_path, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "legacy flags (--ps_hosts, --worker_hosts, --job_name, --task_index) passed: " \
        "the script reads them" in out
    for role, index in (("worker", 0), ("worker", 1), ("ps", 0)):
        assert f"job_name={role} task_index={index} ps_hosts=" in out, out
    assert "training alone" not in out and "--chief" not in out, out
    assert all_free(lab.inventory)


def test_a_ps_that_ran_without_its_role_names_legacy_flags(lab, tmp_path):
    """Without the flags (--no-legacy-flags here; before the fix, the default) every task
    trains alone and exits 0: the failure says why, and names --legacy-flags, whichever
    exit comes first (the ps's, or both workers' while no task ever listened: a race)."""
    done = hypertf("train", "-i", lab.inventory, "--script", SIBLING_FLAGS, "--worker", "2",
                   "--ps", "1", "--no-legacy-flags", cwd=tmp_path, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert (f"failed: parameter server ended (exit 0): {ROLELESS}." in out
            or f"exited 0, but no task ever opened its port: {ROLELESS}." in out), out
    assert ("HyperTF passed no legacy flags: if the script (or a module it imports) reads "
            "--ps_hosts/--worker_hosts/--job_name/--task_index, run it with --legacy-flags"
            ) in out, out
    assert "may not be distributed" not in out, out
    assert all_free(lab.inventory)
