"""A TF1-style script: the four legacy flags defined with tf.compat.v1.app.flags (absl under
the hood: an unknown flag is fatal), run by tf.compat.v1.app.run. Prints what it got."""

import tensorflow as tf

flags = tf.compat.v1.app.flags
flags.DEFINE_string("ps_hosts", "", "comma-separated host:port of the ps tasks")
flags.DEFINE_string("worker_hosts", "", "comma-separated host:port of the workers")
flags.DEFINE_string("job_name", "", "ps or worker")
flags.DEFINE_integer("task_index", 0, "index within the job")
FLAGS = flags.FLAGS


def main(_argv):
    print(f"job_name={FLAGS.job_name} task_index={FLAGS.task_index} "
          f"workers={len(FLAGS.worker_hosts.split(','))}", flush=True)


if __name__ == "__main__":
    tf.compat.v1.app.run(main)
