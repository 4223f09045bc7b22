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

from pathlib import Path
from typing import Any

import httpx
import pytest
from playground_page import (  # noqa: F401 (the fixtures)
    EXAMPLES,
    PHONE_SCALE,
    STORE,
    WAIT_S,
    browser_fixture,
    check_heatmap,
    count_requests,
    csp_violations,
    default_server_fixture,
    drop_file,
    find,
    image_data,
    keep_screenshot,
    overflow_px,
    page_browser,
    requests_sent,
    set_viewport,
    upload,
    wait_for,
    wait_visible,
)

pytestmark = pytest.mark.slow


def test_the_page_ranks_a_pair_scores_densely_and_shows_api_errors(
    default_server: str, browser: Any, tmp_path: Path
) -> None:
    set_viewport(browser, 1400)
    browser.get(f"{default_server}/")
    serving = httpx.get(f"{default_server}/models").json()["serving"]
    wait_for(browser, lambda d: serving in find(d, "#model-status").text, "the serving model version")
    assert "pcclip" in find(browser, "#encoders-status").text  # the text encoders from /models
    assert not find(browser, "#key-form").is_displayed()  # this server has no keys
    assert not browser.find_elements("css selector", ".unavailable:not([hidden])")  # it has DCSM and YUKINO
    # The preset examples load first, so that they cannot replace the uploads below.
    wait_for(
        browser,
        lambda d: all(e.text for e in d.find_elements("css selector", "#scoring-tab .slot .file-name")),
        "the examples",
    )

    # Pair ranking: two uploaded files (the smaller circle as image A), "which is larger?".
    small, big = EXAMPLES / "small_circle.png", EXAMPLES / "big_circle.png"
    upload(browser, "pair-a", small)
    upload(browser, "pair-b", big)
    find(browser, "#pair-run").click()
    wait_visible(browser, "#pair-result")
    shown_first = find(browser, "#pair-answer").text
    shown_score = float(find(browser, "#pair-score").text)
    difference = find(browser, "#pair-text").get_attribute("value")
    api = httpx.post(
        f"{default_server}/rank-pair",
        json={"image_a": image_data(small), "image_b": image_data(big), "difference": difference},
        timeout=WAIT_S,
    ).json()
    assert shown_first == api["first"] == "b"  # the page says what the API says, and it is right
    assert shown_score == pytest.approx(api["score"], abs=1e-4)

    # Dense scoring of the preset scene: the table, then the map of the best caption, drawn from the
    # maps the API returns.
    wait_for(browser, lambda d: find(d, "#dense-image .file-name").text == "scene.png", "the example scene")
    find(browser, "#dense-run").click()
    wait_visible(browser, "#heatmap-result")
    rows = browser.find_elements("css selector", "#dense-result tbody tr")
    texts = [r.find_element("css selector", "td").text for r in rows]
    dense = httpx.post(
        f"{default_server}/score/dense",
        json={"image": image_data(EXAMPLES / "scene.png"), "texts": texts, "return_maps": True},
        timeout=WAIT_S,
    ).json()
    best = dense["best"]
    assert "best" in rows[best].get_attribute("class")
    assert [r.find_element("css selector", "td.functional").text for r in rows] == [
        ", ".join(words) or "—" for words in dense["functional_words"]
    ]
    assert find(browser, "#heatmap-text").text == texts[best]
    # At 1400 px the map takes the panel's width: most of the window.
    desktop = check_heatmap(browser, dense, best, min_width=900)
    # Zoomed in, it grows and scrolls inside its box; the page does not.
    find(browser, "#zoom-in").click()
    zoomed = browser.execute_script("return document.getElementById('heatmap-canvas').getBoundingClientRect().width")
    assert zoomed > desktop["map"]["width"] * 1.3 and overflow_px(browser) == 0
    find(browser, "#zoom-fit").click()
    # Pointing at a cell names its token, its patch and its value; another caption's map on request.
    canvas = find(browser, "#heatmap-canvas")
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element_with_offset(canvas, 0, 0).perform()  # the centre: a patch
    readout = find(browser, "#heatmap-readout").text
    assert (
        readout.startswith("“") and "patch row" in readout and "over the image" in find(browser, "#token-caption").text
    )
    other = (best + 1) % len(texts)
    rows[other].find_element("css selector", ".heatmap-button").click()
    wait_for(browser, lambda d: find(d, "#heatmap-text").text == texts[other], "the other caption's map")
    check_heatmap(browser, dense, other, min_width=900)
    rows[best].find_element("css selector", ".heatmap-button").click()

    # Classification with and without comparative prompting, on the preset red circle: the pairs
    # the comparatives applied to fit one line, their list folded.
    wait_for(browser, lambda d: find(d, "#classify-image .file-name").text == "red.png", "the example red circle")
    find(browser, "#classify-run").click()
    wait_visible(browser, "#classify-comparative")
    for column in ("#classify-standard", "#classify-comparative"):
        assert find(browser, f"{column} .bar").get_attribute("data-label") == "red circle"
    info = find(browser, "#classify-comparative .comparative-info")
    assert info.text.startswith("Applied") and info.size["height"] < 30
    pairs = find(browser, "#classify-comparative .pairs")
    assert "label pair" in pairs.text and not pairs.get_attribute("open")
    pairs.find_element("css selector", "summary").click()
    chips = pairs.find_elements("css selector", "li")
    assert chips and all(" ↔ " in chip.text for chip in chips)

    # YUKINO matching of the preset scene's captions.
    find(browser, "#yukino-run").click()
    wait_visible(browser, "#yukino-result")
    captions = find(browser, "#yukino-texts").get_attribute("value").splitlines()
    yukino = httpx.post(
        f"{default_server}/classify",
        json={
            "images": [image_data(EXAMPLES / "scene.png")],
            "labels": captions,
            "templates": ["{}"],
            "method": "yukino",
        },
        timeout=WAIT_S,
    ).json()
    assert find(browser, "#yukino-result .bar").get_attribute("data-label") == yukino["results"][0]["label"]

    # Every answer on the page at 1400 px, nothing wider than the window; then at a phone's width,
    # where the map still fits and its labels stay legible.
    pairs.find_element("css selector", "summary").click()
    assert overflow_px(browser) == 0
    keep_screenshot(browser, tmp_path, "playground.png", 1400)
    set_viewport(browser, 390, PHONE_SCALE)
    assert overflow_px(browser) == 0
    wait_for(browser, lambda d: find(d, "#heatmap-canvas").size["width"] < 390, "the map redrawn for the phone")
    check_heatmap(browser, dense, best, min_width=250)
    keep_screenshot(browser, tmp_path, "playground_phone.png", 390 * PHONE_SCALE, "#heatmap-result")
    set_viewport(browser, 1400)

    # Inputs are checked before anything is sent: one label is not a classification.
    count_requests(browser)
    labels = find(browser, "#classify-labels")
    labels.clear()
    labels.send_keys("circle")
    find(browser, "#classify-run").click()
    wait_visible(browser, "#classify-error")
    assert find(browser, "#classify-error").text == "Not sent: give at least 2 labels, one per line"
    assert "invalid" in labels.get_attribute("class") and requests_sent(browser) == []
    assert not find(browser, "#classify-standard").is_displayed()  # the earlier answer went with it
    for box, value in (("#dense-texts", ""), ("#pair-text", " ")):
        field = find(browser, box)
        field.clear()
        field.send_keys(value)
    find(browser, "#dense-run").click()
    wait_for(browser, lambda d: "write a caption first" in find(d, "#dense-error").text, "the dense panel's check")
    find(browser, "#pair-run").click()
    wait_for(browser, lambda d: "write a difference text" in find(d, "#pair-error").text, "the pair panel's check")
    assert requests_sent(browser) == []

    # An API error is shown as the API says it, and nothing of the earlier answer stays beside it:
    # a file that is no image, after a good dense answer.
    find(browser, "#dense-texts").send_keys("a red circle\na blue square")
    find(browser, "#dense-run").click()
    wait_visible(browser, "#heatmap-result")
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"not a picture")
    upload(browser, "dense-image", notes)
    find(browser, "#dense-run").click()
    wait_visible(browser, "#dense-error")
    refused = httpx.post(
        f"{default_server}/score/dense", json={"image": image_data(notes), "texts": ["a red circle", "a blue square"]}
    ).json()["error"]
    error_text = find(browser, "#dense-error").text
    assert refused["code"] in error_text and refused["message"] in error_text and refused["field"] in error_text
    assert not find(browser, "#dense-result").is_displayed() and not find(browser, "#heatmap-result").is_displayed()
    assert csp_violations(browser) == []


