"""One headless Chromium for the browser tests (the playground, the evaluation report): the
system's chromium and chromedriver, never a download by Selenium Manager."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@contextmanager
def headless_chrome() -> Iterator[Any]:
    """A Chrome WebDriver with a 1,400 x 1,000 window at scale 1, quit at the end; skips the test
    where chromium or chromedriver is missing (scripts/test.sh installs both)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (Debian: apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--force-device-scale-factor=1", "--no-first-run",
                "--disable-extensions", "--disable-background-networking"):  # fmt: skip
        options.add_argument(arg)
    # Never let Selenium Manager look for (or download) a browser or driver: both are given.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
