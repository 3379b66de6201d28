"""Interception of an unmodified TensorFlow program: its matrix products go to the agent.

Every Python route to a matrix product in TensorFlow ends in one of three generated op
wrappers, looked up as module attributes at call time: ``gen_math_ops.mat_mul`` (tf.matmul,
tf.linalg.matmul, the ``@`` operator, Keras' Dense, and the MatMul gradient itself), and
``batch_mat_mul_v2`` / ``batch_mat_mul_v3`` (the batched forms). ``install`` replaces those
three attributes. A product of at least ``min_flops`` flops becomes a ``tf.numpy_function``
that hands the operands to the agent through the channel, wrapped in ``tf.custom_gradient``
whose gradient is made of products again (so Keras' backward pass is offloaded too); a
smaller one, or one of a dtype other than float32/float64, goes to the original kernel. In
a graph whose shapes are not known when it is traced, a ``tf.cond`` on the runtime shape
decides.

Right or local, never wrong: if the channel fails (agent gone, late, or an error), the
product is computed locally with numpy and one warning line is printed; later products
stay local until a live agent serves the channel again (the task's runner starts a new
world under the same name when one ends), looked for at most once a second.

What this does not catch: graphs that run without Python building them (a loaded
SavedModel), ``tf.raw_ops.MatMul`` (bound before the hook), XLA-compiled functions (the
numpy_function is not compilable: jit_compile=True fails). docs/offload.md says more.
"""

from __future__ import annotations

import atexit
import functools
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hypertf.config import environment
from hypertf.offload import DEFAULT_MIN_FLOPS
from hypertf.offload.channel import ChannelError, ClientChannel

ENV_CHANNEL = environment.OFFLOAD_CHANNEL.name  # the names the task's runner sets (world.py)
ENV_MIN_FLOPS = environment.OFFLOAD_MIN_FLOPS.name
ENV_TIMEOUT = environment.OFFLOAD_TIMEOUT.name
ENV_STATS = environment.OFFLOAD_STATS.name
TARGET = "tensorflow.python.ops.gen_math_ops"
PATCHED = ("mat_mul", "batch_mat_mul_v2", "batch_mat_mul_v3")


