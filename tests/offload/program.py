"""An unmodified TensorFlow program (no HyperTF import): eager, tf.linalg.matmul, the @
operator, tf.function with static and unknown shapes, a batched product and a Keras Dense
layer's forward and gradient. It writes its operands and results as .npy files so the test
can check them against numpy; with ``--pause FILE`` it waits after the first half until FILE
exists (the test kills an offload process meanwhile)."""

import argparse
import pathlib
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--pause")
args = p.parse_args()
out = pathlib.Path(args.out)
rng = np.random.default_rng(0)
a_np = rng.random((64, 48), np.float32)
b_np = rng.random((48, 32), np.float32)
a, b = tf.constant(a_np), tf.constant(b_np)
results = {"a": a_np, "b": b_np}
results["eager"] = (a @ b).numpy()
results["linalg"] = tf.linalg.matmul(a, b).numpy()
results["small"] = tf.matmul(a[:4, :4], b[:4, :4]).numpy()  # 128 flops: stays local


@tf.function
def transposed(x, y):
    return tf.matmul(x, y, transpose_a=True)


@tf.function(input_signature=[tf.TensorSpec([None, 48], tf.float32)])
def dynamic(x):
    return tf.matmul(x, b)


results["graph"] = transposed(tf.transpose(a), b).numpy()
if args.pause:
    (out / "paused").touch()
    while not pathlib.Path(args.pause).exists():
        time.sleep(0.05)
results["graph_dynamic"] = dynamic(a).numpy()
results["batch"] = tf.matmul(tf.stack([a, 2 * a]), tf.stack([b, b])).numpy()

import keras  # noqa: E402

keras.utils.set_random_seed(1)
layer = keras.layers.Dense(16, use_bias=False)
x_np = rng.random((32, 48), np.float32)
with tf.GradientTape() as tape:
    y = layer(tf.constant(x_np))
    loss = tf.reduce_sum(y * y)
(grad,) = tape.gradient(loss, layer.trainable_variables)
results.update(x=x_np, kernel=layer.kernel.numpy(), dense=y.numpy(), dense_grad=grad.numpy())
for name, value in results.items():
    np.save(out / f"{name}.npy", value)
