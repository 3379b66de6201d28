"""The dashboard in a real headless Chromium: against the lab with a finished, a running and
a waiting job (the DOM shows a cell per GPU, the running job's key, the waiting job's reason),
and 1,000 synthetic hosts drawn in under a second. Screenshots are kept as test artefacts
(under $HYPERTF_TEST_ARTIFACTS when set)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.dashboard import ClusterSource, Dashboard, FixtureSource
from hypertf.ops.zkserver import free_port
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import FAKE, hypertf, task_key
from tests.launcher.test_queue import LAB_GPUS, finish_and_check, hold, waiter

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Offline machines: without these Chromium waits on Google's services and hangs.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,900")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    """A fresh headless Chromium (its own profile directory) driven by chromedriver."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("chromium and chromium-driver are not installed (./dev.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    base = os.environ.get("HYPERTF_TEST_ARTIFACTS")
    folder = Path(base) / request.node.name if base else tmp_path / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def show(driver, url: str, page: str, ready: str) -> None:
    """Open one page and wait until it has drawn an answer (``ready``: a JS condition)."""
    driver.get(f"{url}#{page}")
    driver.refresh()  # a hash change alone does not reload: start the page afresh
    wait_for(lambda: driver.execute_script(f"return window.hypertf.page === {page.split('/')[0]!r}"
                                           f" && window.hypertf.renders > 0 && ({ready})"),
             30, f"the {page} page")


def screenshot(driver, artifacts: Path, name: str) -> Path:
    path = artifacts / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def synthetic_status(hosts: int, gpus: int) -> dict:
    """The shape hypertf.store.status.collect returns, for ``hosts`` hosts in every state."""
    states = ("free", "busy", "busy", "draining", "unavailable")
    return {"inventory": "synthetic", "jobs": [f"job-{n}" for n in range(50)], "hosts": [
        {"name": f"node{h:04d}", "address": f"10.0.{h // 250}.{h % 250}", "agent": "up",
         "gpus": [{"index": g, "state": states[(h + g) % 5],
                   "task_key": f"job-{h % 50}" if states[(h + g) % 5] in ("busy", "draining")
                   else None, "utilization": float((h * 7 + g * 13) % 100),
                   "memory_used": 2 ** 33, "memory_total": 2 ** 34} for g in range(gpus)]}
        for h in range(hosts)]}


def test_a_thousand_hosts_render_in_under_a_second(browser, artifacts, tmp_path):
    fixture = tmp_path / "status-1000.json"
    fixture.write_text(json.dumps({"status": synthetic_status(1000, 8)}))
    with Dashboard(FixtureSource(fixture), port=0) as server:
        server.start()
        show(browser, server.url, "matrix", "document.querySelectorAll('.cell').length > 0")
        cells = browser.execute_script("return document.querySelectorAll('.cell').length")
        hosts = browser.execute_script("return document.querySelectorAll('.host').length")
        # the next polls redraw the same grid: take the slowest of three draws
        wait_for(lambda: browser.execute_script("return window.hypertf.renders >= 3"), 15,
                 "three draws")
        render_ms = browser.execute_script("return window.hypertf.lastRenderMs")
        screenshot(browser, artifacts, "1000-hosts")
        server.shutdown()
    print(f"1,000 hosts x 8 GPUs drawn in {render_ms:.0f} ms")
    assert (hosts, cells) == (1000, 8000)
    assert render_ms < 1000, f"{render_ms:.0f} ms"


def test_nothing_is_writable_and_unknown_pages_are_404():
    with Dashboard(FixtureSource({"status": synthetic_status(2, 2)}), port=0) as server:
        server.start()
        assert server.server_address[0] == "127.0.0.1"
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            request = urllib.request.Request(server.url + "api/status", data=b"{}",
                                             method=method)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 405, method
            assert refused.value.headers["Allow"] == "GET, HEAD"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(server.url + "api/secrets", timeout=10)
        assert missing.value.code == 404
        with urllib.request.urlopen(server.url + "api/status", timeout=10) as answer:
            assert len(json.load(answer)["hosts"]) == 2
        server.shutdown()


def test_the_bind_beyond_loopback_prints_a_url_with_a_token(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import os, threading\n"
         "from hypertf.dashboard import FixtureSource, serve\n"
         "threading.Timer(1.0, lambda: os._exit(0)).start()\n"
         "serve(FixtureSource({}), port=0, bind='0.0.0.0')"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert "answers only requests with its token" in done.stderr, done.stderr
    assert re.search(r"dashboard on http://0\.0\.0\.0:\d+/\?token=[\w-]{20,} ", done.stdout), \
        done.stdout
    with pytest.raises(ValueError, match="needs a token"):
        Dashboard(FixtureSource({}), port=0, bind="0.0.0.0")


def fetch_from(lab, host: str, url: str, *headers: str) -> tuple[int, str, str]:
    """GET ``url`` from a lab host (another machine of the network): status, headers, body."""
    inventory = load_inventory(lab.inventory)
    options = " ".join(f"-H {shlex.quote(h)}" for h in headers)
    out = on_host(inventory, host, f"curl -s -D - {options} {shlex.quote(url)}; echo")
    head, _, body = out.replace("\r\n", "\n").partition("\n\n")
    return int(head.split()[1]), head, body


@pytest.mark.lab
def test_the_dashboard_on_a_lab_address_wants_its_token(lab, tmp_path):
    """``hypertf dashboard --bind`` on the lab's network, fetched from another lab host:
    without the token (or with a wrong one) every page is 401; with it (in the URL, then the
    cookie it sets, or the Authorization header) the jobs are served."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "hypertf.cli", "dashboard", "-i", lab.inventory, "--bind",
         lab.gateway, "--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        found = re.search(r"dashboard on (http://\S+/)\?token=([\w-]+) ", line)
        assert found, line
        base, token = found.groups()
        assert base == f"http://{lab.gateway}:{port}/"
        for page in ("", "api/jobs", "api/status", "api/logs/some-key"):
            assert fetch_from(lab, "h2", base + page)[0] == 401, page
            assert fetch_from(lab, "h2", base + page + "?token=wrong")[0] == 401, page
        assert fetch_from(lab, "h2", base + "api/jobs", "Authorization: token wrong")[0] == 401
        code, head, body = fetch_from(lab, "h2", f"{base}api/jobs?token={token}")
        assert code == 200 and isinstance(json.loads(body), list), (code, body)
        cookie = re.search(r"(?im)^set-cookie: (hypertf_token_\d+=[\w-]+)", head).group(1)
        assert "HttpOnly" in head and "SameSite=Strict" in head
        assert fetch_from(lab, "h2", base + "api/status", f"Cookie: {cookie}")[0] == 200
        assert fetch_from(lab, "h2", base, f"Authorization: token {token}")[0] == 200
        assert fetch_from(lab, "h3", base + "api/queue", f"Authorization: Bearer {token}")[0] \
            == 200
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


@pytest.mark.lab
def test_the_lab_seen_in_the_browser(lab, tmp_path, browser, artifacts, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sweeps page reads ./runs/sweeps: none here
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1", "--",
                   "--work_s", "0.2", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    finished = task_key(done.stdout.splitlines(keepends=True))
    holder, finish = hold(lab, tmp_path, LAB_GPUS)
    job, waiting, _ = waiter(lab, tmp_path, 4)
    inventory = load_inventory(lab.inventory)
    running = None
    try:
        with store.opened(inventory.cluster) as zk, \
                Dashboard(ClusterSource(inventory, zk), port=0) as server:
            server.start()
            url = server.url
            show(browser, url, "matrix", "document.querySelectorAll('.cell.busy').length > 0")
            cells = browser.execute_script(  # each cell's hover text, as a pointer makes it
                "return [...document.querySelectorAll('.cell')].map(c => {c.dispatchEvent("
                "new MouseEvent('mouseover', {bubbles: true})); return [c.className, c.title]})")
            assert len(cells) == LAB_GPUS, cells
            [running] = [job for job in _status(inventory, "jobs") if job != waiting]
            assert all(c == "cell busy" and title.endswith(f"job {running}")
                       for c, title in cells), cells
            assert running in browser.find_element("id", "holding").text
            screenshot(browser, artifacts, "matrix")

            show(browser, url, "queue", "document.getElementById('queue')")
            rows = browser.execute_script(
                "return [...document.querySelectorAll('#queue tr')].slice(1).map(r => "
                "[...r.cells].map(c => c.textContent))")
            assert [(r[1], r[5]) for r in rows] == [(waiting, "Resources")], rows
            screenshot(browser, artifacts, "queue")

            show(browser, url, "jobs", "document.getElementById('jobs')")
            states = dict(browser.execute_script(
                "return [...document.querySelectorAll('#jobs tr')].slice(1).map(r => "
                "[r.cells[0].textContent, r.cells[1].textContent])"))
            assert states[finished] == "succeeded", states
            assert states[running] == "running", states
            assert states[waiting] == "queued", states
            screenshot(browser, artifacts, "jobs")

            show(browser, url, f"logs/{finished}", "document.getElementById('log')")
            wait_for(lambda: "argv=" in browser.find_element("id", "log").text, 30,
                     "the finished job's task log")
            screenshot(browser, artifacts, "logs")

            show(browser, url, "sweeps", "document.getElementById('empty')")
            server.shutdown()
    finally:
        job.send_signal(signal.SIGINT)  # the waiter leaves the queue, never started
        job.communicate(timeout=60)
        finish_and_check(holder, finish)
    assert running is not None


def _status(inventory, part: str) -> list:
    """What ``hypertf status`` says, to compare the page with."""
    from hypertf.store.status import collect

    with store.opened(inventory.cluster) as zk:
        return collect(zk.client, inventory)[part]
