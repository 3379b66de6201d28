"""A TF1 between-graph script as users write it (issue 39 item 3): the four legacy flags,
``device_filters``, and ``MonitoredTrainingSession`` with TF's default recovery wait, so a
non-chief worker that asks for the model before worker 0 has initialised it sleeps 30 s.
Prints ``worker N: S steps`` and, on worker 0, ``test_accuracy=1.0`` (a stand-in figure:
the model is a linear fit of random data)."""

import argparse
import sys

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--ps_hosts", "--worker_hosts", "--job_name"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": args.ps_hosts.split(","),
                                    "worker": args.worker_hosts.split(",")})
    server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        server.join()
    worker = f"/job:worker/task:{args.task_index}"
    with v1.device(v1.train.replica_device_setter(worker_device=worker, cluster=cluster)):
        x = v1.placeholder(tf.float32, [None, 8])
        y = v1.placeholder(tf.float32, [None, 1])
        w = v1.get_variable("w", [8, 1])
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        step = v1.train.get_or_create_global_step()
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
    config = v1.ConfigProto(device_filters=["/job:ps", worker])
    rng = np.random.default_rng(args.task_index)
    steps = 0
    with v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=args.task_index == 0, config=config,
            hooks=[v1.train.StopAtStepHook(last_step=args.steps)]) as session:
        while not session.should_stop():
            session.run(train, {x: rng.random((16, 8)), y: rng.random((16, 1))})
            steps += 1
    print(f"worker {args.task_index}: {steps} steps", flush=True)
    if args.task_index == 0:
        print("test_accuracy=1.0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
