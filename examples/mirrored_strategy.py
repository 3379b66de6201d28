"""Train a digits classifier with MultiWorkerMirroredStrategy and a custom training loop.

The cluster comes from TF_CONFIG (a "worker" job, optionally with a "chief"). Every task
trains a replica synchronously (gradients all-reduced each step) and exits when done; none
of them serves forever. A custom loop is used because Keras 3 ``model.fit`` fails under this
strategy (keras-team/keras#20585).

The chief (the "chief" task, else worker 0) evaluates on the held-out digits; its last line
of output is ``test_accuracy=<x.xxxx>`` and it exits 0 once training is done, whatever the
accuracy: judging it is the caller's job (a sweep compares trials by it, a test asserts its
threshold), and an exit code says only whether the script ran. Unknown flags (including
the legacy ``--ps_hosts/--worker_hosts/--job_name/--task_index``) are ignored: this script
reads only TF_CONFIG. Without TF_CONFIG it trains alone, as a single-worker job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 42


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Read the hyperparameters; anything else on the command line is ignored on purpose."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "--batch_size", type=int, default=64, help="global batch, split across the workers"
    )
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--steps", type=int, default=200, help="synchronous training steps")
    args, _unknown = parser.parse_known_args(argv)
    return args


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return x_train, x_test, y_train, y_test: sklearn's 8x8 digits, pixels in [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return tuple(train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y))


def is_chief(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> bool:
    """The "chief" task if the cluster has one, else worker 0 (or a job without TF_CONFIG)."""
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().jobs


def make_training(strategy: tf.distribute.Strategy, x_train: np.ndarray, y_train: np.ndarray,
                  global_batch: int, learning_rate: float):
    """The sharded input, the model and its optimizer (made under the strategy) and one
    synchronous training step; checkpointed.py trains with the same pieces."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each worker reads its own shard, so one step covers `global_batch` distinct examples.
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(global_batch)
        return dataset.shuffle(len(x_train), seed=SEED).repeat().batch(batch, drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
        optimizer.build(model.trainable_variables)

    @tf.function
    def train_step() -> tf.Tensor:
        def replica_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
                # Divide by the global batch: the optimizer sums the replicas' gradients.
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        per_replica_loss = strategy.run(replica_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)

    return model, optimizer, train_step


def evaluate(model: keras.Model, x_test: np.ndarray, y_test: np.ndarray) -> int:
    """The chief's last line, ``test_accuracy=<x.xxxx>`` (and HYPERTF_METRICS_FILE), and its
    exit code: 0, a low accuracy is a result, not a failure (a sweep would mark every weak
    trial failed). The variables are mirrored, so it evaluates alone."""
    predictions = np.argmax(model(x_test, training=False).numpy(), axis=1)
    accuracy = float(np.mean(predictions == y_test))
    print(f"test_accuracy={accuracy:.4f}", flush=True)
    metrics_file = os.environ.get("HYPERTF_METRICS_FILE")  # set by HyperTF (sweeps read it)
    if metrics_file:
        with open(metrics_file, "w") as handle:
            json.dump({"test_accuracy": round(accuracy, 4)}, handle)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The strategy must exist before any other TensorFlow op runs: it configures the
    # collective ops and connects to the peers (and blocks until they are all up).
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x_train, x_test, y_train, y_test = load_data()
    keras.utils.set_random_seed(SEED)
    model, _optimizer, train_step = make_training(strategy, x_train, y_train,
                                                  args.batch_size, args.learning_rate)
    loss = tf.constant(0.0)
    for _ in range(args.steps):
        loss = train_step()

    if not is_chief(strategy.cluster_resolver):
        return 0
    print(
        f"trained {args.steps} steps, batch_size={args.batch_size}, "
        f"learning_rate={args.learning_rate}, last loss={float(loss):.4f}",
        flush=True,
    )
    return evaluate(model, x_test, y_test)


if __name__ == "__main__":
    sys.exit(main())
