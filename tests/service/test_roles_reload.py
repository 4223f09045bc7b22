"""An entry's canary and shadow load with it: after every reload under a memory budget a caller the
alias routes to the canary is answered by the canary, never by the primary; a pinned version the
alias serves is served whether or not its entry is loaded. Real servers on tmp stores, tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_samples import metric_value

from model_store import ModelStore
from model_store.routing import route

TEXTS = ["a red circle"]
UNEVALUATED = "random weights, never evaluated"
RELOADS = 20


def _answer(client: httpx.Client, model: str, key: str | None = None) -> str:
    headers = {"X-Canary-Key": key} if key is not None else {}
    r = client.post("/embed", json={"texts": TEXTS, "model": model}, headers=headers)
    assert r.status_code == 200, r.text
    return str(r.json()["model"])


def _store(root: Path, publish_model: Any) -> dict[str, str]:
    """alpha@v1; beta@v1 (production) with the canary v2 at 50 % and the shadow v2; gamma@v1.
    Returns a caller key routed to each of beta's versions."""
    publish_model(root, "alpha", seed=81)
    publish_model(root, "beta", seed=82)
    publish_model(root, "beta", seed=83, aliases=())  # v2
    publish_model(root, "gamma", seed=84)
    store = ModelStore(root)
    store.canary("beta", "production", "v2", 50, force=True, reason=UNEVALUATED)
    store.shadow("beta", "production", "v2", fraction=1.0)
    entry = store.alias_entry("beta", "production")
    assert entry is not None
    return {route(entry, key): key for key in (f"caller-{i}" for i in range(64))}


def test_canary_callers_stay_on_the_canary_across_reloads(tmp_path: Path, serve_app: Any, publish_model: Any) -> None:
    root = tmp_path / "store"
    key_of = _store(root, publish_model)
    # alpha (1 version) and beta (primary and canary, its shadow the canary's version) fill the
    # budget: each request for gamma unloads beta, each request for beta unloads gamma. The alias
    # is read again only after the test: the canary must come with each load, not with a poll.
    settings = {"max_loaded_models": 3, "max_loads_per_minute": 0, "watch_interval_s": 600.0,
                "batching": {"request_timeout_s": 60.0}}  # fmt: skip
    answers: list[tuple[str, str]] = []  # (the caller's version by the alias, the version that answered)
    with serve_app(store=str(root), model="alpha,beta@production,gamma", **settings) as running:
        url = running.url
        with httpx.Client(base_url=url, timeout=120) as client:
            # A gamma request unloads beta once beta is idle (its shadow runs end); count the
            # reloads rather than assume each round makes one.
            for _ in range(3 * RELOADS):
                assert _answer(client, "gamma") == "gamma@v1"
                for version, key in key_of.items():
                    answers.append((f"beta@{version}", _answer(client, "beta", key)))
                if metric_value(url, "clip_model_loads_total", model="beta@production") > RELOADS:
                    break
            loads = metric_value(url, "clip_model_loads_total", model="beta@production")
            side_loads = metric_value(url, "clip_side_loads_total", model="beta@production", role="canary", result="ok")
    misrouted = [(want, got) for want, got in answers if want != got]
    assert misrouted == [] and len(answers) >= 2 * RELOADS
    assert loads > RELOADS and side_loads == loads, (loads, side_loads)  # the canary came with every load


def test_a_pinned_version_the_alias_serves_is_served_after_its_entry_was_unloaded(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    root = tmp_path / "store"
    key_of = _store(root, publish_model)
    settings = {"max_loaded_models": 3, "max_loads_per_minute": 0, "watch_interval_s": 600.0,
                "batching": {"request_timeout_s": 60.0}}  # fmt: skip
    with serve_app(store=str(root), model="alpha,beta@production,gamma", **settings) as running:
        url = running.url
        with httpx.Client(base_url=url, timeout=120) as client:
            assert _answer(client, "beta", key_of["v1"]) == "beta@v1"
            for pinned in ("beta@v1", "beta@v2"):
                assert _answer(client, "gamma") == "gamma@v1"  # beta unloaded
                states = {m["ref"]: m["state"] for m in client.get("/models").json()["served"]}
                assert states["beta@production"] == "unloaded"
                # The version the alias named is loaded again for it, whatever the caller's key.
                assert _answer(client, pinned, key_of["v1"]) == pinned
            r = client.post("/embed", json={"texts": TEXTS, "model": "beta@v3"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"


def test_a_pinned_version_the_alias_serves_is_served_before_its_entry_ever_loaded(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    """An entry that loads on request has not loaded when the first request pins its alias'
    version: the alias read at start says the version belongs to it."""
    root = tmp_path / "store"
    publish_model(root, "alpha", seed=91)
    publish_model(root, "gamma", seed=94)
    publish_model(root, "beta", seed=92)  # v1, production
    publish_model(root, "beta", seed=93, aliases=())  # v2, named by no alias
    settings = {"max_loaded_models": 2, "max_loads_per_minute": 0, "watch_interval_s": 600.0,
                "batching": {"request_timeout_s": 60.0}}  # fmt: skip
    with serve_app(store=str(root), model="alpha,gamma,beta@production", **settings) as running:
        with httpx.Client(base_url=running.url, timeout=120) as client:
            states = {m["ref"]: m["state"] for m in client.get("/models").json()["served"]}
            assert states["beta@production"] == "unloaded"  # never loaded yet
            assert _answer(client, "beta@v1") == "beta@v1"
            r = client.post("/embed", json={"texts": TEXTS, "model": "beta@v2"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"
