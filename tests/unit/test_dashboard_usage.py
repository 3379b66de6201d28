"""The dashboard's usage chart and its Prometheus metrics, pure: the chart's days, folding
and viewer; the counter's caps (sticky names, never lower than served), the gauge's caps
and unknown reasons; the fixture source's answers in Prometheus' own parser."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hypertf.dashboard import FixtureSource
from hypertf.dashboard.metrics import UsageCollector
from hypertf.dashboard.usage import OTHERS, daily_chart, totals, viewer_of, waiting_counts
from hypertf.store.waitqueue import REASONS


class Figures:
    """Figures set by the test between scrapes."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = {}
        self.queue: dict[tuple[str, str], int] = {}
        self.preempted: dict[str, int] = {}

    def gpu_seconds(self) -> Mapping[tuple[str, str], float]:
        return self.seconds

    def waiting(self) -> Mapping[tuple[str, str], int]:
        return self.queue

    def preemptions(self) -> Mapping[str, int]:
        return self.preempted


def samples(collector: UsageCollector) -> dict[str, dict[tuple[str, str], float]]:
    found: dict[str, dict[tuple[str, str], float]] = {}
    for family in collector.collect():
        for sample in family.samples:
            labels = tuple(sample.labels.values())
            found.setdefault(sample.name, {})[labels] = sample.value  # type: ignore[index]
    return found


def test_the_chart_has_thirty_days_to_today_and_folds_users_past_the_cap() -> None:
    rows = [("2026-11-27", f"u{i:02d}", "A100", 3600.0 * (i + 1)) for i in range(15)]
    rows += [("2026-10-29", "u00", "A100", 7200.0),  # the first of the 30 days
             ("2026-10-28", "u00", "A100", 99e6),  # before them: left out
             ("2026-11-26", "u14", "H100", 1800.0)]
    chart = daily_chart(rows, "", "2026-11-27")
    assert len(chart["days"]) == 30
    assert (chart["days"][0], chart["days"][-1]) == ("2026-10-29", "2026-11-27")
    names = [s["user"] for s in chart["series"]]
    assert names[:3] == ["u14", "u13", "u12"] and names[-1] == OTHERS and len(names) == 13
    by_user = {s["user"]: s["gpu_hours"] for s in chart["series"]}
    assert by_user["u14"][-1] == 15 and by_user["u14"][-2] == 0.5
    assert by_user[OTHERS][-1] == 1 + 2 + 3  # u00, u01, u02 folded
    assert by_user[OTHERS][0] == 2  # u00's first day
    assert chart["total_gpu_hours"] == pytest.approx(sum(range(1, 16)) + 2 + 0.5)
    assert chart["viewer"] == "admin"


def test_a_users_chart_names_only_them() -> None:
    rows = [("2026-11-27", "bob", "A100", 3600.0), ("2026-11-27", "alice", "A100", 7200.0),
            ("2026-11-25", "carol", "A100", 3600.0)]
    chart = daily_chart(rows, "bob", "2026-11-27")
    assert [s["user"] for s in chart["series"]] == ["bob", OTHERS]
    assert chart["series"][1]["gpu_hours"][-1] == 2 and chart["series"][1]["gpu_hours"][-3] == 1
    assert chart["viewer"] == "bob" and chart["total_gpu_hours"] == 4
    assert daily_chart([], "bob", "2026-11-27")["series"] == []
    assert viewer_of("user.bob") == "bob" and viewer_of("admin") == ""
    assert viewer_of("agent.n1") == ""  # as hypertf usage: only a user's credential narrows


