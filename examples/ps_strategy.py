"""Train a digits classifier with TF2 ParameterServerStrategy and a ClusterCoordinator.

The task comes from TF_CONFIG (cluster with "chief", "worker" and "ps" jobs):

* "worker" and "ps" tasks start a gRPC server and serve until they are killed; they never
  exit on their own, so whoever launched them must stop them once the chief is done.
* the "chief" builds the strategy, schedules ``--steps`` training steps on the workers
  (asynchronous updates, variables on the ps tasks), evaluates on the held-out digits and exits.

The chief's last line of output is ``test_accuracy=<x.xxxx>``; it exits 0 once trained,
whatever the accuracy (the caller judges it), 2 when TF_CONFIG is missing or names another
task type.
Unknown flags (including the legacy ``--ps_hosts/--worker_hosts/--job_name/--task_index``)
are ignored: this script reads only TF_CONFIG.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

# gRPC must read this before TensorFlow starts it: a call to an unreachable task then fails
# at once instead of retrying inside gRPC, which is what the coordinator's retry logic expects.
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
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
    parser.add_argument("--batch_size", type=int, default=64, help="batch per worker step")
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--steps", type=int, default=300, help="steps scheduled in total")
    args, _unknown = parser.parse_known_args(argv)
    return args


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return x_train, x_test, y_train, y_test: sklearn's 8x8 digits, pixels in [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return tuple(train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y))


def serve(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> None:
    """Run this worker/ps task's server; the chief drives it remotely. Never returns."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol="grpc",
        start=True,
    )
    server.join()


def train_and_evaluate(
    resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver, args: argparse.Namespace
) -> float:
    """Chief: schedule the custom training loop on the workers, return test accuracy."""
    x_train, x_test, y_train, y_test = load_data()
    keras.utils.set_random_seed(SEED)

    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate)
        # Create the slot variables now, on the ps tasks: a scheduled function runs on a
        # worker and cannot create variables there.
        optimizer.build(model.trainable_variables)

    def dataset_fn() -> tf.data.Dataset:
        # Each worker builds its own endless, differently shuffled copy of the training set.
        dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        return dataset.shuffle(len(x_train)).repeat().batch(args.batch_size).prefetch(2)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def replica_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        x, y = next(iterator)
        return strategy.run(replica_fn, args=(x, y))

    losses = [
        coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(args.steps)
    ]
    coordinator.join()
    print(
        f"trained {args.steps} steps, batch_size={args.batch_size}, "
        f"learning_rate={args.learning_rate}, last loss={float(losses[-1].fetch()):.4f}",
        flush=True,
    )

    # The variables live on the ps tasks; the chief reads them and evaluates locally.
    predictions = np.argmax(model(x_test, training=False).numpy(), axis=1)
    return float(np.mean(predictions == y_test))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if "TF_CONFIG" not in os.environ:
        print("TF_CONFIG is not set", file=sys.stderr)
        return 2
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task_type = resolver.task_type
    if task_type in ("worker", "ps"):
        serve(resolver)
        return 0
    if task_type != "chief":
        task = json.loads(os.environ["TF_CONFIG"]).get("task")
        print(f"unsupported task in TF_CONFIG: {task}", file=sys.stderr)
        return 2
    accuracy = train_and_evaluate(resolver, args)
    print(f"test_accuracy={accuracy:.4f}", flush=True)
    return 0  # a low accuracy is a result, not a failure


if __name__ == "__main__":
    sys.exit(main())
