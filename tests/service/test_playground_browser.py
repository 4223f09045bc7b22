"""The playground driven in a real headless Chromium against the real service on the default model.

Debian's ``chromium`` and ``chromium-driver`` (``scripts/test.sh`` installs them) through Selenium,
pointed at that driver binary: nothing is downloaded. The test uploads two images, asks which is
larger and checks that the page shows the API's own answer to the same request; draws the dense
scorer's token x patch map and checks that it is large, has its colour scale and legible token
labels, at 1400 px and at a phone's 390 px, with nothing wider than the window; checks inputs before
sending them; clears an earlier answer when a request fails; disables the panels of components the
serving version lacks and says why; asks for an API key; and picks a model of a served set. With
``CLIP_UPDATE_SCREENSHOTS=1`` it writes the screenshots of docs/images/ (playground.png at 1400 px,
playground_phone.png at 390 px); otherwise it checks that they are there at those widths. The
playground and the API reference pages (Swagger UI, ReDoc) work under their Content-Security-Policy:
the browser reports no violation for anything of this server's own.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from headless_chrome import headless_chrome
from PIL import Image

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "models"
EXAMPLES = REPO / "examples"
WAIT_S = 120  # a generous bound on slow shared machines; the page normally answers in about a second
CSP_LISTENER = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.cspViolations.push({directive: e.effectiveDirective, blocked: e.blockedURI, source: e.sourceFile}));
"""


@pytest.fixture(scope="module")
def default_server(serve_app: Any) -> Iterator[str]:
    if not (STORE / "default" / "aliases.json").exists():
        pytest.skip(f"the committed default model is not in {STORE}")
    with serve_app(store=str(STORE), model="default@production", torch_threads=1) as running:
        yield running.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chrome() as driver:
        driver.set_script_timeout(WAIT_S)
        # Before any page script: collect what each page's Content-Security-Policy blocks.
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_LISTENER})
        yield driver


def _wait(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, message=f"waiting for {what}")


def _visible(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, css).is_displayed(), css)


