"""mirrored_strategy.py's training with checkpoints: a restarted or preempted job resumes.

Run it with ``hypertf train --max-restarts N``: when a task dies (a host lost, a process
killed), HyperTF stops the whole job and starts it again as a new attempt; this script then
restores the latest checkpoint from ``HYPERTF_CHECKPOINT_DIR`` (the same directory for
every attempt; ``./checkpoints`` when run alone) and trains only the steps that are left.
``HYPERTF_ATTEMPT`` says which attempt this is (1 for the first).

The checkpoint (``tf.train.Checkpoint`` of the model, the optimizer and the step, kept by a
``CheckpointManager``) is written every ``--save_every`` steps, and at once when the job is
asked to stop: on SIGTERM, or when the file named by ``HYPERTF_PREEMPT_FILE`` appears (HyperTF
writes its preemption notice there, with ``HYPERTF_PREEMPT_DEADLINE``, before the SIGTERM;
the script polls it between steps; every attempt has a file of its own). It then exits 143
(128 + SIGTERM, what a process killed by SIGTERM reports): the job was stopped, not
finished, so HyperTF must not count it as succeeded (a finisher's exit 0 would end the job
`succeeded`, half trained); the next attempt resumes from that checkpoint. Each step prints
``step N`` (``--log_every``) and a resumed attempt ``attempt A: resumed from step N``, so a
log shows the count going on.

Under MultiWorkerMirroredStrategy every worker must take part in a save: the chief (the "chief"
task, else worker 0) writes into ``HYPERTF_CHECKPOINT_DIR``, the others into their own
subdirectory, and every worker restores the chief's, so a multi-worker job needs
``--checkpoint-dir`` on storage every worker reads (NFS, a shared mount). Workers that
restored different steps say so and exit 2 instead of hanging in a collective. They also
agree, every step, whether any of them was asked to stop, so all save the same step and
none waits for the others in a collective. Without ``TF_CONFIG`` it trains alone.

The chief prints ``test_accuracy=<x.xxxx>`` last and exits 0 once trained, whatever the
accuracy (the caller judges it).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf
from mirrored_strategy import SEED, evaluate, is_chief, load_data, make_training

PREEMPTED_EXIT = 128 + signal.SIGTERM  # 143: stopped, not finished


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch")
    parser.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--steps", type=int, default=300, help="synchronous training steps")
    parser.add_argument("--save_every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--log_every", type=int, default=1,
                        help="steps between 'step N' lines (0: none)")
    parser.add_argument("--step_delay", type=float, default=0.0,
                        help="seconds to pause after each step (demonstrations and tests: "
                             "time to interrupt a job mid-training)")
    args, _unknown = parser.parse_known_args(argv)
    return args


class StopRequest:
    """Whether this task was asked to stop: SIGTERM caught, or the preemption notice seen.
    The handler only sets a flag; the training loop saves between steps."""

    def __init__(self, notice: str | None) -> None:
        self.notice = notice
        self.reason = ""

    def on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.reason = self.reason or "SIGTERM"

    def poll(self) -> str:
        if not self.reason and self.notice and os.path.exists(self.notice):  # a stat a step
            self.reason = f"preemption notice{deadline_in(self.notice)}"
        return self.reason


def deadline_in(path: str) -> str:
    """' (SIGKILL in N s)' from the notice's HYPERTF_PREEMPT_DEADLINE (epoch seconds)."""
    try:
        with open(path, errors="replace") as handle:
            text = handle.read(4096)
    except OSError:
        return ""
    found = re.search(r"(?:HYPERTF_PREEMPT_DEADLINE\s*[=:]\s*)?\b(\d{9,}(?:\.\d+)?)\b", text)
    return f" (SIGKILL in {float(found.group(1)) - time.time():.0f} s)" if found else ""


def checkpoint_dirs(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> tuple[str, str]:
    """(where this task writes, where every task restores from)."""
    shared = os.environ.get("HYPERTF_CHECKPOINT_DIR") or os.path.join(os.getcwd(), "checkpoints")
    if is_chief(resolver):
        return shared, shared
    return os.path.join(shared, "workers", f"{resolver.task_type}{resolver.task_id}"), shared


def worker_count(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> int:
    jobs = resolver.cluster_spec().as_dict()
    return max(1, sum(len(jobs.get(name, ())) for name in ("chief", "worker")))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # After the strategy: its own preemption handler may take SIGTERM (and keep training).
    stop = StopRequest(os.environ.get("HYPERTF_PREEMPT_FILE") or None)
    signal.signal(signal.SIGTERM, stop.on_sigterm)
    x_train, x_test, y_train, y_test = load_data()
    keras.utils.set_random_seed(SEED)
    model, optimizer, train_step = make_training(strategy, x_train, y_train,
                                                 args.batch_size, args.learning_rate)
    with strategy.scope():
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    write_dir, restore_dir = checkpoint_dirs(strategy.cluster_resolver)
    latest = tf.train.latest_checkpoint(restore_dir)
    if latest:
        checkpoint.restore(latest)
    attempt = os.environ.get("HYPERTF_ATTEMPT", "1")
    print(f"attempt {attempt}: " + (f"resumed from step {int(step.numpy())} ({latest})"
                                    if latest else "no checkpoint: starting at step 0"),
          flush=True)

    @tf.function
    def restored_step_sum() -> tf.Tensor:
        value = strategy.run(lambda: tf.cast(step, tf.float64))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    @tf.function
    def stop_votes(mine: tf.Tensor) -> tf.Tensor:
        value = strategy.run(lambda: tf.identity(mine))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    replicas = strategy.num_replicas_in_sync
    if int(restored_step_sum().numpy()) != replicas * int(step.numpy()):
        print(f"the workers restored different steps (this one: {int(step.numpy())}); give "
              f"--checkpoint-dir on storage every worker reads", file=sys.stderr, flush=True)
        return 2
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=2)
    together = worker_count(strategy.cluster_resolver) > 1
    saved = int(step.numpy())  # the same on every worker: they decide a save alike

    loss = tf.constant(0.0)
    while int(step.numpy()) < args.steps:
        # every worker votes each step (a collective): all stop at the same step, or none
        asked = stop.poll()
        if together:
            stopping = float(stop_votes(tf.constant(1.0 if asked else 0.0)).numpy()) > 0
        else:
            stopping = bool(asked)
        if stopping:
            done = int(step.numpy())
            if done != saved:
                manager.save(checkpoint_number=done)  # every worker: the save is collective
            print(f"stopped at step {done} ({asked or 'another worker was asked'}): "
                  f"checkpoint saved, exiting {PREEMPTED_EXIT}", flush=True)
            return PREEMPTED_EXIT
        loss = train_step()
        step.assign_add(1)
        done = int(step.numpy())
        if args.log_every and done % args.log_every == 0:
            print(f"step {done}", flush=True)
        if done % args.save_every == 0 or done == args.steps:
            manager.save(checkpoint_number=done)
            saved = done
            print(f"checkpoint saved at step {done}", flush=True)
        if args.step_delay:
            time.sleep(args.step_delay)

    if not is_chief(strategy.cluster_resolver):
        return 0
    print(f"trained to step {args.steps}, last loss={float(loss):.4f}", flush=True)
    return evaluate(model, x_test, y_test)


if __name__ == "__main__":
    sys.exit(main())
