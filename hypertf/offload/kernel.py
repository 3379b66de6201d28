"""The kernel route, probed: build matmul_kernel.cc against the installed TensorFlow's
headers with the system compiler, load it, and report which routes to a product reach it.

``python -m hypertf.offload.kernel [--build-dir DIR]`` prints one line per route. The
kernel wins over TensorFlow's own MatMul by its registration priority, so it sees every
MatMul node, Python-built or not (a loaded SavedModel, tf.raw_ops.MatMul); it does not
see BatchMatMulV2/V3, which would need registrations of their own. docs/offload.md has the
outcome and why the Python hook (hook.py) is the route that offloads in this version.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("matmul_kernel.cc")


class KernelBuildError(Exception):
    """The compiler failed; its last lines say why."""


def build(out_dir: Path, compiler: str = "g++") -> Path:
    """The kernel library for this TensorFlow (its own compile and link flags)."""
    import tensorflow as tf

    target = out_dir / "hypertf_matmul_kernel.so"
    argv = [compiler, "-std=c++17", "-shared", "-fPIC", "-O2", "-w", str(SOURCE), "-o",
            str(target), *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise KernelBuildError(f"{compiler} failed ({done.returncode}):\n{tail}")
    return target


def probe(library: Path) -> dict[str, int]:
    """Kernel calls per route (0: the route does not reach a MatMul kernel)."""
    import numpy as np
    import tensorflow as tf

    lib = tf.load_op_library(str(library))

    def calls() -> int:
        return int(lib.hypertf_kernel_calls())

    rng = np.random.default_rng(0)
    a = tf.constant(rng.random((64, 48), np.float32))
    b = tf.constant(rng.random((48, 32), np.float32))
    found: dict[str, int] = {}

    def route(name: str, fn: Any) -> None:
        before = calls()
        fn()
        found[name] = calls() - before

    route("eager @", lambda: a @ b)
    route("tf.linalg.matmul", lambda: tf.linalg.matmul(a, b))
    route("tf.raw_ops.MatMul", lambda: tf.raw_ops.MatMul(a=a, b=b))
    route("tf.function", lambda: tf.function(lambda x, y: tf.matmul(x, y))(a, b))
    route("batched (BatchMatMulV3)", lambda: tf.matmul(tf.stack([a, a]), tf.stack([b, b])))
    import keras

    layer = keras.layers.Dense(16)
    x = tf.constant(rng.random((32, 48), np.float32))
    route("Keras Dense forward", lambda: layer(x))

    def gradient() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) ** 2)
        tape.gradient(loss, layer.trainable_variables)

    before = calls()
    gradient()
    found["Keras Dense forward + gradient"] = calls() - before

    traced: Callable[[Callable[..., Any]], Callable[..., Any]] = tf.function(
        input_signature=[tf.TensorSpec([None, 48], tf.float32)])

    class Model(tf.Module):
        @traced
        def __call__(self, x: Any) -> Any:
            return tf.matmul(x, b)

    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(Model(), saved)
        loaded = tf.saved_model.load(saved)
        route("loaded SavedModel", lambda: loaded(a))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hypertf.offload.kernel",
                                description="Build the MatMul kernel probe and show what it "
                                            "catches.")
    p.add_argument("--build-dir", type=Path, help="where the library goes (default: a temp dir)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hypertf-kernel-") as tmp:
        out = args.build_dir or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        try:
            library = build(out)
        except (KernelBuildError, FileNotFoundError) as exc:
            print(f"hypertf offload: the kernel did not build: {exc}", file=sys.stderr)
            return 1
        for name, count in probe(library).items():
            print(f"{name:<34} {'caught' if count else 'not caught'} ({count} kernel calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