def _find(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def _upload(driver: Any, slot: str, path: Path) -> None:
    _find(driver, f"#{slot} input[type=file]").send_keys(str(path))
    _wait(driver, lambda d: _find(d, f"#{slot} .file-name").text == path.name, f"{path.name} in {slot}")


def _drop(driver: Any, slot: str, path: Path, name: str) -> None:
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


def _violations(driver: Any) -> list[dict[str, str]]:
    """What the page's Content-Security-Policy blocked so far, but an image from another host (a
    page may reference one, such as ReDoc's footer logo; the policy keeps it from loading)."""
    found: list[dict[str, str]] = driver.execute_script("return window.cspViolations || [];")
    return [v for v in found if not (v["directive"] == "img-src" and v["blocked"].startswith("https://"))]


def _data(path: Path) -> dict[str, str]:
    return {"data": base64.b64encode(path.read_bytes()).decode()}


def _viewport(driver: Any, width: int, scale: float = 1) -> None:
    """Lay the page out at ``width`` CSS px (a phone's, with its touch screen, under 600 px)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": scale, "mobile": width < 600},
    )
    _wait(driver, lambda d: d.execute_script("return window.innerWidth") == width, f"the page at {width} px")


def _overflow(driver: Any) -> int:
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


def _check_heatmap(driver: Any, dense: dict[str, Any], best: int, *, min_width: float) -> dict[str, Any]:
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


def _screenshot(driver: Any, path: Path, element: str | None = None) -> None:
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


def _keep_screenshot(driver: Any, tmp_path: Path, name: str, width: int, element: str | None = None) -> None:
    """With CLIP_UPDATE_SCREENSHOTS=1, write docs/images/<name>; otherwise check that the committed one
    is there at this width (and keep the one taken now beside the test's files)."""
    target = DOC_IMAGES / name if UPDATE_SCREENSHOTS else tmp_path / name
    _screenshot(driver, target, element)
    print(f"playground screenshot: {target}")
    with Image.open(target) as taken, Image.open(DOC_IMAGES / name) as committed:
        assert taken.size[0] == committed.size[0], f"{name}: CLIP_UPDATE_SCREENSHOTS=1 rewrites it"
        assert committed.size[0] >= width


def _count_requests(driver: Any) -> None:
    driver.execute_script(
        "if (!window.sent) { window.sent = []; const f = window.fetch;"
        " window.fetch = (...a) => { window.sent.push(String(a[0])); return f(...a); }; }"
    )


def _sent(driver: Any) -> list[str]:
    sent: list[str] = driver.execute_script("return window.sent.slice();")
    return sent


def test_the_page_ranks_a_pair_scores_densely_and_shows_api_errors(
    default_server: str, browser: Any, tmp_path: Path
) -> None:
    _viewport(browser, 1400)
    browser.get(f"{default_server}/")
    serving = httpx.get(f"{default_server}/models").json()["serving"]
    _wait(browser, lambda d: serving in _find(d, "#model-status").text, "the serving model version")
    assert "pcclip" in _find(browser, "#encoders-status").text  # the text encoders from /models
    assert not _find(browser, "#key-form").is_displayed()  # this server has no keys
    assert not browser.find_elements("css selector", ".unavailable:not([hidden])")  # it has DCSM and YUKINO
    # The preset examples load first, so that they cannot replace the uploads below.
    _wait(browser, lambda d: all(e.text for e in d.find_elements("css selector", ".slot .file-name")), "the examples")

    # Pair ranking: two uploaded files (the smaller circle as image A), "which is larger?".
    small, big = EXAMPLES / "small_circle.png", EXAMPLES / "big_circle.png"
    _upload(browser, "pair-a", small)
    _upload(browser, "pair-b", big)
    _find(browser, "#pair-run").click()
    _visible(browser, "#pair-result")
    shown_first = _find(browser, "#pair-answer").text
    shown_score = float(_find(browser, "#pair-score").text)
    difference = _find(browser, "#pair-text").get_attribute("value")
    api = httpx.post(
        f"{default_server}/rank-pair",
        json={"image_a": _data(small), "image_b": _data(big), "difference": difference},
        timeout=WAIT_S,
    ).json()
    assert shown_first == api["first"] == "b"  # the page says what the API says, and it is right
    assert shown_score == pytest.approx(api["score"], abs=1e-4)

    # Dense scoring of the preset scene: the table, then the map of the best caption, drawn from the
    # maps the API returns.
    _wait(browser, lambda d: _find(d, "#dense-image .file-name").text == "scene.png", "the example scene")
    _find(browser, "#dense-run").click()
    _visible(browser, "#heatmap-result")
    rows = browser.find_elements("css selector", "#dense-result tbody tr")
    texts = [r.find_element("css selector", "td").text for r in rows]
    dense = httpx.post(
        f"{default_server}/score/dense",
        json={"image": _data(EXAMPLES / "scene.png"), "texts": texts, "return_maps": True},
        timeout=WAIT_S,
    ).json()
    best = dense["best"]
    assert "best" in rows[best].get_attribute("class")
    assert [r.find_element("css selector", "td.functional").text for r in rows] == [
        ", ".join(words) or "—" for words in dense["functional_words"]
    ]
    assert _find(browser, "#heatmap-text").text == texts[best]
    # At 1400 px the map takes the panel's width: most of the window.
    desktop = _check_heatmap(browser, dense, best, min_width=900)
    # Zoomed in, it grows and scrolls inside its box; the page does not.
    _find(browser, "#zoom-in").click()
    zoomed = browser.execute_script("return document.getElementById('heatmap-canvas').getBoundingClientRect().width")
    assert zoomed > desktop["map"]["width"] * 1.3 and _overflow(browser) == 0
    _find(browser, "#zoom-fit").click()
    # Pointing at a cell names its token, its patch and its value; another caption's map on request.
    canvas = _find(browser, "#heatmap-canvas")
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element_with_offset(canvas, 0, 0).perform()  # the centre: a patch
    readout = _find(browser, "#heatmap-readout").text
    assert (
        readout.startswith("“") and "patch row" in readout and "over the image" in _find(browser, "#token-caption").text
    )
    other = (best + 1) % len(texts)
    rows[other].find_element("css selector", ".heatmap-button").click()
    _wait(browser, lambda d: _find(d, "#heatmap-text").text == texts[other], "the other caption's map")
    _check_heatmap(browser, dense, other, min_width=900)
    rows[best].find_element("css selector", ".heatmap-button").click()

    # Classification with and without comparative prompting, on the preset red circle: the pairs
    # the comparatives applied to fit one line, their list folded.
    _wait(browser, lambda d: _find(d, "#classify-image .file-name").text == "red.png", "the example red circle")
    _find(browser, "#classify-run").click()
    _visible(browser, "#classify-comparative")
    for column in ("#classify-standard", "#classify-comparative"):
        assert _find(browser, f"{column} .bar").get_attribute("data-label") == "red circle"
    info = _find(browser, "#classify-comparative .comparative-info")
    assert info.text.startswith("Applied") and info.size["height"] < 30
    pairs = _find(browser, "#classify-comparative .pairs")
    assert "label pair" in pairs.text and not pairs.get_attribute("open")
    pairs.find_element("css selector", "summary").click()
    chips = pairs.find_elements("css selector", "li")
    assert chips and all(" ↔ " in chip.text for chip in chips)

    # YUKINO matching of the preset scene's captions.
    _find(browser, "#yukino-run").click()
    _visible(browser, "#yukino-result")
    captions = _find(browser, "#yukino-texts").get_attribute("value").splitlines()
    yukino = httpx.post(
        f"{default_server}/classify",
        json={"images": [_data(EXAMPLES / "scene.png")], "labels": captions, "templates": ["{}"], "method": "yukino"},
        timeout=WAIT_S,
    ).json()
    assert _find(browser, "#yukino-result .bar").get_attribute("data-label") == yukino["results"][0]["label"]

    # Every answer on the page at 1400 px, nothing wider than the window; then at a phone's width,
    # where the map still fits and its labels stay legible.
    pairs.find_element("css selector", "summary").click()
    assert _overflow(browser) == 0
    _keep_screenshot(browser, tmp_path, "playground.png", 1400)
    _viewport(browser, 390, PHONE_SCALE)
    assert _overflow(browser) == 0
    _wait(browser, lambda d: _find(d, "#heatmap-canvas").size["width"] < 390, "the map redrawn for the phone")
    _check_heatmap(browser, dense, best, min_width=250)
    _keep_screenshot(browser, tmp_path, "playground_phone.png", 390 * PHONE_SCALE, "#heatmap-result")
    _viewport(browser, 1400)

    # Inputs are checked before anything is sent: one label is not a classification.
    _count_requests(browser)
    labels = _find(browser, "#classify-labels")
    labels.clear()
    labels.send_keys("circle")
    _find(browser, "#classify-run").click()
    _visible(browser, "#classify-error")
    assert _find(browser, "#classify-error").text == "Not sent: give at least 2 labels, one per line"
    assert "invalid" in labels.get_attribute("class") and _sent(browser) == []
    assert not _find(browser, "#classify-standard").is_displayed()  # the earlier answer went with it
    for box, value in (("#dense-texts", ""), ("#pair-text", " ")):
        field = _find(browser, box)
        field.clear()
        field.send_keys(value)
    _find(browser, "#dense-run").click()
    _wait(browser, lambda d: "write a caption first" in _find(d, "#dense-error").text, "the dense panel's check")
    _find(browser, "#pair-run").click()
    _wait(browser, lambda d: "write a difference text" in _find(d, "#pair-error").text, "the pair panel's check")
    assert _sent(browser) == []

    # An API error is shown as the API says it, and nothing of the earlier answer stays beside it:
    # a file that is no image, after a good dense answer.
    _find(browser, "#dense-texts").send_keys("a red circle\na blue square")
    _find(browser, "#dense-run").click()
    _visible(browser, "#heatmap-result")
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"not a picture")
    _upload(browser, "dense-image", notes)
    _find(browser, "#dense-run").click()
    _visible(browser, "#dense-error")
    refused = httpx.post(
        f"{default_server}/score/dense", json={"image": _data(notes), "texts": ["a red circle", "a blue square"]}
    ).json()["error"]
    error_text = _find(browser, "#dense-error").text
    assert refused["code"] in error_text and refused["message"] in error_text and refused["field"] in error_text
    assert not _find(browser, "#dense-result").is_displayed() and not _find(browser, "#heatmap-result").is_displayed()
    assert _violations(browser) == []


PANELS = ("pair", "classify", "yukino", "dense")


def _reason(driver: Any, panel: str) -> str | None:
    """The reason the panel gives for being unusable (None when it is usable), and its button's state."""
    note = _find(driver, f"#{panel}-panel .unavailable")
    disabled = _find(driver, f"#{panel}-run").get_attribute("disabled") is not None
    assert disabled == note.is_displayed(), panel  # disabled exactly when it says why
    return note.text if note.is_displayed() else None


def test_the_page_asks_for_a_key_and_sends_it_as_the_api_expects(
    serve_app: Any, tiny_store: Path, browser: Any
) -> None:
    # tiny@v1 has neither DCSM nor YUKINO; this server takes at most 3 labels a request.
    limits = {"max_labels": 3}
    with serve_app(store=str(tiny_store), model="tiny@production", api_keys=["sesame"], limits=limits) as running:
        browser.get(f"{running.url}/")
        browser.execute_script("sessionStorage.clear();")
        browser.refresh()
        _visible(browser, "#key-form")  # /models answered 401
        assert "unauthorized" in _find(browser, "#models-error").text
        # The "API key needed" state: the header says so, every panel waits for the key.
        assert _find(browser, "#model-status").text == "API key needed"
        _viewport(browser, 390)  # the key form fits a phone too
        assert _overflow(browser) == 0 and _find(browser, "#key-input").size["width"] >= 150
        _viewport(browser, 1400)
        for panel in PANELS:
            assert _reason(browser, panel) == "API key needed: enter the server's key above.", panel
        _find(browser, "#key-input").send_keys("wrong")
        _find(browser, "#key-form button").click()
        _wait(browser, lambda d: "forbidden" in _find(d, "#models-error").text, "the API's 403")
        _visible(browser, "#key-form")
        assert "refused" in _find(browser, "#key-message").text and _reason(browser, "pair")
        key = _find(browser, "#key-input")
        key.clear()
        key.send_keys("sesame")
        _find(browser, "#key-form button").click()
        _wait(browser, lambda d: "tiny@v1" in _find(d, "#model-status").text, "the model through the key")
        assert not _find(browser, "#models-error").is_displayed()
        assert not _find(browser, "#model-picker").is_displayed()  # one model: nothing to pick
        # The panels of the components tiny@v1 lacks are disabled, and say why; the others are not.
        assert _reason(browser, "pair") is None and _reason(browser, "classify") is None
        for panel, component in (("dense", "dcsm"), ("yukino", "yukino")):
            reason = _reason(browser, panel)
            assert reason and reason.startswith(f"tiny@v1 has no '{component}' component"), reason
        assert "components: none" in _find(browser, "#encoders-status").text
        # The limits the server publishes are checked before sending: the 4 preset labels are too many.
        _wait(browser, lambda d: d.execute_script("return limits !== null;"), "GET /limits")
        _count_requests(browser)
        _find(browser, "#classify-run").click()
        _visible(browser, "#classify-error")
        assert _find(browser, "#classify-error").text == "Not sent: this server takes at most 3 labels (4 given)"
        # A box without an image (as when its example could not be fetched) is named, not sent.
        browser.execute_script("slots['pair-b'].data = null;")
        _find(browser, "#pair-run").click()
        _wait(browser, lambda d: _find(d, "#pair-error").text.startswith("Not sent"), "the pair panel's check")
        assert _find(browser, "#pair-error").text == "Not sent: choose an image for “Image B” first"
        assert "invalid" in _find(browser, "#pair-b").get_attribute("class")
        assert _sent(browser) == []
        _upload(browser, "pair-b", EXAMPLES / "small.png")
        # Drag-and-drop: a file dropped on image A's box replaces the example there.
        _drop(browser, "pair-a", EXAMPLES / "large.png", "dropped.png")
        _wait(browser, lambda d: _find(d, "#pair-a .file-name").text == "dropped.png", "the dropped file")
        _find(browser, "#pair-run").click()
        _visible(browser, "#pair-result")
        assert _find(browser, "#pair-answer").text in ("a", "b")
        assert _sent(browser) == ["rank-pair"]


def test_the_page_picks_a_model_of_the_served_set(
    serve_app: Any, publish_model: Any, publish_dense_model: Any, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.support.ui import Select

    root = tmp_path / "store"
    publish_model(root, "tiny", seed=0)
    publish_dense_model(root, "other", seed=3)  # with a DCSM scorer, which tiny lacks
    with serve_app(store=str(root), model="tiny,other@production") as running:
        browser.get(f"{running.url}/")
        _wait(browser, lambda d: "tiny@v1" in _find(d, "#model-status").text, "the default model")
        picker = _find(browser, "#model-picker")
        assert picker.is_displayed()
        options = _find(browser, "#model-select").find_elements("css selector", "option")
        assert [o.text for o in options] == ["tiny · tiny@v1 (default)", "other@production · other@v1"]
        _wait(browser, lambda d: _find(d, "#pair-b .file-name").text, "the examples")
        difference = _find(browser, "#pair-text").get_attribute("value")
        pair = {"image_a": _data(EXAMPLES / "big_circle.png"), "image_b": _data(EXAMPLES / "small_circle.png")}
        for choice, model in (("other@production", "other@v1"), ("", "tiny@v1")):
            Select(_find(browser, "#model-select")).select_by_value(choice)
            _wait(browser, lambda d, m=model: m in _find(d, "#model-status").text, f"{model} in the header")
            # The dense panel follows the picked model's components.
            reason = _reason(browser, "dense")
            assert reason is None if model == "other@v1" else reason and "has no 'dcsm' component" in reason
            _find(browser, "#pair-run").click()
            _wait(browser, lambda d, m=model: _find(d, "#pair-model").text == f"answered by {m}", f"{model}'s answer")
            body = {**pair, "difference": difference, **({"model": choice} if choice else {})}
            api = httpx.post(f"{running.url}/rank-pair", json=body, timeout=WAIT_S).json()
            assert api["model"] == model
            assert float(_find(browser, "#pair-score").text) == pytest.approx(api["score"], abs=1e-4)
            if model == "other@v1":  # its dense map, on its own patch grid
                _find(browser, "#dense-run").click()
                _visible(browser, "#heatmap-result")
                texts = _find(browser, "#dense-texts").get_attribute("value").splitlines()
                body = {"image": _data(EXAMPLES / "scene.png"), "texts": texts, "return_maps": True, "model": choice}
                dense = httpx.post(f"{running.url}/score/dense", json=body, timeout=WAIT_S).json()
                _check_heatmap(browser, dense, dense["best"], min_width=900)
        assert not _find(browser, "#heatmap-result").is_displayed()  # tiny@v1 cannot have drawn it
        assert _violations(browser) == []


def _resources_off_host(driver: Any, host: str) -> list[str]:
    """Every resource the page loaded (the Resource Timing entries) from anywhere but ``host``."""
    names: list[str] = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
    return [n for n in names if not (n.startswith(f"http://{host}/") or n.startswith(("data:", "blob:")))]


def test_the_api_reference_pages_work_under_their_policies(serve_app: Any, tiny_store: Path, browser: Any) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production") as running:
        for page in ("/docs", "/redoc"):
            assert "content-security-policy" in httpx.get(f"{running.url}{page}").headers, page
        host = running.url.removeprefix("http://")
        # Swagger UI: its inline start script runs (allowed by hash) and draws every operation of the
        # OpenAPI 3.1 document as served (the 4.x bundle said "Unable to render this definition").
        browser.get(f"{running.url}/docs")
        _wait(browser, lambda d: len(d.find_elements("css selector", ".opblock")) >= 10, "Swagger UI's operations")
        text = browser.find_element("css selector", "#swagger-ui").text
        assert "Unable to render" not in text and "/embed" in text and "/rank-pair" in text
        assert _violations(browser) == [] and _resources_off_host(browser, host) == []
        # ReDoc: styled by the styles it writes, searching in its blob: worker.
        browser.get(f"{running.url}/redoc")
        operations = "[data-section-id*='operation/']"
        _wait(browser, lambda d: len(d.find_elements("css selector", operations)) >= 5, "ReDoc's operations")
        padding = browser.execute_script(f'return getComputedStyle(document.querySelector("{operations}")).paddingTop')
        assert padding != "0px"  # its own styles apply
        browser.find_element("css selector", "input[placeholder='Search...']").send_keys("embed")
        _wait(browser, lambda d: d.find_elements("css selector", "[data-role='search:results'] li"), "ReDoc's search")
        assert len(browser.find_elements("css selector", operations)) >= 10
        assert _violations(browser) == [] and _resources_off_host(browser, host) == []


def test_the_page_shows_what_the_library_was_measured_to_do(serve_app: Any, tmp_path: Path, browser: Any) -> None:
    """The comparative column says the library's measured effect (the version's eval.json), as the
    API's answer gives it, so a reader does not take the column for a gain the data never showed."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from measured_model import FIGURES, publish_measured

    root = tmp_path / "store"
    publish_measured(root, "measured")
    with serve_app(store=str(root), model="measured@production") as running:
        _viewport(browser, 1400)
        browser.get(f"{running.url}/")
        _wait(browser, lambda d: _find(d, "#classify-image .file-name").text == "red.png", "the example red circle")
        _find(browser, "#classify-run").click()
        _visible(browser, "#classify-comparative .measured")
        shown = _find(browser, "#classify-comparative .measured").text
        assert shown == ("Measured on shapes-test (these labels, 3 seeds): accuracy 0.500 → 0.520 with comparatives, "
                         "+2.0 ± 0.5 points: a gain.")  # fmt: skip
        assert FIGURES["gain.zeroshot_comparative.acc"] > 2 * FIGURES["gain.zeroshot_comparative.acc.stderr"]
        # Comparatives of the request's own: nothing was measured of them, and the line goes.
        _find(browser, "#classify-comparatives").send_keys("blue square | green triangle | the first has corners")
        _find(browser, "#classify-run").click()
        info = "#classify-comparative .comparative-info"
        _wait(browser, lambda d: _find(d, info).text.startswith("Applied · request"), "the request's comparatives")
        assert not _find(browser, "#classify-comparative .measured").is_displayed()
        assert _overflow(browser) == 0 and _violations(browser) == []
