"""The dashboard's usage page in a real headless Chromium (a stacked bar per day, one colour
per user, every name escaped) and its ``/metrics`` behind the token like every page."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from hypertf.dashboard import Dashboard, FixtureSource
from tests.launcher.test_dashboard import artifacts, browser, screenshot, show  # noqa: F401

HOSTILE = '<img src=x onerror="window.pwned=1">'


def fixture() -> dict[str, object]:
    rows = [[f"2026-11-{day:02d}", user, "A100", 3600.0 * hours]
            for day, user, hours in ((27, "bob", 4), (27, "alice", 2), (26, "bob", 1),
                                     (20, HOSTILE, 3), (1, "alice", 5))]
    return {"usage": rows, "today": "2026-11-27",
            "queue": [{"position": 1, "task_key": "20261127-010000-a1b2c3.bob",
                       "user": "bob", "priority": 0, "waiting_s": 5.0,
                       "reason": "Fairshare", "shape": "worker:1x1", "script": "t.py"}]}


def test_the_usage_page_draws_stacked_bars_and_escapes_names(browser, artifacts):  # noqa: F811
    with Dashboard(FixtureSource(fixture()), port=0) as server:
        server.start()
        show(browser, server.url, "usage", "document.querySelectorAll('rect.bar').length > 0")
        bars = browser.execute_script(
            "return [...document.querySelectorAll('rect.bar')].map(r => "
            "[r.querySelector('title').textContent, Number(r.getAttribute('height'))])")
        legend = browser.execute_script(
            "return [...document.querySelectorAll('.legend .user')].map(u => u.textContent)")
        pwned = browser.execute_script("return window.pwned === undefined")
        screenshot(browser, artifacts, "usage")
        show(browser, server.url, "queue", "document.querySelector('td.reason') !== null")
        why = browser.execute_script("return document.querySelector('td.reason').title")
        server.shutdown()
    titles = [t for t, _ in bars]
    assert len(bars) == 5 and all(h > 0 for _, h in bars)
    assert "2026-11-27 bob: 4.00 GPU-hours" in titles
    assert f"2026-11-20 {HOSTILE}: 3.00 GPU-hours" in titles  # shown as text, never run
    heights = dict(bars)
    assert heights["2026-11-27 bob: 4.00 GPU-hours"] == pytest.approx(
        2 * heights["2026-11-27 alice: 2.00 GPU-hours"], rel=0.02)
    assert legend == ["alice", "bob", HOSTILE] and pwned
    assert why.startswith("other users' shares are ahead of yours")


def test_metrics_and_usage_want_the_token_beyond_loopback():
    with Dashboard(FixtureSource(fixture()), port=0, bind="0.0.0.0", token="s3cret") as server:
        server.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        for page in ("metrics", "api/usage"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url + page, timeout=10)
            assert refused.value.code == 401
        asked = urllib.request.Request(url + "metrics",
                                       headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(asked, timeout=10) as answer:
            text = answer.read().decode()
        with urllib.request.urlopen(url + "api/usage?token=s3cret", timeout=10) as answer:
            chart = json.load(answer)
        server.shutdown()
    assert 'hypertf_user_gpu_seconds_total{gpu_model="A100",user="bob"} 18000.0' in text
    assert 'hypertf_queue_waiting{reason="Fairshare",user="bob"} 1.0' in text
    assert chart["days"][-1] == "2026-11-27" and chart["total_gpu_hours"] == 15
