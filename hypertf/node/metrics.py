"""The agent's Prometheus endpoint: what ops teams already scrape from NVIDIA's DCGM
exporter, plus what only HyperTF knows (a GPU's matrix state and the job holding it).

The figures come from the agent's last record and its row of the matrix, so a scrape costs
no NVML call and no ZooKeeper read. Served with prometheus_client on the management
address only (``hypertf_agent_metrics_port``, default 9401; 0 turns it off).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from hypertf.core.matrix import Cell, GpuState, job_of, state_of
from hypertf.store import AgentRecord

STATES = tuple(GpuState)
log = logging.getLogger(__name__)


class KeeperFigures(Protocol):
    """What the agent's keeper counts (hypertf.keeper.passes.PassCounts), read at a scrape."""

    @property
    def passes(self) -> int: ...

    @property
    def failures(self) -> int: ...


class AgentCollector(Collector):
    """Renders the latest record and matrix row on every scrape; on a keeper host (``keeper``
    given), the keeper's passes and failed passes in this agent, every term's."""

    def __init__(self, host: str, keeper: KeeperFigures | None = None) -> None:
        self.host = host
        self.keeper = keeper
        self._lock = threading.Lock()
        self._record: AgentRecord | None = None
        self._row: Sequence[Cell] = ()

    def update(self, record: AgentRecord | None = None, row: Sequence[Cell] | None = None) -> None:
        with self._lock:
            if record is not None:
                self._record = record
            if row is not None:
                self._row = list(row)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            record, row = self._record, list(self._row)
        labels = ["host", "gpu", "uuid", "name"]
        util = GaugeMetricFamily("hypertf_gpu_utilization_percent",
                                 "GPU utilisation as NVML reports it", labels=labels)
        used = GaugeMetricFamily("hypertf_gpu_memory_used_bytes", "GPU memory in use",
                                 labels=labels)
        total = GaugeMetricFamily("hypertf_gpu_memory_total_bytes", "GPU memory in all",
                                  labels=labels)
        state = GaugeMetricFamily("hypertf_gpu_state", "1 for the GPU's state in the matrix",
                                  labels=[*labels, "state"])
        task = GaugeMetricFamily("hypertf_gpu_task", "1 for the job holding (or draining) it",
                                 labels=[*labels, "task_key"])
        foreign = GaugeMetricFamily("hypertf_gpu_foreign_processes",
                                    "compute processes not of the job holding the GPU",
                                    labels=labels)
        trespass = GaugeMetricFamily("hypertf_gpu_trespasses",
                                     "processes on the GPU that their job was not granted "
                                     "(docs/gpu.md, Trespasses)", labels=labels)
        age = GaugeMetricFamily("hypertf_agent_heartbeat_age_seconds",
                                "seconds since the agent last probed its node", labels=["host"])
        info = InfoMetricFamily("hypertf_agent", "the agent's GPU source and driver versions",
                                labels=["host"])
        if record is not None:
            age.add_metric([self.host], max(0.0, time.time() - record.heartbeat))
            info.add_metric([self.host], {"gpu_source": record.gpu_source,
                                          **{f"{k}_version": v
                                             for k, v in record.gpu_driver.items()}})
            for gpu in record.gpus:
                values = [self.host, str(gpu.index), gpu.uuid, gpu.name]
                cell = row[gpu.index] if gpu.index < len(row) else None
                util.add_metric(values, gpu.utilization)
                used.add_metric(values, gpu.memory_used)
                total.add_metric(values, gpu.memory_total)
                now = state_of(cell)
                for name in STATES:
                    state.add_metric([*values, name], 1.0 if name == now else 0.0)
                key = job_of(cell) if cell is not None else None
                if key:
                    task.add_metric([*values, key], 1.0)
                foreign.add_metric(values, len(gpu.foreign_processes(key)))
                trespass.add_metric(values, sum(1 for t in record.trespasses
                                                if t.gpu == gpu.index))
        yield from (util, used, total, state, task, foreign, trespass, age, info)
        if self.keeper is not None:
            yield from self._keeper(self.keeper)

    def _keeper(self, keeper: KeeperFigures) -> Iterator[Metric]:
        passes = CounterMetricFamily("hypertf_keeper_passes",
                                     "keeper passes this agent ran (holding the keeper lease)",
                                     labels=["host"])
        passes.add_metric([self.host], keeper.passes)
        failures = CounterMetricFamily("hypertf_keeper_pass_failures",
                                       "keeper passes of this agent that failed (each logged "
                                       "with its cause, then tried again)", labels=["host"])
        failures.add_metric([self.host], keeper.failures)
        yield from (passes, failures)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds the agent's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged (one line per scrape would fill the agent's log)."""


class MetricsServer:
    """``/metrics`` for one agent; a port in use is logged, never fatal to the agent.

    prometheus_client's WSGI app in the standard library's server, whose thread sleeps in
    ``select`` until a scrape comes (prometheus_client's own ``start_http_server`` wakes
    twice a second to look for a shutdown: a third of an idle agent's CPU); ``stop`` wakes
    it with a connection of its own instead."""

    def __init__(self, collector: AgentCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server: WSGIServer | None = None
        self._refused: tuple[str, int] | None = None
        self.address: tuple[str, int] | None = None

    def start(self, address: str, port: int) -> bool:
        """Serve on ``address:port`` unless already serving (or refused there before)."""
        if self._server is not None or port == 0 or self._refused == (address, port):
            return self._server is not None
        try:
            server = make_server(address, port, make_wsgi_app(self.registry), _Server,
                                 handler_class=_QuietHandler)
        except OSError as err:
            self._refused = (address, port)
            log.error("cannot serve /metrics on %s:%d (%s): set hypertf_agent_metrics_port "
                      "to a free port (0 turns it off); the agent goes on without it",
                      address, port, err)
            return False
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": None},
                         name="metrics", daemon=True).start()
        self.address = (address, server.server_port)
        log.info("serving Prometheus metrics on http://%s:%d/metrics", *self.address)
        return True

    def stop(self) -> None:
        """Ask the server to stop, then knock until its ``select`` sees it."""
        server, address, self._server = self._server, self.address, None
        if server is None or address is None:
            return
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        stopper.start()
        deadline = time.monotonic() + 5.0
        while stopper.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(address, timeout=0.5).close()
            stopper.join(0.05)
        server.server_close()
