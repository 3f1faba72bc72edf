"""Headless Chromium (Debian's chromium and chromium-driver) driven by selenium, with a fresh
profile each time, and what the browser tests read from it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser_available() -> bool:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


@contextmanager
def headless_chromium(profile: Path) -> Iterator[Any]:
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
        f"--user-data-dir={profile}",
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
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A live section's HTML is replaced as it updates: an element found a moment ago may be
    # gone by the time it is read, which means "look again", not failure.
    ignored = (NoSuchElementException, StaleElementReferenceException)
    waiting = WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored)
    return waiting.until(condition, message)


def click(driver: Any, selector: str, timeout: float = 60) -> None:
    """Click what the selector finds, again if a live update replaced it under the click."""
    from selenium.webdriver.common.by import By

    def clicked(d: Any) -> bool:
        d.find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait_until(driver, clicked, timeout, message=f"could not click {selector}")


def screenshot(driver: Any, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, f"{name}: an empty picture"
    return path


def unique_marker() -> str:
    return f"marker-{time.time_ns()}"
