"""report.html of a real user-data evaluation in a real headless Chromium: it fits a 1,400 px window
and a phone's 390 px with nothing wider than the window (a wide table scrolls inside its box,
charts scale down), and every row of its table is explained. With ``CLIP_UPDATE_SCREENSHOTS=1`` it
writes docs/images/report.png (1,400 px) and report_phone.png (390 px at twice the density);
otherwise it checks that they are there at those widths.

A version with a DCSM scorer is compared with one that has a PC-CLIP encoder and comparatives, on
Fashion-MNIST photos, so the table has both versions' columns and component rows of each.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from headless_chrome import headless_chrome
from PIL import Image
from typer.testing import CliRunner

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path("/usr/share/datasets/fashion-mnist")
DOC_IMAGES = REPO / "docs" / "images"
UPDATE_SCREENSHOTS = os.environ.get("CLIP_UPDATE_SCREENSHOTS") == "1"
PHONE_SCALE = 2
# CSS px of the page kept in a screenshot: the title, the table and the first charts (the phone's:
# the table scrolling in its box)
SHOWN_HEIGHT = {1400: 2600, 390: 1500}
LIBRARY = [
    {"a": "shirt", "b": "t-shirt", "text": "The first image shows long sleeves, while the second short ones."},
    {"a": "t-shirt", "b": "shirt", "text": "The first image shows short sleeves, while the second long ones."},
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SOURCE.exists():
        pytest.skip("apt-get install dataset-fashion-mnist")
    sys.path.insert(0, str(REPO / "tests" / "service"))
    from dense_model import publish_dense

    from loadtests.local_stack import publish_tiny
    from training.cli import app

    runner = CliRunner()
    tmp = tmp_path_factory.mktemp("report")
    data = tmp / "fmnist"
    made = runner.invoke(app, ["data", "fashion-mnist", str(data), "--limit", "20", "--test-limit", "80"])
    assert made.exit_code == 0, made.output
    publish_tiny(tmp / "store", "pcclip-and-library", comparatives=LIBRARY)
    publish_dense(tmp / "store", "with-dcsm")
    common = ["--store", str(tmp / "store"), "--data", str(data / "test.jsonl"), "--split", "all",
              "--dataset-name", "fashion-test", "--seeds", "2", "--n-captions", "20", "--threads", "1"]  # fmt: skip
    compared = ["with-dcsm@production", "--compare", "pcclip-and-library@production", "--out", str(tmp / "out")]
    for args in (["pcclip-and-library@production"], compared):
        result = runner.invoke(app, ["evaluate", *args, *common])
        assert result.exit_code == 0, result.output
    return tmp / "out" / "report.html"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chrome() as driver:
        yield driver


def _viewport(driver: Any, width: int, scale: float = 1) -> None:  # noqa: ANN401
    metrics = {"width": width, "height": 900, "deviceScaleFactor": scale, "mobile": width < 600}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    assert driver.execute_script("return window.innerWidth") == width


def _overflow(driver: Any) -> int:  # noqa: ANN401
    """How many CSS px the page is wider than its window (0: no horizontal scrolling)."""
    width: int = driver.execute_script(
        "const e = document.documentElement; return Math.max(e.scrollWidth, document.body.scrollWidth) - e.clientWidth;"
    )
    return width


def _keep_screenshot(driver: Any, tmp_path: Path, name: str, width: int) -> None:  # noqa: ANN401
    """With CLIP_UPDATE_SCREENSHOTS=1, write docs/images/<name>; otherwise check that the committed
    one is there at this width (the one taken now is kept beside the test's files)."""
    target = DOC_IMAGES / name if UPDATE_SCREENSHOTS else tmp_path / name
    driver.execute_script("window.scrollTo(0, 0);")
    height = driver.execute_script("return document.body.getBoundingClientRect().bottom + window.scrollY;")
    clip = {"x": 0, "y": 0, "width": driver.execute_script("return window.innerWidth;"),
            "height": min(height, SHOWN_HEIGHT[width // (PHONE_SCALE if width < 1400 else 1)]), "scale": 1}  # fmt: skip
    capture = driver.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})
    target.write_bytes(base64.b64decode(capture["data"]))
    with Image.open(target) as taken, Image.open(DOC_IMAGES / name) as committed:
        assert taken.size[0] == committed.size[0] == width, f"{name}: CLIP_UPDATE_SCREENSHOTS=1 rewrites it"


def test_the_report_fits_a_desktop_window_and_a_phone(report: Path, browser: Any, tmp_path: Path) -> None:  # noqa: ANN401
    _viewport(browser, 1400)
    browser.get(report.as_uri())
    images = browser.find_elements("css selector", "img")
    assert len(images) >= 5 and all(browser.execute_script("return arguments[0].complete", i) for i in images)
    assert _overflow(browser) == 0
    body = browser.execute_script("return document.body.getBoundingClientRect().width")
    assert all(i.size["width"] <= body for i in images)  # every chart within the page's column
    # The table: both versions' columns, and every component row says what it adds.
    heads = [h.text for h in browser.find_elements("css selector", "table th")]
    assert heads[-2:] == ["change", "chance"] and len(heads) == 6
    rows = browser.find_elements("css selector", "table tr")[1:]
    by_key = {r.find_element("css selector", "code").text: r.find_elements("css selector", "td") for r in rows}
    for key in ("hard_negatives.dcsm.negation", "hard_negatives.dcsm.all"):
        assert " vs cosine" in by_key[key][4].text, key
    assert by_key["rank_pair.label.pcclip"][3].text == "-"  # only the compared version has a PC-CLIP encoder
    # Every row explained, in the table's order.
    names = [cells[0].text for cells in by_key.values()]
    assert [d.text for d in browser.find_elements("css selector", "dt")] == names
    assert all(d.text for d in browser.find_elements("css selector", "dd"))
    _keep_screenshot(browser, tmp_path, "report.png", 1400)

    _viewport(browser, 390, PHONE_SCALE)
    assert _overflow(browser) == 0
    assert all(i.size["width"] <= 390 for i in browser.find_elements("css selector", "img"))
    box = browser.find_element("css selector", ".wide")
    assert box.size["width"] <= 390  # the table scrolls inside its box
    _keep_screenshot(browser, tmp_path, "report_phone.png", 390 * PHONE_SCALE)
    _viewport(browser, 1400)


def test_label_only_data_says_why_it_has_no_swapped_attributes(report: Path) -> None:
    """A row of swapped attributes (here only the compared version's, if any) or none at all: the
    explanations say that captions of labels have no attribute words to swap."""
    from training.evaluation.userdata.explain import explanation
    from training.evaluation.userdata.figures import describe

    text = explanation(describe("hard_negatives.cosine.swap"), label_only=True)
    assert "labels only" in text and "no attribute words" in text
    section = json.loads((report.parent / "eval.json").read_text())["datasets"]["fashion-test"]
    assert "captions" in section["skipped"]  # label-only data, as the report's explanations assume