PANELS = ("pair", "classify", "yukino", "dense")


def _reason(driver: Any, panel: str) -> str | None:
    """The reason the panel gives for being unusable (None when it is usable), and its button's state."""
    note = find(driver, f"#{panel}-panel .unavailable")
    disabled = find(driver, f"#{panel}-run").get_attribute("disabled") is not None
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
        wait_visible(browser, "#key-form")  # /models answered 401
        assert "unauthorized" in find(browser, "#models-error").text
        # The "API key needed" state: the header says so, every panel waits for the key.
        assert find(browser, "#model-status").text == "API key needed"
        set_viewport(browser, 390)  # the key form fits a phone too
        assert overflow_px(browser) == 0 and find(browser, "#key-input").size["width"] >= 150
        set_viewport(browser, 1400)
        for panel in PANELS:
            assert _reason(browser, panel) == "API key needed: enter the server's key above.", panel
        # So does the Collections tab (hidden: its text is read as the DOM holds it).
        note = find(browser, "#collections-panel .unavailable").get_attribute("textContent")
        assert note == "API key needed: enter the server's key above."
        for button in ("collection-create-run", "collection-add-run", "collection-search-run"):
            assert find(browser, f"#{button}").get_attribute("disabled") is not None, button
        find(browser, "#key-input").send_keys("wrong")
        find(browser, "#key-form button").click()
        wait_for(browser, lambda d: "forbidden" in find(d, "#models-error").text, "the API's 403")
        wait_visible(browser, "#key-form")
        assert "refused" in find(browser, "#key-message").text and _reason(browser, "pair")
        key = find(browser, "#key-input")
        key.clear()
        key.send_keys("sesame")
        find(browser, "#key-form button").click()
        wait_for(browser, lambda d: "tiny@v1" in find(d, "#model-status").text, "the model through the key")
        assert not find(browser, "#models-error").is_displayed()
        assert not find(browser, "#model-picker").is_displayed()  # one model: nothing to pick
        # The collections list came with the key (GET /collections): this server has none yet.
        select = "#collection-select"
        wait_for(browser, lambda d: "none yet" in find(d, select).get_attribute("textContent"), "the collections")
        assert find(browser, "#collection-search-run").get_attribute("disabled") is None
        # The panels of the components tiny@v1 lacks are disabled, and say why; the others are not.
        assert _reason(browser, "pair") is None and _reason(browser, "classify") is None
        for panel, component in (("dense", "dcsm"), ("yukino", "yukino")):
            reason = _reason(browser, panel)
            assert reason and reason.startswith(f"tiny@v1 has no '{component}' component"), reason
        assert "components: none" in find(browser, "#encoders-status").text
        # The limits the server publishes are checked before sending: the 4 preset labels are too many.
        wait_for(browser, lambda d: d.execute_script("return limits !== null;"), "GET /limits")
        count_requests(browser)
        find(browser, "#classify-run").click()
        wait_visible(browser, "#classify-error")
        assert find(browser, "#classify-error").text == "Not sent: this server takes at most 3 labels (4 given)"
        # A box without an image (as when its example could not be fetched) is named, not sent.
        browser.execute_script("slots['pair-b'].data = null;")
        find(browser, "#pair-run").click()
        wait_for(browser, lambda d: find(d, "#pair-error").text.startswith("Not sent"), "the pair panel's check")
        assert find(browser, "#pair-error").text == "Not sent: choose an image for “Image B” first"
        assert "invalid" in find(browser, "#pair-b").get_attribute("class")
        assert requests_sent(browser) == []
        upload(browser, "pair-b", EXAMPLES / "small.png")
        # Drag-and-drop: a file dropped on image A's box replaces the example there.
        drop_file(browser, "pair-a", EXAMPLES / "large.png", "dropped.png")
        wait_for(browser, lambda d: find(d, "#pair-a .file-name").text == "dropped.png", "the dropped file")
        find(browser, "#pair-run").click()
        wait_visible(browser, "#pair-result")
        assert find(browser, "#pair-answer").text in ("a", "b")
        assert requests_sent(browser) == ["rank-pair"]


