"""Train a digits classifier with Keras 3 on the JAX backend, data-parallel over processes.

HyperTF gives every task Keras 3's rendezvous (``KERAS_DISTRIBUTION_JOB_ADDRESSES``,
``_NUM_PROCESSES``, ``_PROCESS_ID``: docs/frameworks.md), so ``keras.distribution.initialize()``
needs no arguments; ``DataParallel`` over every process's devices then keeps one model whose
gradients are averaged across them. Each process feeds its own half of the data (its
``process_id``-th slice), so the dataset is not sharded again (``auto_shard_dataset=False``).

``hypertf train --script examples/keras3_jax.py --worker 2`` (JAX installed on the nodes:
``pip install jax``). Every process evaluates on the held-out digits (a step is collective);
process 0 prints ``test_accuracy=<x.xxxx>`` last. Every process prints its losses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported

import jax
import keras
import numpy as np
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
    keras.distribution.initialize()  # from the KERAS_DISTRIBUTION_* variables
    rank, world = jax.process_index(), jax.process_count()
    keras.distribution.set_distribution(keras.distribution.DataParallel(
        devices=jax.devices(), auto_shard_dataset=False))
    print(f"process {rank} of {world}: {len(jax.devices())} devices", flush=True)
    keras.utils.set_random_seed(SEED)  # the same initial weights in every process
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25,
                                                        random_state=SEED, stratify=y)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(args.learning_rate),
                  "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train[rank::world], y_train[rank::world],
                        batch_size=max(1, args.batch_size // world), epochs=args.epochs,
                        verbose=0)
    print(f"process {rank}: losses " + " ".join(f"{v:.4f}" for v in history.history["loss"]),
          flush=True)
    # Every process evaluates (a step is collective: one process alone would wait forever),
    # each on the whole held-out set; process 0 says it.
    _, accuracy = model.evaluate(x_test, y_test, batch_size=max(1, args.batch_size // world),
                                 verbose=0)
    if rank == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    jax.distributed.shutdown()  # together, so that no process waits for a gone peer
    return 0


if __name__ == "__main__":
    sys.exit(main())
