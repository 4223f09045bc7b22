"""The playground driven in a real headless Chromium against the real service on the default model.

Debian's ``chromium`` and ``chromium-driver`` (``scripts/test.sh`` installs them) through Selenium,
pointed at that driver binary: nothing is downloaded. The test uploads two images, asks which is
larger and checks that the page shows the API's own answer to the same request; renders a heatmap;
shows an API error as the API words it; asks a second model of a served set through its model
picker; and keeps a screenshot of the page (its path is printed;
``CLIP_PLAYGROUND_SCREENSHOT=path`` copies it there, as done for docs/images/playground.png). The
playground and the API reference pages (Swagger UI, ReDoc) work under their Content-Security-Policy:
the browser reports no violation for anything of this server's own.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "models"
EXAMPLES = REPO / "examples"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
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
    driver.set_script_timeout(WAIT_S)
    # Before any page script: collect what each page's Content-Security-Policy blocks.
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_LISTENER})
    try:
        yield driver
    finally:
        driver.quit()


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


def test_the_page_ranks_a_pair_scores_densely_and_shows_api_errors(
    default_server: str, browser: Any, tmp_path: Path
) -> None:
    browser.get(f"{default_server}/")
    serving = httpx.get(f"{default_server}/models").json()["serving"]
    _wait(browser, lambda d: serving in _find(d, "#model-status").text, "the serving model version")
    assert "pcclip" in _find(browser, "#encoders-status").text  # the text encoders from /models
    assert not _find(browser, "#key-form").is_displayed()  # this server has no keys
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

    # Dense scoring of the preset scene, then its heatmap, drawn by the API.
    _wait(browser, lambda d: _find(d, "#dense-image .file-name").text == "scene.png", "the example scene")
    _find(browser, "#dense-run").click()
    _visible(browser, "#heatmap-result")
    rows = browser.find_elements("css selector", "#dense-result tbody tr")
    texts = [r.find_element("css selector", "td").text for r in rows]
    dense = httpx.post(
        f"{default_server}/score/dense", json={"image": _data(EXAMPLES / "scene.png"), "texts": texts}, timeout=WAIT_S
    ).json()
    assert "best" in rows[dense["best"]].get_attribute("class")
    assert [r.find_element("css selector", "td.functional").text for r in rows] == [
        ", ".join(words) or "—" for words in dense["functional_words"]
    ]
    assert _find(browser, "#heatmap-text").text == texts[dense["best"]]
    png = httpx.post(
        f"{default_server}/score/dense/heatmap",
        json={"image": _data(EXAMPLES / "scene.png"), "text": texts[dense["best"]]},
        timeout=WAIT_S,
    ).content
    with Image.open(io.BytesIO(png)) as expected:
        drawn = browser.execute_script(
            "const i = document.getElementById('heatmap-image'); return [i.naturalWidth, i.naturalHeight];"
        )
        assert tuple(drawn) == expected.size

    # Classification with and without comparative prompting, on the preset red circle.
    _wait(browser, lambda d: _find(d, "#classify-image .file-name").text == "red.png", "the example red circle")
    _find(browser, "#classify-run").click()
    _visible(browser, "#classify-comparative")
    for column in ("#classify-standard", "#classify-comparative"):
        assert _find(browser, f"{column} .bar").get_attribute("data-label") == "red circle"
    assert _find(browser, "#classify-comparative .comparative-info").text

    # An API error is shown as the API says it: one label is a 400 bad_input on `labels`.
    labels = _find(browser, "#classify-labels")
    labels.clear()
    labels.send_keys("circle")
    _find(browser, "#classify-run").click()
    _visible(browser, "#classify-error")
    refused = httpx.post(
        f"{default_server}/classify", json={"images": [_data(EXAMPLES / "red.png")], "labels": ["circle"]}
    ).json()["error"]
    error_text = _find(browser, "#classify-error").text
    assert refused["code"] in error_text and refused["message"] in error_text and refused["field"] in error_text
    labels.clear()
    labels.send_keys("circle\nsquare\ntriangle")
    _find(browser, "#classify-run").click()
    _visible(browser, "#classify-standard")

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

    # The whole page (beyond the window), kept as an artefact.
    browser.execute_script("window.scrollTo(0, 0);")
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = tmp_path / "playground.png"
    capture = browser.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})
    shot.write_bytes(base64.b64decode(capture["data"]))
    target = os.environ.get("CLIP_PLAYGROUND_SCREENSHOT")
    if target:
        shutil.copyfile(shot, target)
        shot = Path(target)
    print(f"playground screenshot: {shot}")
    with Image.open(shot) as im:
        assert im.size[0] >= 1000
    assert _violations(browser) == []


def test_the_page_asks_for_a_key_and_sends_it_as_the_api_expects(
    serve_app: Any, tiny_store: Path, browser: Any
) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", api_keys=["sesame"]) as running:
        browser.get(f"{running.url}/")
        browser.execute_script("sessionStorage.clear();")
        browser.refresh()
        _visible(browser, "#key-form")  # /models answered 401
        assert "unauthorized" in _find(browser, "#models-error").text
        _find(browser, "#key-input").send_keys("wrong")
        _find(browser, "#key-form button").click()
        _wait(browser, lambda d: "forbidden" in _find(d, "#models-error").text, "the API's 403")
        _visible(browser, "#key-form")
        key = _find(browser, "#key-input")
        key.clear()
        key.send_keys("sesame")
        _find(browser, "#key-form button").click()
        _wait(browser, lambda d: "tiny@v1" in _find(d, "#model-status").text, "the model through the key")
        assert not _find(browser, "#models-error").is_displayed()
        assert not _find(browser, "#model-picker").is_displayed()  # one model: nothing to pick
        # Drag-and-drop: a file dropped on image A's box replaces the example there.
        _drop(browser, "pair-a", EXAMPLES / "large.png", "dropped.png")
        _wait(browser, lambda d: _find(d, "#pair-a .file-name").text == "dropped.png", "the dropped file")
        _find(browser, "#pair-run").click()
        _visible(browser, "#pair-result")
        assert _find(browser, "#pair-answer").text in ("a", "b")


def test_the_page_picks_a_model_of_the_served_set(
    serve_app: Any, publish_model: Any, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.support.ui import Select

    root = tmp_path / "store"
    publish_model(root, "tiny", seed=0)
    publish_model(root, "other", seed=3)
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
            _find(browser, "#pair-run").click()
            _wait(browser, lambda d, m=model: _find(d, "#pair-model").text == f"answered by {m}", f"{model}'s answer")
            body = {**pair, "difference": difference, **({"model": choice} if choice else {})}
            api = httpx.post(f"{running.url}/rank-pair", json=body, timeout=WAIT_S).json()
            assert api["model"] == model
            assert float(_find(browser, "#pair-score").text) == pytest.approx(api["score"], abs=1e-4)
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
