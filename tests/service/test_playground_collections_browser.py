"""The playground's Collections tab in a real headless Chromium against the real service on the
default model: it creates a collection, adds images picked several at once with their metadata,
searches by text with the dense re-rank and by an image and a difference, and shows the API's own
hits in the grid (thumbnail, id, score, stage, version) page by page; a click on a hit draws the
DCSM map of the search text over its image. Inputs are checked before sending, API errors are
shown as the API words them, and a hit added elsewhere shows its id and says why it has no map. A
collection on a version without DCSM offers no dense re-rank, and says why.
With ``CLIP_UPDATE_SCREENSHOTS=1`` it writes docs/images/playground_collections.png (1400 px).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from playground_page import (  # noqa: F401 (the fixtures)
    EXAMPLES,
    STORE,
    WAIT_S,
    browser_fixture,
    check_heatmap,
    count_requests,
    csp_violations,
    default_server_fixture,
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

PICTURES = ["scene.png", "red.png", "blue.png", "big_circle.png", "small_circle.png"]
# One object per file name: metadata for two of them, the others get none.
METADATA = {"scene.png": {"kind": "scene", "sale": True}, "red.png": {"kind": "single", "sale": True}}
QUERY = "a red circle to the left of a blue square"


def _cards(driver: Any) -> list[dict[str, Any]]:
    """The grid as the user sees it: each hit's id, its lines of text and its thumbnail."""
    found: list[dict[str, Any]] = driver.execute_script(
        """return [...document.querySelectorAll("#hit-grid .hit")].map((n) => {
          const img = n.querySelector("img.hit-thumb");
          return {id: n.dataset.id, text: n.innerText.split("\\n"), shown: n.checkVisibility(),
                  thumb: img ? {src: img.src.slice(0, 11), width: img.naturalWidth, box: img.clientWidth} : null};
        });"""
    )
    return found


