"""The dashboard's ``/metrics``: the cluster's usage and queue for Prometheus, beside the
agents' per-GPU metrics (hypertf.node.metrics; docs/gpu.md, "Metrics for Prometheus").

- ``hypertf_user_gpu_seconds_total{user,gpu_model}`` (a counter): GPU-seconds from the
  keeper's usage ledger (ended attempts, every day it holds) plus the running attempts up
  to now (from their grants), so ``rate()`` follows GPU use as it happens instead of
  jumping when a ten-hour job ends. Served never lower than this process served it before:
  a running attempt's last seconds are counted by the dashboard's clock, then by the
  keeper's when it ends, and a grant deleted by hand is never counted; neither may look
  like a counter reset.
- ``hypertf_queue_waiting{user,reason}`` (a gauge): waiting jobs per user and reason, from
  the keeper's published view of the queue (``keeper/queue``), which every member reads.

Label cardinality is bounded: at most USERS_MAX users and MODELS_MAX GPU models by name,
the rest summed under ``(others)``. The counter's names are kept for the process's life
(the largest users of the first scrape, then newcomers while there is room), so a user's
series never moves into ``(others)`` and back, which would read as resets; the gauge takes
the USERS_MAX users with the most waiting jobs at each scrape, and a reason the dashboard
does not know (hypertf.store.waitqueue.REASONS) is ``(others)`` too. A user's dashboard
(not the admin's) names only that user's usage, as ``hypertf usage`` does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hypertf.dashboard.usage import OTHERS
from hypertf.store.waitqueue import REASONS

USERS_MAX = 100
MODELS_MAX = 16
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Figures(Protocol):
    """What the collector reads at each scrape (a data source gives both)."""

    def gpu_seconds(self) -> Mapping[tuple[str, str], float]: ...

    def waiting(self) -> Mapping[tuple[str, str], int]: ...

    def preemptions(self) -> Mapping[str, int]: ...


class Names:
    """A capped set of label values that only grows: past ``limit`` every new value is
    OTHERS. The first call may seed it with the largest values."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept: set[str] = set()

    def admit(self, ranked: list[str]) -> None:
        """Keep ``ranked``'s values (largest first) while there is room."""
        for value in ranked:
            if len(self.kept) >= self.limit:
                return
            self.kept.add(value)

    def label(self, value: str) -> str:
        return value if value in self.kept else OTHERS


class UsageCollector(Collector):
    """Renders the two metrics from ``figures`` on every scrape; ``viewer`` a user's name:
    only that user by name."""

    def __init__(self, figures: Figures, viewer: str = "", users_max: int = USERS_MAX,
                 models_max: int = MODELS_MAX) -> None:
        self.figures, self.viewer = figures, viewer
        self.users_max = users_max
        self._lock = threading.Lock()
        self._users, self._models = Names(users_max), Names(models_max)
        self._served: dict[tuple[str, str], float] = {}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counter = CounterMetricFamily(
                "hypertf_user_gpu_seconds", "GPU-seconds per user and GPU model: the "
                "keeper's ledger (ended attempts) and the running attempts up to now",
                labels=["user", "gpu_model"])
            for (user, model), value in sorted(self._counted().items()):
                counter.add_metric([user, model], value)
            gauge = GaugeMetricFamily("hypertf_queue_waiting",
                                      "waiting jobs per user and reason (the keeper's view)",
                                      labels=["user", "reason"])
            for (user, reason), count in sorted(self._waiting().items()):
                gauge.add_metric([user, reason], count)
            preempted = CounterMetricFamily(
                "hypertf_preemptions", "running jobs the keeper preempted, per reason "
                "(priority, fairshare), in the current keeper's term", labels=["reason"])
            for reason, count in sorted(self.figures.preemptions().items()):
                if reason in ("priority", "fairshare"):
                    preempted.add_metric([reason], count)
        yield from (counter, gauge, preempted)

    def _counted(self) -> dict[tuple[str, str], float]:
        raw = self.figures.gpu_seconds()
        if self.viewer:
            self._users.kept = {self.viewer}
        else:
            per_user: dict[str, float] = {}
            for (user, _), value in raw.items():
                per_user[user] = per_user.get(user, 0.0) + value
            self._users.admit(sorted(per_user, key=lambda u: (-per_user[u], u)))
        per_model: dict[str, float] = {}
        for (_, model), value in raw.items():
            per_model[model] = per_model.get(model, 0.0) + value
        self._models.admit(sorted(per_model, key=lambda m: (-per_model[m], m)))
        folded: dict[tuple[str, str], float] = {}
        for (user, model), value in raw.items():
            key = (self._users.label(user), self._models.label(model))
            folded[key] = folded.get(key, 0.0) + value
        for key, value in folded.items():  # never lower than served: no false resets
            self._served[key] = max(self._served.get(key, 0.0), value)
        return dict(self._served)

    def _waiting(self) -> dict[tuple[str, str], int]:
        raw = self.figures.waiting()
        per_user: dict[str, int] = {}
        for (user, _), count in raw.items():
            per_user[user] = per_user.get(user, 0) + count
        named = set(sorted(per_user, key=lambda u: (-per_user[u], u))[:self.users_max])
        found: dict[tuple[str, str], int] = {}
        for (user, reason), count in raw.items():
            key = (user if user in named else OTHERS, reason if reason in REASONS else OTHERS)
            found[key] = found.get(key, 0) + count
        return found


def exposition(figures: Figures, viewer: str = "") -> Callable[[], bytes]:
    """A function rendering the metrics in Prometheus' text format, one registry kept (the
    counter's names and served values live as long as it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(UsageCollector(figures, viewer))
    return lambda: generate_latest(registry)
