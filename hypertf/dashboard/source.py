"""Where the dashboard's data comes from: a Protocol, the live cluster, or a JSON fixture.

The server only asks a ``DataSource``; ``ClusterSource`` answers with the same reads the
terminal verbs use (status.collect, queueview.collect, Store.jobs.collect, sweep.list_sweeps,
joblogs.show_logs; the usage ledger as ``hypertf usage`` counts it) on the user's own
credential, so the page says what ``hypertf status`` says. ``FixtureSource`` serves a
recorded JSON object: the browser's speed test draws 1,000 hosts without a ZooKeeper.
"""

from __future__ import annotations

import io
import json
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypedDict, cast

from hypertf.config.inventory import Inventory
from hypertf.dashboard.metrics import exposition
from hypertf.dashboard.usage import UsageReader, daily_chart, totals, viewer_of, waiting_counts
from hypertf.store import Store, credentials
from hypertf.store.waitqueue import REASONS


class DataSource(Protocol):
    """What the page shows; each call is a fresh read (the page polls)."""

    def status(self) -> dict[str, Any]: ...

    def queue(self) -> list[dict[str, Any]]: ...

    def jobs(self) -> list[dict[str, Any]]: ...

    def sweeps(self) -> list[dict[str, Any]]: ...

    def logs(self, task_key: str) -> str: ...

    def usage(self) -> dict[str, Any]: ...

    def metrics(self) -> bytes: ...


