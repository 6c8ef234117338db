"""The browser the console's tests drive: Debian's chromium through its own chromedriver
(scripts/install_browser.sh installs both), by Selenium pointed at that driver, so
Selenium Manager never downloads a browser. A skip where no browser is installed, a
failure where one is expected: under CI=true or RAGPLANE_REQUIRE_BROWSER=1 (as
tests/native.py does for embedder_rs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REQUIRE_ENV = "RAGPLANE_REQUIRE_BROWSER"
DRIVERS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH, HEIGHT = 1280, 800
#: where the screenshots go (CI keeps the folder); gitignored
ARTIFACTS = Path(os.environ.get("RAGPLANE_ARTIFACTS", "test-artifacts")) / "console"


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI") == "true"


def _absent(problem: str):
    how = "scripts/install_browser.sh (run by `make install` as root) installs them"
    if _required():
        pytest.fail(f"{problem}, but {REQUIRE_ENV}=1 or CI=true says a browser is expected: "
                    f"{how}", pytrace=False)
    pytest.skip(f"{problem}: {how}", allow_module_level=True)


def chrome():
    """A headless chromium at 1280x800, or a skip (a failure when a browser is required)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _absent(f"selenium does not import ({exc}); it is in the dev extra")
    driver = next((d for d in DRIVERS if os.access(d, os.X_OK)), None)
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if driver is None or browser is None:
        _absent("no chromium and chromedriver (Debian's chromium, chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chromium = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    # the window's size counts the browser's own frame even headless: the page's viewport
    # (what a screenshot holds) is set exactly
    chromium.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    return chromium


def page_errors(driver) -> list[str]:
    """What the page logged as errors since the last call (a script error, a refused
    asset, a content-security-policy violation)."""
    page = driver.current_url.split("?")[0]  # its own status (a 401 sign-in) is the test's
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not e["message"].startswith(page + " ")]


def screenshot(driver, name: str) -> Path:
    """The viewport (1280x800) as ARTIFACTS/<name>.png; fails when the page logged an
    error."""
    size = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    assert size == [WIDTH, HEIGHT], size
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    errors = page_errors(driver)
    assert not errors, f"the {name} page logged errors: {errors}"
    return path
