"""What ``hypertf export`` tells the user: its notes for a ps script (a TF1 one says
nothing of --chief, a TF2 ParameterServerStrategy one needs it) and its refusal of a
train-only option. Real renderers and parsers; no ZooKeeper."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from hypertf.export import ExportOptions, NodeSetup, export
from hypertf.launch.request import TrainRequest

REPO = Path(__file__).resolve().parents[2]
SETUP = NodeSetup(task_env=(), python_packages=(), python_packages_no_deps=(),
                  tensorflow="tensorflow-cpu==2.19.1")


def hypertf(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_export_of_a_tf1_ps_script_says_nothing_of_chief(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import json, os
        import tensorflow.compat.v1 as tf
        cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
        server = tf.train.Server(cluster, job_name="worker", task_index=0)
        """))
    _text, notes = export(TrainRequest(script=str(script), workers=2, ps=1),
                          ExportOptions("volcano", image="r/i:1"), SETUP)
    said = "\n".join(notes)
    assert "ps and no chief: the job ends when every worker has exited 0" in said, said
    assert "--chief" not in said and "needs --chief" not in said, said
    (tmp_path / "model.py").write_text(
        "import tensorflow as tf\ns = tf.distribute.experimental.ParameterServerStrategy\n")
    script.write_text("import model\n")
    _text, notes = export(TrainRequest(script=str(script), workers=2, ps=1),
                          ExportOptions("volcano", image="r/i:1"), SETUP)
    assert "a TF2 ParameterServerStrategy script needs --chief" in "\n".join(notes), notes


def test_export_refuses_a_train_only_option_saying_it_applies_only_to_train() -> None:
    done = hypertf("export", "--to", "jobset", "--image", "img", "--script", "x.py",
                   "--idle-fail")
    assert done.returncode == 2, done.stderr
    assert "--idle-fail applies only to 'hypertf train'" in done.stderr, done.stderr