def with_reasons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each queue row with its reason in words (``why``), as a waiting launcher says it."""
    return [{**row, "why": REASONS.get(str(row.get("reason")), "")} for row in rows]


def sweep_rows(inventory: str | Path | None = None) -> list[dict[str, Any]]:
    """The sweeps under runs/sweeps (of the directory the dashboard runs in) whose trials
    run on ``inventory`` (None: every one), with their trials."""
    from hypertf.sweep import driver as sweeps

    found = []
    for each in sweeps.list_sweeps(inventory):
        found.append({"sweep": each.sweep_id, "inventory": each.inventory,
                      "metric": each.metric, "mode": each.mode,
                      "created": each.created, "counts": each.counts(),
                      "running": sweeps.alive(each.driver_pid),
                      "trials": [asdict(result) for result in each.results()]})
    return found


class ClusterSource:
    """The live cluster through one long-lived Store (kazoo's client is thread-safe)."""

    def __init__(self, inventory: Inventory, store: Store, log_limit: int = 200_000,
                 viewer: str | None = None) -> None:
        """``viewer``: whose usage is shown by name ("": everyone's; None: by the store's
        credential, as ``hypertf usage`` decides)."""
        self.inventory, self.store, self.log_limit = inventory, store, log_limit
        self.lock = threading.Lock()  # one status read at a time: ZooKeeper's work is shared
        self.viewer = viewer_of(credentials.default_identity()) if viewer is None else viewer
        self.ledger = UsageReader(store)
        self._preemptions: dict[str, int] = {}  # from the queue view ``waiting`` read last
        self.render_metrics = exposition(self, self.viewer)

    def status(self) -> dict[str, Any]:
        from hypertf.store import status

        with self.lock:
            return status.collect(self.store.client, self.inventory)

    def queue(self) -> list[dict[str, Any]]:
        from hypertf.keeper import queueview

        return with_reasons(queueview.collect(self.store,
                                              self.inventory.cluster.user_gpu_limit))

    def jobs(self) -> list[dict[str, Any]]:
        """The newest 200 readable records, then one ``{"skipped": n, "note": ...}`` row per
        user whose folder holds unreadable records (the page shows them as notes)."""
        from hypertf.store.jobs import job_state

        listed = self.store.jobs.collect()
        rows: list[dict[str, Any]] = [{**job, "status": job_state(job)}
                                      for job in listed.jobs[:200]]
        return rows + [{"skipped": count, "folder": f"jobs/{user}", "note": note}
                       for (user, count), note in zip(sorted(listed.unreadable.items()),
                                                      listed.notes(), strict=True)]

    def sweeps(self) -> list[dict[str, Any]]:
        """This cluster's sweeps: those of other inventories are not its."""
        return sweep_rows(self.inventory.path)

    def logs(self, task_key: str) -> str:
        """The job's task logs as they are now, read on the nodes over SSH (the page polls)."""
        from hypertf.launch.joblogs import show_logs

        out = io.StringIO()
        show_logs(self.store, self.inventory, task_key, out=out)
        return out.getvalue()[-self.log_limit:]

    def usage(self) -> dict[str, Any]:
        """GPU-hours per user per day, the last 30 days (the viewer's alone by name)."""
        return self.ledger.chart(self.viewer)

    def metrics(self) -> bytes:
        return self.render_metrics()

    def gpu_seconds(self) -> dict[tuple[str, str], float]:
        """GPU-seconds per (user, model), every day of the ledger and the running attempts."""
        return totals(self.ledger.rows())

    def waiting(self) -> dict[tuple[str, str], int]:
        """Waiting jobs per (user, reason); the view's preemption counts are kept from the
        same read for ``preemptions`` (a scrape reads the view, up to 100s of KB, once)."""
        from hypertf.store.waitqueue import preemptions_of

        view = self.store.queue.read_queue_view()
        self._preemptions = preemptions_of(view)
        return waiting_counts(list(view.get("waiting", [])))

    def preemptions(self) -> dict[str, int]:
        """The counts of the view ``waiting`` read last (the collector asks right after)."""
        return self._preemptions


class Fixture(TypedDict, total=False):
    """A recorded answer per endpoint (a missing one: an empty answer)."""

    status: dict[str, Any]
    queue: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    sweeps: list[dict[str, Any]]
    logs: dict[str, str]  # task key -> its logs
    usage: list[list[Any]]  # [day, user, GPU model, GPU-seconds] rows of the ledger
    today: str  # the chart's last day (YYYY-MM-DD)


class FixtureSource:
    """A recorded answer per endpoint, from a JSON object or file: ``{"status": ...,
    "queue": [...], "jobs": [...], "sweeps": [...], "logs": {key: text}, "usage": [[day,
    user, model, GPU-seconds], ...], "today": "YYYY-MM-DD"}`` (the usage chart and the
    metrics are made from the rows, as from the ledger)."""

    def __init__(self, data: Fixture | dict[str, Any] | str | Path, viewer: str = "") -> None:
        self.data = cast(Fixture, data if isinstance(data, dict)
                         else json.loads(Path(data).read_text()))
        self.viewer = viewer
        self.render_metrics = exposition(self, viewer)

    def status(self) -> dict[str, Any]:
        return self.data.get("status", {"hosts": []})

    def queue(self) -> list[dict[str, Any]]:
        return with_reasons(self.data.get("queue", []))

    def jobs(self) -> list[dict[str, Any]]:
        return self.data.get("jobs", [])

    def sweeps(self) -> list[dict[str, Any]]:
        return self.data.get("sweeps", [])

    def logs(self, task_key: str) -> str:
        return self.data.get("logs", {}).get(task_key, "")

    def _rows(self) -> list[tuple[str, str, str, float]]:
        return [(str(d), str(u), str(m), float(s)) for d, u, m, s in self.data.get("usage", [])]

    def usage(self) -> dict[str, Any]:
        today = self.data.get("today") or max((r[0] for r in self._rows()), default="1970-01-01")
        return daily_chart(self._rows(), self.viewer, today)

    def metrics(self) -> bytes:
        return self.render_metrics()

    def gpu_seconds(self) -> dict[tuple[str, str], float]:
        return totals(self._rows())

    def waiting(self) -> dict[tuple[str, str], int]:
        return waiting_counts(self.data.get("queue", []))

    def preemptions(self) -> dict[str, int]:
        return {}
