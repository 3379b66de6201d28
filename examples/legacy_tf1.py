"""Train a digits classifier with legacy TF1 between-graph replication (tf.compat.v1).

The cluster comes only from the flags ``--ps_hosts --worker_hosts --job_name --task_index``
(TF_CONFIG is ignored):

* a "ps" task holds the variables and serves until it is killed; it never exits on its own.
* each "worker" task builds its own copy of the graph, with the variables pinned to the ps by
  ``replica_device_setter``, and applies asynchronous updates until the shared global step
  reaches ``--steps``; then it exits. Worker 0 is the chief: it initialises the variables and,
  at the end, evaluates on the held-out digits.

The chief's last line of output is ``test_accuracy=<x.xxxx>``; it exits 0 once trained,
whatever the accuracy (the caller judges it), 2 on bad flags. Unknown flags are ignored.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 42
# A non-chief worker polls the ps this often until the chief has initialised the variables.
# TensorFlow's default is a hard-coded 30 s, which would dominate a job of a few seconds.
RECOVERY_WAIT_SECS = 0.5
# ... and gives up after this long (TensorFlow's default: 30 minutes).
MAX_WAIT_SECS = 600

v1 = tf.compat.v1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Read the cluster flags and hyperparameters; other flags are ignored on purpose."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--ps_hosts", default="", help="comma-separated host:port of ps tasks")
    parser.add_argument("--worker_hosts", default="", help="comma-separated host:port of workers")
    parser.add_argument("--job_name", default="", choices=["ps", "worker"], help="this task's job")
    parser.add_argument("--task_index", type=int, default=0, help="this task's index in its job")
    parser.add_argument("--batch_size", type=int, default=64, help="batch per worker step")
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--steps", type=int, default=300, help="global steps, all workers")
    args, _unknown = parser.parse_known_args(argv)
    return args


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return x_train, x_test, y_train, y_test: sklearn's 8x8 digits, pixels in [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return tuple(train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y))


class FastWorkerSessionCreator(v1.train.SessionCreator):
    """Like ``WorkerSessionCreator``, but re-checks for the chief's init every 0.5 s.

    ``WorkerSessionCreator`` (used by ``MonitoredTrainingSession`` on non-chief workers)
    builds its ``SessionManager`` with the default ``recovery_wait_secs=30`` and offers no
    way to change it, so a worker that starts before the chief would idle for 30 s.
    """

    def __init__(self, scaffold: v1.train.Scaffold, master: str, config: v1.ConfigProto) -> None:
        self._scaffold = scaffold
        self._master = master
        self._config = config

    def create_session(self) -> v1.Session:
        self._scaffold.finalize()
        manager = v1.train.SessionManager(
            local_init_op=self._scaffold.local_init_op,
            local_init_feed_dict=self._scaffold.local_init_feed_dict,
            ready_op=self._scaffold.ready_op,
            ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
            graph=v1.get_default_graph(),
            recovery_wait_secs=RECOVERY_WAIT_SECS,
        )
        return manager.wait_for_session(
            self._master, config=self._config, max_wait_secs=MAX_WAIT_SECS
        )


class EvaluateAtEndHook(v1.train.SessionRunHook):
    """Run the test-set accuracy once training stops.

    A ``MonitoredSession`` refuses ``run`` once a hook has requested a stop, but still hands
    the raw session to every hook's ``end``.
    """

    def __init__(self, accuracy: tf.Tensor, feed_dict: dict[tf.Tensor, np.ndarray]) -> None:
        self._accuracy = accuracy
        self._feed_dict = feed_dict
        self.result: float | None = None

    def end(self, session: v1.Session) -> None:
        self.result = float(session.run(self._accuracy, feed_dict=self._feed_dict))


def dense(x: tf.Tensor, units: int, name: str) -> tf.Tensor:
    """A fully connected layer from plain variables (``tf.compat.v1.layers`` needs tf-keras)."""
    with v1.variable_scope(name):
        kernel = v1.get_variable(
            "kernel", [x.shape[-1], units], initializer=v1.glorot_uniform_initializer(seed=SEED)
        )
        bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def train_and_evaluate(
    server: tf.distribute.Server, cluster: tf.train.ClusterSpec, args: argparse.Namespace
) -> float | None:
    """Run this worker's share of the steps; the chief returns the test accuracy."""
    x_train, x_test, y_train, y_test = load_data()
    is_chief = args.task_index == 0
    rng = np.random.default_rng(SEED + args.task_index)

    device_fn = v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster
    )
    with v1.device(device_fn):
        images = v1.placeholder(tf.float32, [None, 64], name="images")
        labels = v1.placeholder(tf.int64, [None], name="labels")
        logits = dense(tf.nn.relu(dense(images, 64, "hidden")), 10, "logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        )
        global_step = v1.train.get_or_create_global_step()
        train_op = v1.train.AdamOptimizer(args.learning_rate).minimize(
            loss, global_step=global_step
        )
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))

    # Talk only to the ps and to this worker: without the filter, creating a session waits
    # until every worker of the cluster is reachable.
    config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{args.task_index}"])
    scaffold = v1.train.Scaffold()
    if is_chief:
        creator = v1.train.ChiefSessionCreator(
            scaffold=scaffold, master=server.target, config=config
        )
    else:
        creator = FastWorkerSessionCreator(scaffold, server.target, config)
    hooks: list[v1.train.SessionRunHook] = [v1.train.StopAtStepHook(last_step=args.steps)]
    evaluate = EvaluateAtEndHook(accuracy, {images: x_test, labels: y_test})
    if is_chief:
        hooks.append(evaluate)

    step, batch_loss = 0, 0.0
    with v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as session:
        while not session.should_stop():
            index = rng.integers(0, len(x_train), size=args.batch_size)
            _, batch_loss, step = session.run(
                [train_op, loss, global_step],
                feed_dict={images: x_train[index], labels: y_train[index]},
            )
    print(
        f"worker {args.task_index}: global step read {step} (stop at {args.steps}), "
        f"batch_size={args.batch_size}, learning_rate={args.learning_rate}, loss={batch_loss:.4f}",
        flush=True,
    )
    return evaluate.result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ps_hosts = [h for h in args.ps_hosts.split(",") if h]
    worker_hosts = [h for h in args.worker_hosts.split(",") if h]
    if not ps_hosts or not worker_hosts or not args.job_name:
        print("need --ps_hosts, --worker_hosts and --job_name", file=sys.stderr)
        return 2
    v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        server.join()
        return 0
    accuracy = train_and_evaluate(server, cluster, args)
    if accuracy is None:
        return 0
    print(f"test_accuracy={accuracy:.4f}", flush=True)
    return 0  # a low accuracy is a result, not a failure


if __name__ == "__main__":
    sys.exit(main())
