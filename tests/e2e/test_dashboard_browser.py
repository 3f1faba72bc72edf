"""The dashboard in a real browser (headless Chromium): log in, watch a job submitted from the
CLI appear, open it, watch its log lines arrive, cancel it; wrong and non-admin tokens refused;
every page rendered without a console error, with a screenshot of each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    click,
    console_errors,
    headless_chromium,
    screenshot,
    unique_marker,
    wait_until,
)
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture()
def dashboard_home(shared_home: Path) -> Path:
    return shared_home


@pytest.fixture()
def base_url(shared_home: Path) -> str:
    """The local control plane's address, started through the CLI as a user would."""
    result = run_cli(["ui", "--no-browser"])
    assert result.returncode == 0, result.stderr
    return str(json.loads((shared_home / "server.json").read_text())["url"])


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    with headless_chromium(tmp_path / "chromium-profile") as driver:
        yield driver


def admin_token(home: Path) -> str:
    return (home / "token").read_text().strip()


def log_in(driver: Any, base_url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(base_url + "/ui/login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()


def session_cookie(driver: Any) -> Any:
    return driver.get_cookie("gpulayer_session")


def test_job_from_the_cli_appears_streams_logs_and_cancels(
    browser: Any, base_url: str, dashboard_home: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    shots = tmp_path / "screenshots"
    driver = browser
    driver.get(base_url + "/ui/jobs")
    wait_until(driver, lambda d: d.current_url.endswith("/ui/login"), message="not sent to login")
    screenshot(driver, shots, "login")

    log_in(driver, base_url, admin_token(dashboard_home))
    wait_until(driver, lambda d: d.current_url.endswith("/ui/jobs"), message="login failed")
    cookie = session_cookie(driver)
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie.get("expiry"), "the session cookie has no expiry"
    # Set on this page only; a reload would lose it, so it proves the row came without one.
    driver.execute_script("window.gpulayerNoReload = 'still here';")

    marker = unique_marker()
    script = (
        "import sys, time\n"
        "for i in range(1, 6):\n"
        f"    print('{marker} line', i, flush=True)\n"
        "    time.sleep(0.3)\n"
        "time.sleep(600)\n"
    )
    submitted = run_cli(
        ["submit", "-d", "--name", "browser-job", "--label", "suite=browser", "--",
         "python", "-c", script],
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    row = f"tr[data-job='{job_id}']"
    wait_until(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, row),
        message=f"job {job_id} never appeared on the open jobs page",
    )
    assert driver.execute_script("return window.gpulayerNoReload;") == "still here"
    wait_until(
        driver,
        lambda d: "running" in d.find_element(By.CSS_SELECTOR, row).text,
        message="the row never showed the job running",
    )
    screenshot(driver, shots, "jobs")

    click(driver, f"{row} a")
    wait_until(driver, lambda d: d.current_url.endswith(f"/ui/jobs/{job_id}"))
    wait_until(
        driver,
        lambda d: f"{marker} line 5" in d.find_element(By.ID, "log").text,
        message="the log lines never arrived",
    )
    lines = [
        text
        for text in driver.find_element(By.ID, "log").text.splitlines()
        if text.startswith(marker)
    ]
    assert lines == [f"{marker} line {i}" for i in range(1, 6)], lines  # each once, in order
    screenshot(driver, shots, "job-running")

    click(driver, "#cancel-form button")
    wait_until(
        driver,
        lambda d: d.find_element(By.ID, "job-state").text == "cancelled",
        message="the page never showed the job cancelled",
    )
    status = json.loads(run_cli(["status", job_id, "--json"]).stdout)
    assert status["state"] == "cancelled"
    assert driver.find_elements(By.CSS_SELECTOR, "#cancel-form") == []
    screenshot(driver, shots, "job-cancelled")

    # A schedule from the CLI, run once by hand: its page shows the next ticks and the run.
    schedule_file = tmp_path / "nightly.json"
    schedule_file.write_text(json.dumps({
        "name": "ui-nightly",
        "cron": "0 4 * * *",
        "job": {"workload": {"kind": "command", "command": ["true"]}},
    }))
    applied = run_cli(["schedule", "apply", "-f", str(schedule_file)])
    assert applied.returncode == 0, applied.stderr
    triggered = run_cli(["schedule", "trigger", "ui-nightly"])
    assert triggered.returncode == 0, triggered.stderr
    scheduled_job = triggered.stdout.strip()
    driver.get(base_url + "/ui/schedules")
    section = "section[data-schedule='ui-nightly']"
    wait_until(
        driver,
        lambda d: scheduled_job in d.find_element(By.CSS_SELECTOR, section).text,
        message="the schedule's run never showed",
    )
    wait_until(  # its next ticks
        driver, lambda d: "04:00:00" in d.find_element(By.CSS_SELECTOR, section).text
    )
    driver.get(base_url + "/ui/jobs?schedule=ui-nightly")
    assert driver.find_elements(By.CSS_SELECTOR, f"tr[data-job='{scheduled_job}']")
    assert not driver.find_elements(By.CSS_SELECTOR, row)

    for name in ("workers", "instances", "schedules", "offers"):
        driver.get(f"{base_url}/ui/{name}")
        wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "main h1"))
        assert driver.find_element(By.CSS_SELECTOR, "main h1").text.lower() == name
        screenshot(driver, shots, name)
    # The local worker is listed with its hardware; the charts are drawn on the server.
    driver.get(base_url + "/ui/workers")
    assert driver.find_elements(By.CSS_SELECTOR, "#workers tr[data-worker='local']")
    assert driver.find_elements(By.CSS_SELECTOR, "svg.chart")

    # The filter narrows the list: a label no job carries shows none.
    driver.get(base_url + "/ui/jobs?label=suite%3Dnobody")
    assert not driver.find_elements(By.CSS_SELECTOR, row)
    driver.get(base_url + "/ui/jobs?label=suite%3Dbrowser&state=cancelled")
    assert driver.find_elements(By.CSS_SELECTOR, row)

    errors = console_errors(driver)
    assert errors == [], errors

    # Logging out ends the session on the server: the old cookie no longer opens a page.
    old = session_cookie(driver)["value"]
    driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait_until(driver, lambda d: d.current_url.endswith("/ui/login"))
    driver.add_cookie({"name": "gpulayer_session", "value": old, "path": "/ui"})
    driver.get(base_url + "/ui/jobs")
    assert driver.current_url.endswith("/ui/login")
    assert console_errors(driver) == []


@pytest.mark.parametrize("which", ["wrong", "join", "worker"])
def test_only_an_admin_token_logs_in(
    browser: Any, base_url: str, dashboard_home: Path, which: str
) -> None:
    from selenium.webdriver.common.by import By

    from gpulayer.protocol.client import ControlClient

    admin = ControlClient(base_url, admin_token(dashboard_home))
    if which == "wrong":
        token = "not-a-token-anyone-made"
    else:
        join = admin.request("POST", "/v1/tokens", {"kind": "join", "name": "ui-test"})["token"]
        token = join
        if which == "worker":
            registered = ControlClient(base_url, join).request(
                "POST",
                "/v1/workers",
                {"name": "ui-test-worker", "kind": "remote", "capabilities": {}},
            )
            token = registered["token"]
    log_in(browser, base_url, token)
    error = wait_until(browser, lambda d: d.find_elements(By.ID, "login-error"))[0].text
    expected = "wrong, revoked or expired" if which == "wrong" else "an admin token is needed"
    assert expected in error
    assert browser.current_url.endswith("/ui/login")
    assert session_cookie(browser) is None
    browser.get(base_url + "/ui/jobs")
    assert browser.current_url.endswith("/ui/login")


def test_a_login_link_works_once(browser: Any, base_url: str) -> None:
    from selenium.webdriver.common.by import By

    link = run_cli(["ui", "--no-browser"]).stdout.strip()
    assert link.startswith(base_url + "/ui/login/link?code=")
    browser.get(link)
    wait_until(browser, lambda d: d.current_url.endswith("/ui/jobs"), message="link refused")
    assert "code=" not in browser.current_url  # the code does not stay in the address bar
    browser.delete_all_cookies()
    browser.get(link)
    error = wait_until(browser, lambda d: d.find_elements(By.ID, "login-error"))[0].text
    assert "used already" in error
    assert session_cookie(browser) is None


def test_offers_page_plans_a_pasted_spec_without_creating_a_job(
    browser: Any, base_url: str, dashboard_home: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    log_in(driver, base_url, admin_token(dashboard_home))
    wait_until(driver, lambda d: d.current_url.endswith("/ui/jobs"), message="login failed")
    jobs_before = json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout)
    driver.get(base_url + "/ui/offers")
    spec = (
        "workload: {kind: command, command: [python, train.py]}\n"
        "resources: {accelerator: cuda, gpu_count: 1}\n"
        "placement: {target: local, fallback_targets: [cloud]}\n"
    )
    driver.find_element(By.ID, "plan-spec").send_keys(spec)
    driver.find_element(By.CSS_SELECTOR, "#plan-form button[type=submit]").click()
    wait_until(driver, lambda d: d.find_elements(By.ID, "plan-headline"), message="no plan shown")
    headline = driver.find_element(By.ID, "plan-headline").text
    # This machine has no CUDA GPU and no cloud provider is enabled: submit would refuse it.
    assert headline.startswith("plan: the job would be refused"), headline
    steps = driver.find_elements(By.CSS_SELECTOR, "#plan .plan-step")
    assert [(s.get_attribute("data-target"), s.get_attribute("data-outcome")) for s in steps] == [
        ("local", "skipped"),
        ("cloud", "unschedulable"),
    ]
    assert "needs a cuda accelerator, has cpu" in steps[0].text
    # The pasted spec stays in the box to be edited and planned again.
    assert "gpu_count: 1" in driver.find_element(By.ID, "plan-spec").get_attribute("value")
    screenshot(driver, tmp_path / "screenshots", "offers-plan")
    assert json.loads(run_cli(["ls", "--json", "-n", "1000"]).stdout) == jobs_before
    assert console_errors(driver) == []