class Offloader:
    """The process's one client of its agent: counts, the lock, and the fallback."""

    RETRY_S = 1.0

    def __init__(self, channel: str, min_flops: int = DEFAULT_MIN_FLOPS,
                 timeout: float = 60.0) -> None:
        self.name = channel
        self.min_flops = min_flops
        self.timeout = timeout
        self.channel: ClientChannel | None = None
        self.lock = threading.Lock()
        self.broken = ""  # the last failure (kept once the world is back: the counts say it)
        self.down = False  # products local until retry_at, then the channel is tried again
        self.retry_at = 0.0
        self.ops = self.bytes = self.fallbacks = self.local = 0
        self.seconds = 0.0

    def stats(self) -> dict[str, Any]:
        return {"ops": self.ops, "bytes": self.bytes, "seconds": round(self.seconds, 4),
                "fallbacks": self.fallbacks, "local": self.local, "min_flops": self.min_flops,
                "failed": self.broken}

    def attached(self) -> ClientChannel:
        """The channel of the world now running: attached again when the agent it had is
        gone (the runner starts a new world under the same name after one ends)."""
        channel = self.channel
        if channel is not None and not channel.agent_alive(channel.header().agent_pid):
            channel.close()
            channel = self.channel = None
        if channel is None:
            channel = ClientChannel.attach(self.name)
            if not channel.agent_alive(channel.header().agent_pid):
                channel.close()
                raise ChannelError(f"the offload agent of {self.name} is gone")
            self.channel = channel
        return channel

    def back(self) -> bool:
        """Whether products may go to the agent: always, unless a failure put them local;
        then only once a live agent serves the channel again (looked for every RETRY_S)."""
        if not self.down:
            return True
        if time.monotonic() < self.retry_at:
            return False
        try:
            self.attached()
        except (ChannelError, OSError, ValueError):
            self.retry_at = time.monotonic() + self.RETRY_S
            return False
        self.down = False
        return True

    def compute(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b (equal leading dimensions): by the agent, or locally if it cannot. After
        a failure the products are local until a world serves the channel again: one line
        per outage, not per product."""
        with self.lock:
            if self.back():
                started = time.perf_counter()
                try:
                    out = self.attached().matmul(a, b, self.timeout)
                except (ChannelError, OSError, ValueError) as exc:
                    if self.channel is not None:
                        self.channel.close()
                    self.channel = None
                    self.broken, self.down = str(exc), True
                    self.retry_at = time.monotonic() + self.RETRY_S
                    print(f"hypertf offload: {exc}; computing matrix products locally "
                          "until the offload world is back", file=sys.stderr, flush=True)
                else:
                    self.ops += 1
                    self.bytes += a.nbytes + b.nbytes + out.nbytes
                    self.seconds += time.perf_counter() - started
                    return out
            self.fallbacks += 1
        product: np.ndarray = np.matmul(a, b)
        return product


_offloader: Offloader | None = None


def offloader() -> Offloader | None:
    return _offloader


def _flops(a: Any, b: Any, ta: bool, tb: bool) -> int | None:
    """The product's flops from static shapes, or None if some dimension is unknown."""
    sa = a.shape.as_list() if a.shape.rank else None
    sb = b.shape.as_list() if b.shape.rank else None
    if sa is None or sb is None or None in sa or None in sb:
        return None
    m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    n = sb[-2] if tb else sb[-1]
    batch = int(np.prod(sa[:-2], dtype=np.int64)) if len(sa) > 2 else 1
    flops: int = 2 * batch * m * k * n  # the dimensions of TensorFlow's (untyped) shapes
    return flops


def _offloaded(tf: Any, off: Offloader, a: Any, b: Any, ta: bool, tb: bool,
               product: Callable[..., Any]) -> Any:
    """One product through the agent, differentiable: its gradient is two products."""

    def body(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x = np.swapaxes(x, -1, -2) if ta else x
        y = np.swapaxes(y, -1, -2) if tb else y
        return off.compute(x, y)

    differentiable: Callable[[Callable[..., Any]], Callable[..., Any]] = tf.custom_gradient

    @differentiable
    def run(x: Any, y: Any) -> Any:
        out = tf.numpy_function(body, [x, y], x.dtype, stateful=True, name="HypertfOffload")
        xs, ys = x.shape, y.shape
        if xs.rank is not None and ys.rank is not None:
            m = xs[-1] if ta else xs[-2]
            n = ys[-2] if tb else ys[-1]
            out.set_shape(xs[:-2].concatenate([m, n]))

        def grad(g: Any) -> tuple[Any, Any]:
            # The formulas of TensorFlow's own _MatMulGrad / _BatchMatMulV2Grad (equal
            # batch dimensions: the only batched case offloaded).
            if not ta and not tb:
                return product(g, y, False, True), product(x, g, True, False)
            if not ta and tb:
                return product(g, y, False, False), product(g, x, True, False)
            if ta and not tb:
                return product(y, g, False, True), product(x, g, False, False)
            return product(y, g, True, True), product(g, x, True, True)

        return out, grad

    return run(a, b)


def _route(tf: Any, original: Callable[..., Any], a: Any, b: Any, ta: bool, tb: bool,
           call_original: Callable[[], Any], product: Callable[..., Any]) -> Any:
    off = _offloader
    if off is None or (off.down and not off.back()):
        return call_original()  # no hook, or no world now: TensorFlow's own kernel
    a = tf.convert_to_tensor(a)
    b = tf.convert_to_tensor(b, dtype_hint=a.dtype)
    if a.dtype not in (tf.float32, tf.float64) or b.dtype != a.dtype:
        return call_original()
    if a.shape.rank is None or b.shape.rank is None or a.shape.rank < 2:
        return call_original()
    if a.shape.rank != b.shape.rank or a.shape[:-2] != b.shape[:-2] \
            or not a.shape[:-2].is_fully_defined():
        return call_original()  # broadcast batches: TensorFlow's kernel and gradient
    static = _flops(a, b, ta, tb)
    if static is not None:
        if static < off.min_flops:
            off.local += 1 if tf.executing_eagerly() else 0
            return call_original()
        return _offloaded(tf, off, a, b, ta, tb, product)
    sa, sb = tf.shape(a, out_type=tf.int64), tf.shape(b, out_type=tf.int64)
    m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    n = sb[-2] if tb else sb[-1]
    flops = 2 * tf.reduce_prod(sa[:-2]) * m * k * n
    return tf.cond(flops >= off.min_flops,
                   lambda: _offloaded(tf, off, a, b, ta, tb, product), call_original)


def _patch(module: Any) -> None:
    """Replace the three product wrappers of gen_math_ops (idempotent)."""
    if getattr(module, "_hypertf_offload", False):
        return
    mat_mul = module.mat_mul
    bmm2 = module.batch_mat_mul_v2
    bmm3 = module.batch_mat_mul_v3

    def product(x: Any, y: Any, ta: bool, tb: bool) -> Any:
        if x.shape.rank == 2:
            return module.mat_mul(x, y, transpose_a=ta, transpose_b=tb)
        return module.batch_mat_mul_v2(x, y, adj_x=ta, adj_y=tb)

    @functools.wraps(mat_mul)
    def patched_mat_mul(a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False,
                        *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        return _route(tf, mat_mul, a, b, transpose_a, transpose_b,
                      lambda: mat_mul(a, b, transpose_a, transpose_b, *args, **kwargs), product)

    def batched(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def patched(x: Any, y: Any, *args: Any, **kwargs: Any) -> Any:
            import tensorflow as tf

            adj_x = bool(kwargs.get("adj_x", args[1] if len(args) > 1 else False))
            adj_y = bool(kwargs.get("adj_y", args[2] if len(args) > 2 else False))
            if original is bmm3 and (args or "Tout" in kwargs):
                return original(x, y, *args, **kwargs)  # a mixed-type product: local
            return _route(tf, original, x, y, adj_x, adj_y,
                          lambda: original(x, y, *args, **kwargs), product)

        return patched

    module.mat_mul = patched_mat_mul
    module.batch_mat_mul_v2 = batched(bmm2)
    module.batch_mat_mul_v3 = batched(bmm3)
    module._hypertf_offload = True


def install(channel: str | None = None, min_flops: int | None = None,
            timeout: float | None = None) -> Offloader | None:
    """Route this process's products to the agent named by the arguments or the
    environment (HYPERTF_OFFLOAD_*); nothing happens without a channel name."""
    global _offloader
    name = channel or environment.OFFLOAD_CHANNEL.read()
    if not name:
        return None
    if _offloader is None:
        _offloader = Offloader(
            name,
            int(min_flops if min_flops is not None else environment.OFFLOAD_MIN_FLOPS.read()),
            float(timeout if timeout is not None else environment.OFFLOAD_TIMEOUT.read()))
        atexit.register(_write_stats)
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, _Finder())
    return _offloader


def _write_stats() -> None:
    path = environment.OFFLOAD_STATS.read()
    if path and _offloader is not None:
        try:
            with open(path, "w") as handle:
                json.dump(_offloader.stats(), handle)
        except OSError as exc:
            print(f"hypertf offload: cannot write {path}: {exc}", file=sys.stderr)


class _Finder:
    """Patches gen_math_ops right after TensorFlow imports it: installing the hook at
    interpreter start costs nothing in a process that never imports TensorFlow."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        from importlib.machinery import PathFinder

        sys.meta_path.remove(self)
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
