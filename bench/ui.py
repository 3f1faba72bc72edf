"""The dashboard under load: time to first byte and to a rendered jobs page with 100 and 10,000
jobs, and the server's memory with 20 log streams open.

Run: python bench/ui.py [--repeat R]
Starts a real `gpulayer server` per job count over a SQLite file filled beforehand, logs in as
an admin over HTTP, and (when Debian's chromium and chromium-driver and selenium are installed)
times the rendered page in headless Chromium from its navigation timing. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-ui-admin-token-0123456789"
STREAMS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fill_store(url: str, count: int, live: int) -> list[str]:
    """count jobs (live of them queued for a remote worker that never comes), each with a log
    line; returns the queued ones' ids."""
    from sqlalchemy import insert

    from gpulayer.control import tables as t
    from gpulayer.control.store import Store
    from gpulayer.spec.validate import validate_spec

    spec = validate_spec(
        {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "remote"}}
    ).model_dump(mode="json")
    store = Store(url)
    now = time.time()
    states = ("succeeded", "failed", "cancelled")
    rows, queued = [], []
    for i in range(count):
        job_id = "j-" + uuid.uuid4().hex[:10]
        state = "queued" if i >= count - live else states[i % 3]
        if state == "queued":
            queued.append(job_id)
        created = now - (count - i) * 30.0
        rows.append(
            {
                "id": job_id, "name": f"bench-{i}", "spec": json.dumps(spec), "state": state,
                "target": "remote", "has_bundle": False, "attempts": 0,
                "cancel_requested": False, "created_at": created,
                "finished_at": None if state == "queued" else created + 10,
                "labels": json.dumps({"team": f"t{i % 7}"}),
            }
        )
    with store.engine.begin() as conn:
        conn.execute(insert(t.jobs), rows)
        conn.execute(
            insert(t.logs),
            [{"job_id": r["id"], "attempt": 0, "stream": "system", "text": "queued", "at": now}
             for r in rows],
        )
    store.close()
    return queued


def start_server(home: Path, url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "GPULAYER_HOME": str(home), "GPULAYER_TOKEN": TOKEN}
    log = (home / "server.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "server", "--port", str(port), "--database-url", url],
        stdout=log, stderr=log, env=env, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/v1/health", timeout=1).status_code == 200:
                return process, base
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError((home / "server.log").read_text()[-2000:])


def log_in(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=60)
    form = client.get("/ui/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    client.post("/ui/login", data={"csrf": csrf, "token": TOKEN})
    assert client.cookies.get("gpulayer_session"), "login failed"
    return client


def first_byte_and_whole(client: httpx.Client, path: str, repeat: int) -> tuple[float, float]:
    firsts, wholes = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        with client.stream("GET", path) as response:
            stream = response.iter_raw()
            next(stream)
            firsts.append(time.perf_counter() - started)
            for _chunk in stream:
                pass
            wholes.append(time.perf_counter() - started)
        assert response.status_code == 200, response.status_code
    return statistics.median(firsts), statistics.median(wholes)


def browser_render(base: str, cookie: str, path: str, repeat: int) -> tuple[float, float] | None:
    """(time to first byte, time to the page loaded and laid out) in headless Chromium."""
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not chromium or not driver_bin:
        return None
    profile = tempfile.mkdtemp(prefix="bench-ui-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        driver.get(base + "/ui/login")
        driver.add_cookie({"name": "gpulayer_session", "value": cookie, "path": "/ui"})
        firsts, loaded = [], []
        for _ in range(repeat):
            driver.get(base + path)
            timing = driver.execute_script(
                "const n = performance.getEntriesByType('navigation')[0];"
                "return [n.responseStart - n.startTime, n.loadEventEnd - n.startTime];"
            )
            firsts.append(timing[0] / 1000)
            loaded.append(timing[1] / 1000)
        return statistics.median(firsts), statistics.median(loaded)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_streams(client: httpx.Client, job_ids: list[str]) -> tuple[list[Any], threading.Event]:
    """Hold one SSE log stream per job open, each having read its first event."""
    stop = threading.Event()
    ready = threading.Barrier(len(job_ids) + 1, timeout=60)
    threads = []

    def follow(job_id: str) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server stops at the end of the run
            read_stream(job_id)

    def read_stream(job_id: str) -> None:
        with httpx.Client(base_url=str(client.base_url), cookies=client.cookies,
                          timeout=None) as own, own.stream(
            "GET", f"/ui/api/jobs/{job_id}/logs"
        ) as response:
            lines = response.iter_lines()
            while "data:" not in next(lines):
                pass
            ready.wait()
            for _line in lines:
                if stop.is_set():
                    break

    for job_id in job_ids:
        thread = threading.Thread(target=follow, args=(job_id,), daemon=True)
        thread.start()
        threads.append(thread)
    ready.wait()
    return threads, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'jobs':>7} {'page':>6} {'http ttfb':>10} {'http body':>10} "
          f"{'browser ttfb':>13} {'browser loaded':>15}")
    memory: list[str] = []
    for count in (100, 10_000):
        home = Path(tempfile.mkdtemp(prefix="bench-ui-"))
        url = f"sqlite:///{home / 'server.db'}"
        queued = fill_store(url, count, STREAMS)
        process, base = start_server(home, url)
        try:
            client = log_in(base)
            last_page = max(1, -(-count // 50))
            for label, path in (("first", "/ui/jobs"), ("last", f"/ui/jobs?page={last_page}"),
                                ("filter", "/ui/jobs?label=team%3Dt3&state=failed")):
                first, whole = first_byte_and_whole(client, path, args.repeat)
                shown = browser_render(base, client.cookies["gpulayer_session"], path, args.repeat)
                browser = ("n/a", "n/a") if shown is None else (
                    f"{shown[0] * 1000:.1f} ms", f"{shown[1] * 1000:.1f} ms")
                print(f"{count:>7} {label:>6} {first * 1000:>7.1f} ms {whole * 1000:>7.1f} ms "
                      f"{browser[0]:>13} {browser[1]:>15}", flush=True)
            if count == 10_000:
                before = rss_mb(process.pid)
                _threads, stop = open_streams(client, queued)
                time.sleep(2.0)  # let the streams' loops run a few rounds before measuring
                during = rss_mb(process.pid)
                started = time.perf_counter()
                first, _ = first_byte_and_whole(client, "/ui/jobs", args.repeat)
                memory.append(
                    f"server RSS: {before:.1f} MB idle, {during:.1f} MB with {STREAMS} log "
                    f"streams open ({(during - before) * 1024 / STREAMS:.0f} KB per stream); "
                    f"jobs page first byte meanwhile {first * 1000:.1f} ms "
                    f"({time.perf_counter() - started:.1f} s for {args.repeat} loads)"
                )
                stop.set()
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
            shutil.rmtree(home, ignore_errors=True)
    for line in memory:
        print(line)


if __name__ == "__main__":
    main()