def test_the_page_picks_a_model_of_the_served_set(
    serve_app: Any, publish_model: Any, publish_dense_model: Any, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.support.ui import Select

    root = tmp_path / "store"
    publish_model(root, "tiny", seed=0)
    publish_dense_model(root, "other", seed=3)  # with a DCSM scorer, which tiny lacks
    with serve_app(store=str(root), model="tiny,other@production") as running:
        browser.get(f"{running.url}/")
        wait_for(browser, lambda d: "tiny@v1" in find(d, "#model-status").text, "the default model")
        picker = find(browser, "#model-picker")
        assert picker.is_displayed()
        options = find(browser, "#model-select").find_elements("css selector", "option")
        assert [o.text for o in options] == ["tiny · tiny@v1 (default)", "other@production · other@v1"]
        wait_for(browser, lambda d: find(d, "#pair-b .file-name").text, "the examples")
        difference = find(browser, "#pair-text").get_attribute("value")
        pair = {
            "image_a": image_data(EXAMPLES / "big_circle.png"),
            "image_b": image_data(EXAMPLES / "small_circle.png"),
        }
        for choice, model in (("other@production", "other@v1"), ("", "tiny@v1")):
            Select(find(browser, "#model-select")).select_by_value(choice)
            wait_for(browser, lambda d, m=model: m in find(d, "#model-status").text, f"{model} in the header")
            # The dense panel follows the picked model's components.
            reason = _reason(browser, "dense")
            assert reason is None if model == "other@v1" else reason and "has no 'dcsm' component" in reason
            find(browser, "#pair-run").click()
            wait_for(browser, lambda d, m=model: find(d, "#pair-model").text == f"answered by {m}", f"{model}'s answer")
            body = {**pair, "difference": difference, **({"model": choice} if choice else {})}
            api = httpx.post(f"{running.url}/rank-pair", json=body, timeout=WAIT_S).json()
            assert api["model"] == model
            assert float(find(browser, "#pair-score").text) == pytest.approx(api["score"], abs=1e-4)
            if model == "other@v1":  # its dense map, on its own patch grid
                find(browser, "#dense-run").click()
                wait_visible(browser, "#heatmap-result")
                texts = find(browser, "#dense-texts").get_attribute("value").splitlines()
                body = {
                    "image": image_data(EXAMPLES / "scene.png"),
                    "texts": texts,
                    "return_maps": True,
                    "model": choice,
                }
                dense = httpx.post(f"{running.url}/score/dense", json=body, timeout=WAIT_S).json()
                check_heatmap(browser, dense, dense["best"], min_width=900)
        assert not find(browser, "#heatmap-result").is_displayed()  # tiny@v1 cannot have drawn it
        assert csp_violations(browser) == []


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
        wait_for(browser, lambda d: len(d.find_elements("css selector", ".opblock")) >= 10, "Swagger UI's operations")
        text = browser.find_element("css selector", "#swagger-ui").text
        assert "Unable to render" not in text and "/embed" in text and "/rank-pair" in text
        assert csp_violations(browser) == [] and _resources_off_host(browser, host) == []
        # ReDoc: styled by the styles it writes, searching in its blob: worker.
        browser.get(f"{running.url}/redoc")
        operations = "[data-section-id*='operation/']"
        wait_for(browser, lambda d: len(d.find_elements("css selector", operations)) >= 5, "ReDoc's operations")
        padding = browser.execute_script(f'return getComputedStyle(document.querySelector("{operations}")).paddingTop')
        assert padding != "0px"  # its own styles apply
        browser.find_element("css selector", "input[placeholder='Search...']").send_keys("embed")
        wait_for(
            browser, lambda d: d.find_elements("css selector", "[data-role='search:results'] li"), "ReDoc's search"
        )
        assert len(browser.find_elements("css selector", operations)) >= 10
        assert csp_violations(browser) == [] and _resources_off_host(browser, host) == []


def test_the_page_shows_what_the_library_was_measured_to_do(serve_app: Any, tmp_path: Path, browser: Any) -> None:
    """The comparative column says the library's measured effect (the version's eval.json), as the
    API's answer gives it, so a reader does not take the column for a gain the data never showed."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from measured_model import FIGURES, publish_measured

    root = tmp_path / "store"
    publish_measured(root, "measured")
    with serve_app(store=str(root), model="measured@production") as running:
        set_viewport(browser, 1400)
        browser.get(f"{running.url}/")
        wait_for(browser, lambda d: find(d, "#classify-image .file-name").text == "red.png", "the example red circle")
        find(browser, "#classify-run").click()
        wait_visible(browser, "#classify-comparative .measured")
        shown = find(browser, "#classify-comparative .measured").text
        assert shown == ("Measured on shapes-test (these labels, 3 seeds): accuracy 0.500 → 0.520 with comparatives, "
                         "+2.0 ± 0.5 points: a gain.")  # fmt: skip
        assert FIGURES["gain.zeroshot_comparative.acc"] > 2 * FIGURES["gain.zeroshot_comparative.acc.stderr"]
        # Comparatives of the request's own: nothing was measured of them, and the line goes.
        find(browser, "#classify-comparatives").send_keys("blue square | green triangle | the first has corners")
        find(browser, "#classify-run").click()
        info = "#classify-comparative .comparative-info"
        wait_for(browser, lambda d: find(d, info).text.startswith("Applied · request"), "the request's comparatives")
        assert not find(browser, "#classify-comparative .measured").is_displayed()
        assert overflow_px(browser) == 0 and csp_violations(browser) == []