def _search(url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{url}/collections/shapes/search", json=body, timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def _same_hits(driver: Any, api: dict[str, Any], first_rank: int) -> None:
    """The page's grid shows the API's hits in its order, each with its score, stage and version."""
    cards = _cards(driver)
    assert [c["id"] for c in cards] == [h["id"] for h in api["hits"]]
    for rank, (card, hit) in enumerate(zip(cards, api["hits"], strict=True), first_rank):
        assert card["shown"], card
        name, score, version = card["text"][-3:]
        assert name == f"{rank}. {hit['id']}"
        stage, value = score.split(" · ")[0].split(" ")
        assert stage == hit["stage"] and float(value) == pytest.approx(hit["scores"][hit["stage"]], abs=1e-3)
        assert version == api["model"]


def test_the_collections_tab_adds_searches_pages_and_maps_a_hit(
    default_server: str, browser: Any, tmp_path: Path
) -> None:
    url = default_server
    serving = httpx.get(f"{url}/models").json()["serving"]
    set_viewport(browser, 1400)
    browser.get(f"{url}/#collections")
    wait_visible(browser, "#collections-tab")
    assert not find(browser, "#scoring-tab").is_displayed()
    assert find(browser, "#tab-collections").get_attribute("aria-selected") == "true"
    wait_for(browser, lambda d: "none yet" in find(d, "#collection-select").text, "the empty list of collections")

    # A name the API would refuse is not sent; a good one creates the collection on the served model.
    count_requests(browser)
    find(browser, "#collection-name").send_keys("Shapes!")
    find(browser, "#collection-create-run").click()
    wait_for(browser, lambda d: find(d, "#collections-error").text.startswith("Not sent"), "the name check")
    assert "a-z, 0-9" in find(browser, "#collections-error").text and requests_sent(browser) == []
    assert "invalid" in find(browser, "#collection-name").get_attribute("class")
    find(browser, "#collection-name").clear()
    find(browser, "#collection-name").send_keys("shapes")
    find(browser, "#collection-create-run").click()
    wait_for(browser, lambda d: "0 items" in find(d, "#collection-info").text, "the new collection")
    info = httpx.get(f"{url}/collections/shapes").json()
    assert info["model"] == serving and info["dense"] and info["count"] == 0
    assert f"bound to {serving}" in find(browser, "#collection-info").text
    assert not find(browser, "#collections-error").is_displayed()

    # Five images picked at once, metadata for two of them by file name.
    find(browser, "#collection-files").send_keys("\n".join(str(EXAMPLES / name) for name in PICTURES))
    find(browser, "#collection-metadata").send_keys(json.dumps(METADATA))
    find(browser, "#collection-add-run").click()
    wait_for(browser, lambda d: "the collection holds 5" in find(d, "#collection-added").text, "the added images")
    wait_for(browser, lambda d: "5 items" in find(d, "#collection-info").text, "the count")
    assert httpx.get(f"{url}/collections/shapes").json()["count"] == 5
    on_sale = _search(url, {"text": QUERY, "filters": {"sale": True}})
    assert {h["id"]: h["metadata"] for h in on_sale["hits"]} == METADATA

    # A text search, re-ranked by DCSM, 3 hits a page: the API's hits, with the pictures added.
    find(browser, "#search-rerank").click()
    limit = find(browser, "#search-limit")
    limit.clear()
    limit.send_keys("3")
    find(browser, "#collection-search-run").click()
    wait_visible(browser, "#search-result")
    body = {"text": QUERY, "rerank": "dense", "limit": 3}
    first = _search(url, body)
    assert [h["stage"] for h in first["hits"]] == ["dense"] * 3
    _same_hits(browser, first, 1)
    for card in _cards(browser):
        thumb = card["thumb"]
        assert thumb and thumb["src"] == "data:image/" and thumb["width"] > 0 and thumb["box"] >= 100, card
    assert f"answered by {serving}" in find(browser, "#search-summary").text
    assert find(browser, "#hit-click-hint").text.startswith("Click a hit for the DCSM token × patch map")
    assert find(browser, "#page-previous").get_attribute("disabled") is not None

    # Paging: the last two hits, then back.
    find(browser, "#page-next").click()
    wait_for(browser, lambda d: find(d, "#page-shown").text == "hits 4–5", "the second page")
    _same_hits(browser, _search(url, {**body, "offset": 3}), 4)
    assert find(browser, "#page-next").get_attribute("disabled") is not None  # 5 candidates, all shown
    find(browser, "#page-previous").click()
    wait_for(browser, lambda d: find(d, "#page-shown").text == "hits 1–3", "the first page again")

    # A click on the best hit: the map of the search text over its picture, as /score/dense draws it.
    best = first["hits"][0]["id"]
    find(browser, f'#hit-grid .hit[data-id="{best}"]').click()
    wait_visible(browser, "#hit-heatmap #heatmap-result")
    dense = httpx.post(
        f"{url}/score/dense",
        json={"image": image_data(EXAMPLES / best), "texts": [QUERY], "return_maps": True, "model": serving},
        timeout=WAIT_S,
    ).json()
    assert find(browser, "#heatmap-text").text == QUERY
    note = find(browser, "#hit-heatmap-note").text
    assert note.startswith(f"“{best}”: DCSM {dense['scores'][0]:.3f}")
    check_heatmap(browser, dense, 0, min_width=900)
    assert dense["scores"][0] == pytest.approx(first["hits"][0]["scores"]["dense"], abs=1e-3)
    assert overflow_px(browser) == 0
    keep_screenshot(browser, tmp_path, "playground_collections.png", 1400)
    set_viewport(browser, 390)  # a phone: the forms and the grid fit, the map zooms within its box
    assert overflow_px(browser) == 0 and find(browser, "#hit-grid .hit").size["width"] >= 120
    set_viewport(browser, 1400)

    # "Like this one, but smaller": the big circle and a difference text, ranked by PC-CLIP.
    from selenium.webdriver.support.ui import Select

    Select(find(browser, "#search-mode")).select_by_value("difference")
    assert find(browser, "#search-rerank").get_attribute("disabled") is not None  # text searches only
    assert not find(browser, "#search-text").is_displayed()
    upload(browser, "search-image", EXAMPLES / "big_circle.png")
    find(browser, "#collection-search-run").click()
    wait_visible(browser, "#search-result")
    assert not find(browser, "#heatmap-result").is_displayed()  # the earlier map went with its search
    difference = find(browser, "#search-difference").get_attribute("value")
    by_difference = _search(
        url, {"image": image_data(EXAMPLES / "big_circle.png"), "difference": difference, "limit": 3}
    )
    assert [h["stage"] for h in by_difference["hits"]] == ["difference"] * 3
    _same_hits(browser, by_difference, 1)
    assert "search by text" in find(browser, "#hit-click-hint").text
    find(browser, "#hit-grid .hit").click()
    wait_for(browser, lambda d: "search by text" in find(d, "#collections-error").text, "no map without a text")

    # An item added elsewhere: its id stands for the picture, and a click says why there is no map.
    added = httpx.post(
        f"{url}/collections/shapes/images",
        json={"items": [{"id": "elsewhere", "image": image_data(EXAMPLES / "red.png"), "metadata": {"kind": "api"}}]},
        timeout=WAIT_S,
    )
    assert added.status_code == 200, added.text
    Select(find(browser, "#search-mode")).select_by_value("text")
    find(browser, "#search-filters").send_keys('{"kind": "api"}')
    find(browser, "#collection-search-run").click()
    wait_for(browser, lambda d: [c["id"] for c in _cards(d)] == ["elsewhere"], "the item added elsewhere")
    card = _cards(browser)[0]
    assert card["thumb"] is None and card["text"][0] == "elsewhere"
    find(browser, "#hit-grid .hit").click()
    wait_for(browser, lambda d: "no way to fetch a stored image" in find(d, "#collections-error").text, "why no map")

    # Checked before sending: a filter that is no JSON object; then the API's own error, and the
    # earlier hits go with it.
    count_requests(browser)
    filters = find(browser, "#search-filters")
    filters.clear()
    filters.send_keys('["kind"]')
    find(browser, "#collection-search-run").click()
    wait_for(browser, lambda d: find(d, "#collections-error").text.startswith("Not sent"), "the filter check")
    assert "one JSON object" in find(browser, "#collections-error").text and requests_sent(browser) == []
    assert not find(browser, "#search-result").is_displayed()
    filters.clear()
    filters.send_keys('{"no-such key": 1}')
    find(browser, "#collection-search-run").click()
    wait_visible(browser, "#collections-error")
    refused = httpx.post(
        f"{url}/collections/shapes/search", json={"text": QUERY, "filters": {"no-such key": 1}}, timeout=WAIT_S
    ).json()["error"]
    shown = find(browser, "#collections-error").text
    assert refused["code"] in shown and refused["message"] in shown and refused["field"] in shown
    assert not find(browser, "#search-result").is_displayed()

    # The scoring tab is one click away, and the collections tab keeps what it had.
    find(browser, "#tab-scoring").click()
    wait_visible(browser, "#scoring-tab")
    assert not find(browser, "#collections-tab").is_displayed()
    assert csp_violations(browser) == []


def test_a_collection_without_dcsm_features_offers_no_dense_rerank(
    serve_app: Any, tiny_store: Path, browser: Any
) -> None:
    # tiny@v1 has no DCSM scorer: its collections keep no DCSM features, so nothing to re-rank with.
    with serve_app(store=str(tiny_store), model="tiny@production") as running:
        assert httpx.put(f"{running.url}/collections/plain", json={}).status_code == 201
        browser.get(f"{running.url}/#collections")
        wait_for(browser, lambda d: "no DCSM features" in find(d, "#collection-info").text, "the collection's info")
        assert "bound to tiny@v1" in find(browser, "#collection-info").text
        rerank = find(browser, "#search-rerank")
        assert rerank.get_attribute("disabled") is not None and not rerank.is_selected()
        assert "has no DCSM scorer" in find(browser, "#search-rerank-label").get_attribute("title")
        # A text search still works, by cosine; the empty collection says so instead of a blank grid.
        find(browser, "#collection-search-run").click()
        wait_visible(browser, "#search-result")
        assert find(browser, "#hit-grid").text == "No hits: the collection is empty."
        assert csp_violations(browser) == []
