"""The agent's /metrics: what a scrape shows, served on loopback by prometheus_client."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hypertf.node.metrics import AgentCollector, MetricsServer
from hypertf.store import AgentRecord, GpuInfo, GpuProcess

KEY = "20261122-085000-a1b2c3.alice"
GIB = 1024**3


def record() -> AgentRecord:
    gpus = [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 97.0, 70 * GIB, 80 * GIB, False,
                reason=f"in use by {KEY}", processes=[GpuProcess(11, 70 * GIB, KEY)]),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", "GPU-1", 0.0, 0, 80 * GIB, True),
        GpuInfo(2, "NVIDIA H100 80GB HBM3", "GPU-2", 5.0, GIB, 80 * GIB, False,
                reason="foreign process pid 99", processes=[GpuProcess(99, GIB)]),
        GpuInfo(3, "NVIDIA H100 80GB HBM3", "GPU-3", 0.0, 0, 80 * GIB, False,
                reason="MIG enabled: HyperTF grants whole GPUs only", mig=True),
    ]
    return AgentRecord(host="node1", mgmt_addr="127.0.0.1", data_addr="127.0.0.1", port=20000,
                       gpu=4, gpu_avail_list=[1], gpus=gpus, gpu_source="nvml",
                       gpu_driver={"driver": "550.54.15", "nvml": "12.550.54.15"},
                       heartbeat=time.time() - 3)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def gpu_labels(index: int, **extra: str) -> tuple:
    labels = {"host": "node1", "gpu": str(index), "uuid": f"GPU-{index}",
              "name": "NVIDIA H100 80GB HBM3", **extra}
    return tuple(sorted(labels.items()))


def test_a_scrape_shows_figures_state_holder_and_foreign_processes():
    collector = AgentCollector("node1")
    server = MetricsServer(collector)
    collector.update(record=record(), row=[KEY, 1, 0, 0])
    found = samples(generate_latest(server.registry).decode())
    assert found["hypertf_gpu_utilization_percent", gpu_labels(0)] == 97.0
    assert found["hypertf_gpu_memory_used_bytes", gpu_labels(0)] == 70 * GIB
    assert found["hypertf_gpu_memory_total_bytes", gpu_labels(1)] == 80 * GIB
    assert found["hypertf_gpu_state", gpu_labels(0, state="busy")] == 1.0
    assert found["hypertf_gpu_state", gpu_labels(0, state="free")] == 0.0
    assert found["hypertf_gpu_state", gpu_labels(1, state="free")] == 1.0
    assert found["hypertf_gpu_state", gpu_labels(2, state="unavailable")] == 1.0
    assert found["hypertf_gpu_task", gpu_labels(0, task_key=KEY)] == 1.0
    assert not any(name == "hypertf_gpu_task" and dict(labels)["gpu"] != "0"
                   for name, labels in found)
    assert found["hypertf_gpu_foreign_processes", gpu_labels(0)] == 0  # the holder's own
    assert found["hypertf_gpu_foreign_processes", gpu_labels(2)] == 1
    age = found["hypertf_agent_heartbeat_age_seconds", (("host", "node1"),)]
    assert 2.5 < age < 60
    info = {dict(labels).get("driver_version") for name, labels in found
            if name == "hypertf_agent_info"}
    assert info == {"550.54.15"}


def test_a_draining_gpu_names_its_job_and_no_record_means_no_gpu_series():
    collector = AgentCollector("node1")
    server = MetricsServer(collector)
    assert "hypertf_gpu_state{" not in generate_latest(server.registry).decode()
    collector.update(record=record(), row=[f"draining:{KEY}", 1, 0, 0])
    found = samples(generate_latest(server.registry).decode())
    assert found["hypertf_gpu_state", gpu_labels(0, state="draining")] == 1.0
    assert found["hypertf_gpu_task", gpu_labels(0, task_key=KEY)] == 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_served_over_http_on_the_given_address_and_a_taken_port_is_not_fatal(caplog):
    collector = AgentCollector("node1")
    collector.update(record=record(), row=[KEY, 1, 0, 0])
    server = MetricsServer(collector)
    port = free_port()
    assert server.start("127.0.0.1", port)
    try:
        assert server.address == ("127.0.0.1", port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200
            text = reply.read().decode()
        assert 'hypertf_gpu_state{gpu="1",host="node1"' in text
        other = MetricsServer(AgentCollector("node2"))
        with caplog.at_level(logging.ERROR, logger="hypertf.node.metrics"):
            assert not other.start("127.0.0.1", port)
            assert not other.start("127.0.0.1", port)  # refused once: not retried every pass
        [message] = [r.getMessage() for r in caplog.records]
        assert f"cannot serve /metrics on 127.0.0.1:{port}" in message
        assert "hypertf_agent_metrics_port" in message
    finally:
        server.stop()
    assert not MetricsServer(collector).start("127.0.0.1", 0)  # 0: turned off
