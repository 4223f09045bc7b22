"""What the playground's browser tests share: a headless Chromium that records the page's
Content-Security-Policy violations, waits, uploads, the heatmap as the user sees it, and the
screenshots of docs/images/."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from headless_chrome import headless_chrome
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "models"
EXAMPLES = REPO / "examples"
WAIT_S = 120  # a generous bound on slow shared machines; the page normally answers in about a second
CSP_LISTENER = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.cspViolations.push({directive: e.effectiveDirective, blocked: e.blockedURI, source: e.sourceFile}));
"""


@contextmanager
def page_browser() -> Iterator[Any]:
    """The headless Chromium, its script timeout WAIT_S, collecting CSP violations from the first script."""
    with headless_chrome() as driver:
        driver.set_script_timeout(WAIT_S)
        # Before any page script: collect what each page's Content-Security-Policy blocks.
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_LISTENER})
        yield driver


# The pages' fixtures: a module imports the ``*_fixture`` functions (named without the suffix).
@pytest.fixture(scope="module", name="default_server")
def default_server_fixture(serve_app: Any) -> Iterator[str]:
    """The committed default model behind a real uvicorn, one torch thread."""
    if not (STORE / "default" / "aliases.json").exists():
        pytest.skip(f"the committed default model is not in {STORE}")
    with serve_app(store=str(STORE), model="default@production", torch_threads=1) as running:
        yield running.url


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Any]:
    with page_browser() as driver:
        yield driver


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, message=f"waiting for {what}")


def wait_visible(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, css).is_displayed(), css)


def find(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def upload(driver: Any, slot: str, path: Path) -> None:
    find(driver, f"#{slot} input[type=file]").send_keys(str(path))
    wait_for(driver, lambda d: find(d, f"#{slot} .file-name").text == path.name, f"{path.name} in {slot}")


def drop_file(driver: Any, slot: str, path: Path, name: str) -> None:
    """Drop a file on a slot as a user's drag from the desktop does (a DataTransfer with a File)."""
    driver.execute_script(
        """
        const [slot, b64, name] = arguments;
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], name, { type: "image/png" }));
        const target = document.getElementById(slot);
        target.dispatchEvent(new DragEvent("dragover", { dataTransfer: transfer, bubbles: true, cancelable: true }));
        target.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
        """,
        slot,
        base64.b64encode(path.read_bytes()).decode(),
        name,
    )


def csp_violations(driver: Any) -> list[dict[str, str]]:
    """What the page's Content-Security-Policy blocked so far, but an image from another host (a
    page may reference one, such as ReDoc's footer logo; the policy keeps it from loading)."""
    found: list[dict[str, str]] = driver.execute_script("return window.cspViolations || [];")
    return [v for v in found if not (v["directive"] == "img-src" and v["blocked"].startswith("https://"))]


def image_data(path: Path) -> dict[str, str]:
    return {"data": base64.b64encode(path.read_bytes()).decode()}


def set_viewport(driver: Any, width: int, scale: float = 1) -> None:
    """Lay the page out at ``width`` CSS px (a phone's, with its touch screen, under 600 px)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": scale, "mobile": width < 600},
    )
    wait_for(driver, lambda d: d.execute_script("return window.innerWidth") == width, f"the page at {width} px")


def overflow_px(driver: Any) -> int:
    """How many CSS px the page is wider than its window (0: no horizontal scrolling)."""
    width: int = driver.execute_script(
        "const e = document.documentElement; return Math.max(e.scrollWidth, document.body.scrollWidth) - e.clientWidth;"
    )
    return width


# What the user sees of the heatmap: the map's box, its rows' labels and the colour scale.
HEATMAP_GEOMETRY = """
const box = (n) => { const r = n.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
  bottom: r.bottom, width: r.width, height: r.height}; };