def test_the_counter_keeps_its_names_and_never_goes_down() -> None:
    figures = Figures()
    collector = UsageCollector(figures, users_max=2, models_max=1)
    figures.seconds = {("bob", "A100"): 100.0, ("alice", "A100"): 50.0,
                       ("carol", "A100"): 10.0, ("bob", "H100"): 5.0}
    first = samples(collector)["hypertf_user_gpu_seconds_total"]
    assert first == {("bob", "A100"): 100.0, ("alice", "A100"): 50.0,
                     (OTHERS, "A100"): 10.0, ("bob", OTHERS): 5.0}
    # carol grows past everyone: she stays in (others), whose series only grows
    figures.seconds = {("bob", "A100"): 90.0, ("alice", "A100"): 60.0,
                       ("carol", "A100"): 500.0, ("bob", "H100"): 5.0}
    second = samples(collector)["hypertf_user_gpu_seconds_total"]
    assert second[(OTHERS, "A100")] == 500.0
    assert second[("bob", "A100")] == 100.0  # lower by another clock: served as before
    assert second[("alice", "A100")] == 60.0


def test_a_users_counter_names_only_them() -> None:
    figures = Figures()
    figures.seconds = {("bob", "A100"): 100.0, ("alice", "A100"): 50.0,
                       ("carol", "A100"): 10.0}
    got = samples(UsageCollector(figures, viewer="alice"))["hypertf_user_gpu_seconds_total"]
    assert got == {("alice", "A100"): 50.0, (OTHERS, "A100"): 110.0}


def test_the_gauge_caps_users_and_reasons() -> None:
    figures = Figures()
    figures.queue = {("bob", "Fairshare"): 5, ("alice", "Resources"): 2,
                     ("carol", "Resources"): 1, ("alice", "NoSuchReason"): 1}
    got = samples(UsageCollector(figures, users_max=2))["hypertf_queue_waiting"]
    assert got == {("bob", "Fairshare"): 5, ("alice", "Resources"): 2,
                   (OTHERS, "Resources"): 1, ("alice", OTHERS): 1}


def test_waiting_counts_read_the_view_and_skip_junk() -> None:
    view = [{"task_key": "20261127-010000-a1b2c3.bob", "reason": "Fairshare"},
            {"task_key": "20261127-010001-a1b2c3.bob", "reason": "Fairshare"},
            {"task_key": "<script>", "reason": "Resources"}, {"reason": "Held"}]
    assert waiting_counts(view) == {("bob", "Fairshare"): 2}
    assert totals([("d", "bob", "A100", 1.0), ("e", "bob", "A100", 2.0)]) == {
        ("bob", "A100"): 3.0}


def test_the_reasons_of_issues_51_and_52_have_words() -> None:
    for reason in ("Fairshare", "Budget", "Preempting", "Requeued"):
        assert REASONS[reason]
    assert REASONS["Fairshare"].startswith("other users' shares are ahead of yours")
    assert REASONS["Budget"].startswith("your GPU-hours this month reached the admin's budget")


def test_the_fixture_source_serves_metrics_prometheus_parses() -> None:
    source = FixtureSource({
        "usage": [["2026-11-27", "bob", 'A100 "80GB"\\x', 7200.0],
                  ["2026-11-26", "alice", "H100", 3600.0]],
        "queue": [{"task_key": "20261127-010000-a1b2c3.bob", "reason": "Budget"}],
        "today": "2026-11-27"})
    families = {f.name: f for f in text_string_to_metric_families(source.metrics().decode())}
    counter = {(s.labels["user"], s.labels["gpu_model"]): s.value
               for s in families["hypertf_user_gpu_seconds"].samples
               if s.name.endswith("_total")}
    assert counter == {("bob", 'A100 "80GB"\\x'): 7200.0, ("alice", "H100"): 3600.0}
    gauge = families["hypertf_queue_waiting"].samples
    assert [(s.labels, s.value) for s in gauge] == [({"user": "bob", "reason": "Budget"}, 1)]
    assert source.usage()["series"][0]["gpu_hours"][-1] == 2
    assert source.queue()[0]["why"] == REASONS["Budget"]


def test_preemptions_are_counted_per_reason_and_only_the_keepers_reasons():
    figures = Figures()
    figures.preempted = {"priority": 3, "fairshare": 1, "<script>": 9}
    found = samples(UsageCollector(figures))
    assert found["hypertf_preemptions_total"] == {("priority",): 3.0, ("fairshare",): 1.0}
