"""The shared-memory hop and the MPI world behind it, without TensorFlow."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hypertf.offload.channel import ChannelError, ClientChannel, new_name
from tests.offload.conftest import shm_names


@pytest.mark.parametrize(("shape_a", "shape_b"), [
    ((100, 70), (70, 50)),          # rows of A
    ((3, 33, 20), (3, 20, 17)),     # batched
    ((2, 5000), (5000, 3)),         # along k, accumulated
])
def test_round_trip_equals_numpy(offload_world, shape_a, shape_b):
    rng = np.random.default_rng(1)
    a = rng.random(shape_a, np.float32)
    b = rng.random(shape_b, np.float32)
    channel = ClientChannel.attach(offload_world.channel)
    try:
        np.testing.assert_allclose(channel.matmul(a, b, 30), a @ b, rtol=1e-5, atol=1e-4)
        # a transposed view (what transpose_a gives) is copied once, into the segment
        stored = np.ascontiguousarray(a.swapaxes(-1, -2))
        np.testing.assert_allclose(channel.matmul(stored.swapaxes(-1, -2), b, 30), a @ b,
                                   rtol=1e-5, atol=1e-4)
    finally:
        channel.close()


def test_a_product_larger_than_the_segment_grows_it(offload_world):
    channel = ClientChannel.attach(offload_world.channel)
    try:
        before = channel.header().data_bytes
        a = np.ones((4200, 8), np.float32)  # C alone is 70 MB: more than the 64 MB segment
        b = np.ones((8, 4200), np.float32)
        out = channel.matmul(a, b, 60)
        assert channel.header().data_bytes > before
        assert out.shape == (4200, 4200) and (out == 8).all()
        segments = [n for n in shm_names(offload_world.channel) if re.search(r"-d\d+$", n)]
        assert len(segments) == 1, segments  # the smaller one is unlinked
    finally:
        channel.close()


def test_the_world_leaves_no_shared_memory_behind(tmp_path):
    from hypertf.offload.world import world

    with world(1, tmp_path) as w:
        assert shm_names(w.channel)
        pid = w.proc.pid
    assert not shm_names(w.channel)
    assert w.proc.poll() is not None, f"mpiexec {pid} still running"


def test_no_channel_is_a_channel_error():
    with pytest.raises(ChannelError, match="no offload channel"):
        ClientChannel.attach(new_name())


def test_the_world_listens_on_no_address_of_this_machine(offload_world):
    """Hydra's mpiexec listens on 0.0.0.0: as root the world runs in a namespace of its own."""
    import shutil
    import subprocess

    from hypertf.offload.world import private_network

    if not private_network() or not shutil.which("ss"):
        pytest.skip("no network namespaces here (not root) or no ss")
    listening = subprocess.run(["ss", "-Hltnup"], capture_output=True, text=True).stdout
    assert f"pid={offload_world.proc.pid}," not in listening
    assert "mpiexec" not in listening and "hydra_pmi_proxy" not in listening
