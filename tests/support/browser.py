"""Debian's headless Chromium, driven through its chromedriver (Selenium), as the browser tier
and ``make bench`` open the kit's pages: from ``file://``, with the flags a machine without a
network needs, and the browser's console kept (an error there fails a test)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--disable-dev-shm-usage")  # fmt: skip


def available() -> str | None:
    """Why the browser tier cannot run here; None where it can."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is not installed (tests/provision.sh installs chromium and chromium-driver as root)"
    try:
        import selenium  # noqa: F401  (the dev extra)
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 1600):
    """A headless Chromium of its own (a fresh profile), its console's messages kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory(prefix="kit-chromium-") as profile:
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def open_page(driver, path: Path) -> float:
    """Open a page from ``file://``; its load time in milliseconds (navigation start to the end
    of its load event, as the browser measured it)."""
    driver.get(Path(path).resolve().as_uri())
    return driver.execute_script(
        "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime;"
    )


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def screenshot(driver, path: Path, full: bool = True) -> None:
    """The page as a person sees it; ``full``: the window made as tall as the page first."""
    if full:
        width = driver.get_window_size()["width"]
        driver.set_window_size(width, 600)  # the page's own height, not the window's
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(height + 40, 12000))
    driver.save_screenshot(str(path))
