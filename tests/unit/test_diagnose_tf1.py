"""Hints for TF1 scripts under TensorFlow 2 and Keras 3 (issue 54, items 2, 3 and 4)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypertf.core.diagnose import TF1_ONLY, JobFacts, hints

# Real logs: each made by running the few lines that raise it with TensorFlow 2.21 and
# Keras 3.15 (tensorflow-cpu, tf-keras 2.21 installed, TF_USE_LEGACY_KERAS unset); only the
# script's path and the venv's were renamed (/home/ana/train.py, /opt/hypertf/venv).
LOGS = Path(__file__).with_name("logs")
COMPAT_V1 = "'import tensorflow.compat.v1 as tf; tf.disable_v2_behavior()'"


def log_of(name: str) -> list[str]:
    return (LOGS / f"{name}.log").read_text().splitlines()


# -- item 2: "... is not available with Keras 3" ---------------------------------------------
@pytest.mark.parametrize("lines", [
    log_of("basic_lstm_cell"),  # tf.compat.v1.nn.rnn_cell.BasicLSTMCell(64)
    ["AttributeError: `dense` is not available with Keras 3."],  # tf.compat.v1.layers.dense
    ["AttributeError: `tf.compat.v1.keras` is not available with Keras 3. Keras 3 has no "
     "support for TF 1 APIs."],
])
def test_a_tf1_keras_class_not_available_with_keras_3_names_the_legacy_keras_fix(lines):
    (hint,) = hints(lines)
    assert hint.startswith("a Keras 2 script under Keras 3 (TF1's Keras classes")
    assert "run it with --env TF_USE_LEGACY_KERAS=1; tf-keras must be on the nodes" in hint
    (set_already,) = hints(lines, JobFacts(legacy_keras=True, tf_keras=True))
    assert "although TF_USE_LEGACY_KERAS=1 is set" in set_already


def test_tf_nn_rnn_cell_names_tf_compat_v1_and_the_legacy_keras_fix():
    """tf.nn.rnn_cell is tf.compat.v1.nn.rnn_cell in TF 2, whose cells are Keras 2 classes:
    the script needs both (seen: it runs with both, and fails with either alone)."""
    keras, tf1 = hints(log_of("tf1_rnn_cell"))
    assert "--env TF_USE_LEGACY_KERAS=1" in keras
    assert tf1.startswith("TF1 API under TensorFlow 2 (tf.nn.rnn_cell)")
    assert COMPAT_V1 in tf1
    assert hints(log_of("tf1_rnn_cell"), JobFacts(legacy_keras=True, tf_keras=True)) == [tf1]


# -- item 3: modules TensorFlow 2 removed ----------------------------------------------------
@pytest.mark.parametrize("name, words", [
    ("tf1_examples", ("module 'tensorflow.examples' is TF1 code that TensorFlow 2 removed",
                      "tensorflow.examples.tutorials.mnist -> tf.keras.datasets.mnist")),
    ("tf1_contrib", ("module 'tensorflow.contrib' is TF1 code that TensorFlow 2 removed",
                     "has no TF2 home", "tf_upgrade_v2")),
    ("tf1_contrib_attr", ("module 'tensorflow.contrib' is TF1 code that TensorFlow 2 removed",
                          "tf_upgrade_v2")),
])
def test_a_module_tensorflow_2_removed_says_port_the_script_not_install_a_package(name, words):
    (hint,) = hints(log_of(name))  # the generic "add its package" hint is not given too
    assert "hypertf_python_packages" not in hint
    assert "no package provides it" in hint
    for word in words:
        assert word in hint


# -- item 4: TF1-only API under TensorFlow 2 --------------------------------------------------
@pytest.mark.parametrize("name, api", [
    ("tf1_app", "tf.app"),
    ("tf1_session", "tf.Session"),  # "... has no attribute 'Session'. Did you mean: 'version'?"
    ("tf1_supervisor", "tf.train.Supervisor"),
])
def test_tf1_api_under_tensorflow_2_names_tf_compat_v1_and_tf_upgrade_v2(name, api):
    (hint,) = hints(log_of(name))
    assert hint.startswith(f"TF1 API under TensorFlow 2 ({api})")
    assert COMPAT_V1 in hint and "tf_upgrade_v2" in hint


@pytest.mark.parametrize("line", [
    "AttributeError: module 'tensorflow' has no attribute 'kears'",  # a typo, not TF1
    "AttributeError: module 'numpy' has no attribute 'app'",
    "AttributeError: module 'tensorflow._api.v2.compat.v1' has no attribute 'Supervisor'",
])
def test_other_missing_attributes_get_no_tf1_hint(line):
    assert hints([line]) == []


def test_the_tf1_only_names_are_the_ones_docs_tensorflow_md_lists():
    doc = (Path(__file__).parents[2] / "docs" / "tensorflow.md").read_text()
    section = doc.split("## TF1 scripts under TensorFlow 2")[1].split("\n## ")[0]
    listed = set(re.findall(r"`([\w.]+)`", section.split("get no hint):")[1].split(". ")[0]))
    assert listed == TF1_ONLY
