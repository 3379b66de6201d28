"""Train a digits classifier with Keras ``model.fit`` under MultiWorkerMirroredStrategy.

Keras 3 ``model.fit`` fails under this strategy (keras-team/keras#20585), so this script uses
Keras 2 from the ``tf-keras`` package with ``TF_USE_LEGACY_KERAS=1`` (set here if the launcher
did not: ``hypertf train --env TF_USE_LEGACY_KERAS=1`` does it for any script). tf-keras
requires the ``tensorflow`` package: install it without its dependencies next to
``tensorflow-cpu`` (``hypertf_python_packages_no_deps: [tf-keras==<TensorFlow's version>]``).

The cluster comes from TF_CONFIG; every worker runs ``fit`` and exits. The chief (worker 0)
evaluates on the held-out digits and prints ``test_accuracy=<x.xxxx>`` last, exiting 0
once trained, whatever the accuracy (the caller judges it: a sweep, a test). Unknown flags
are ignored (``parse_known_args``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras as keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 42


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch")
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--epochs", type=int, default=8, help="passes over the training set")
    args, _unknown = parser.parse_known_args(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25,
                                                        random_state=SEED, stratify=y)
    keras.utils.set_random_seed(SEED)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shuffle(len(x_train), seed=SEED).batch(args.batch_size).with_options(options))
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(train, epochs=args.epochs, verbose=2)
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    role, index = config.get("task", {}).get("type"), config.get("task", {}).get("index", 0)
    has_chief = "chief" in config.get("cluster", {})
    if role is not None and role != "chief" and (has_chief or index != 0):
        return 0
    print(f"fit {args.epochs} epochs, batch_size={args.batch_size}, "
          f"last loss={history.history['loss'][-1]:.4f}", flush=True)
    # A direct call, not predict(): predict would wait for the other workers' collectives.
    predictions = np.argmax(model(x_test, training=False).numpy(), axis=1)
    accuracy = float(np.mean(predictions == y_test))
    print(f"test_accuracy={accuracy:.4f}", flush=True)
    return 0  # a low accuracy is a result, not a failure


if __name__ == "__main__":
    sys.exit(main())
