"""A headless Chromium (Debian's chromium and chromium-driver) driven by selenium, with a fresh
profile per test, and one local control plane per module."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser_available() -> bool:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


@pytest.fixture(scope="module")
def dashboard_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("gpulayer-ui-home")
    yield home
    stop_local_control_plane(home)


@pytest.fixture(autouse=True)
def _use_dashboard_home(dashboard_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(dashboard_home))
    monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "120")


@pytest.fixture()
def base_url(dashboard_home: Path) -> str:
    """The local control plane's address, started through the CLI as a user would."""
    result = run_cli(["ui", "--no-browser"])
    assert result.returncode == 0, result.stderr
    info = json.loads((dashboard_home / "server.json").read_text())
    return str(info["url"])


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    if not _browser_available():
        pytest.skip("chromium, chromium-driver and selenium are installed by .ci/run")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """What the page logged at SEVERE level (script errors, CSP refusals, failed loads)."""
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def wait_until(driver: Any, condition: Any, timeout: float = 60, message: str = "") -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message)


def screenshot(driver: Any, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, f"{name}: an empty picture"
    return path


def unique_marker() -> str:
    return f"marker-{time.time_ns()}"