const canvas = document.getElementById("heatmap-canvas");
const labels = [...document.querySelectorAll("#heatmap-labels .token")];
const legend = document.getElementById("legend-canvas");
const ctx = canvas.getContext("2d");
const ratio = canvas.width / canvas.getBoundingClientRect().width;
const pixel = (x, y) => [...ctx.getImageData(Math.floor(x * ratio), Math.floor(y * ratio), 1, 1).data];
return {
  map: box(canvas), scroll: box(document.getElementById("heatmap-scroll")), window: window.innerWidth,
  labels: labels.map((n) => ({text: n.textContent, box: box(n), font: parseFloat(getComputedStyle(n).fontSize),
                              clipped: n.scrollWidth > n.clientWidth, italic: getComputedStyle(n).fontStyle})),
  legend: legend.checkVisibility() ? box(legend) : null,
  ticks: [...document.querySelectorAll("#legend-ticks span")].map((n) => n.textContent),
  tickFont: parseFloat(getComputedStyle(document.getElementById("legend-ticks")).fontSize),
  pixels: arguments[0].map(([r, c]) => pixel((c + 0.5) * canvas.getBoundingClientRect().width / arguments[1],
                                             (r + 0.5) * canvas.getBoundingClientRect().height / arguments[2])),
};
"""


def check_heatmap(driver: Any, dense: dict[str, Any], best: int, *, min_width: float) -> dict[str, Any]:
    """The heatmap of caption ``best`` as the user sees it: at least ``min_width`` px wide inside the
    window, one legible label per token beside its row, the colour scale with its values, and the
    API's largest value drawn warm, its smallest cool."""
    rows, tokens = dense["maps"][best], dense["tokens"][best]
    flat = [(value, r, c) for r, row in enumerate(rows) for c, value in enumerate(row)]
    hottest, coldest = max(flat), min(flat)
    seen = driver.execute_script(HEATMAP_GEOMETRY, [hottest[1:], coldest[1:]], len(rows[0]), len(rows))
    page = seen["window"]
    assert seen["map"]["width"] >= min_width and seen["scroll"]["right"] <= page, seen["map"]
    row_height = seen["map"]["height"] / len(rows)
    assert row_height >= 20
    assert [label["text"] for label in seen["labels"]] == tokens
    for r, label in enumerate(seen["labels"]):
        box = label["box"]
        assert label["font"] >= 12 and not label["clipped"], label  # the page's text size, whole
        assert box["right"] <= seen["map"]["left"] + 1 and box["left"] >= 0, label  # beside the map, on the page
        centre = (box["top"] + box["bottom"]) / 2 - seen["map"]["top"]
        assert r * row_height <= centre <= (r + 1) * row_height, label  # level with its own row
        if r:
            assert box["top"] >= seen["labels"][r - 1]["box"]["bottom"] - 0.5, label  # no two overlap
    functional = {word for word in dense["functional_words"][best]}
    assert {label["text"] for label in seen["labels"] if label["italic"] == "italic"} == functional & set(tokens)
    # The colour scale: symmetric about 0, its ends the map's largest magnitude.
    assert seen["legend"] is not None and seen["legend"]["width"] >= 150 and seen["tickFont"] >= 12
    extent = max(abs(hottest[0]), abs(coldest[0]))
    assert [float(t) for t in seen["ticks"]] == pytest.approx([-extent, -extent / 2, 0, extent / 2, extent], abs=0.051)
    (hr, hg, hb, _), (cr, cg, cb, _) = seen["pixels"]
    assert hr > hb and cb > cr, seen["pixels"]  # warm for the largest value, cool for the smallest
    # The value of the largest magnitude takes the scale's end colour.
    assert (hr - hb if hottest[0] >= -coldest[0] else cb - cr) > 100, seen["pixels"]
    return dict(seen)


def screenshot(driver: Any, path: Path, element: str | None = None) -> None:
    """The whole page (or the window's width around one element) beyond the window."""
    driver.execute_script("window.scrollTo(0, 0);")
    if element:
        clip = driver.execute_script(
            "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
            "return {x: 0, y: r.top + window.scrollY - 8, width: window.innerWidth, height: r.height + 16};",
            element,
        )
    else:
        width, height = driver.execute_script(
            "return [window.innerWidth, document.body.getBoundingClientRect().bottom + window.scrollY];"
        )
        clip = {"x": 0, "y": 0, "width": width, "height": height}
    capture = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"captureBeyondViewport": True, "clip": {**clip, "scale": 1}}
    )
    path.write_bytes(base64.b64decode(capture["data"]))


DOC_IMAGES = REPO / "docs" / "images"
UPDATE_SCREENSHOTS = os.environ.get("CLIP_UPDATE_SCREENSHOTS") == "1"
PHONE_SCALE = 2  # the phone screenshot at a phone's pixel density: its text stays sharp in the docs


def keep_screenshot(driver: Any, tmp_path: Path, name: str, width: int, element: str | None = None) -> None:
    """With CLIP_UPDATE_SCREENSHOTS=1, write docs/images/<name>; otherwise check that the committed one
    is there at this width (and keep the one taken now beside the test's files)."""
    target = DOC_IMAGES / name if UPDATE_SCREENSHOTS else tmp_path / name
    screenshot(driver, target, element)
    print(f"playground screenshot: {target}")
    with Image.open(target) as taken, Image.open(DOC_IMAGES / name) as committed:
        assert taken.size[0] == committed.size[0], f"{name}: CLIP_UPDATE_SCREENSHOTS=1 rewrites it"
        assert committed.size[0] >= width


def count_requests(driver: Any) -> None:
    """From now on, record the paths the page fetches (requests_sent); what it fetched before is forgotten."""
    driver.execute_script(
        "if (!window.sent) { const f = window.fetch;"
        " window.fetch = (...a) => { window.sent.push(String(a[0])); return f(...a); }; }"
        " window.sent = [];"
    )


def requests_sent(driver: Any) -> list[str]:
    sent: list[str] = driver.execute_script("return window.sent.slice();")
    return sent
