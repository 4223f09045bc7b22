"""A served set of several models in one process, with real servers on their own tmp stores.

``model="alpha,beta@production,beta@v1"`` serves three entries: requests pick one with their
``model`` field and every answer names the version that answered; each entry answers exactly what
a server of that version alone answers. A version one entry cannot load is refused (or retried)
by that entry alone while the others keep serving. Under ``max_loaded_models`` the models past the
budget load on their first request, unloading the least recently used model that is idle.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from polling import wait_until
from prometheus_samples import metric_value

from model_store import ModelStore

TEXTS = ["a red circle", "a blue square to the left of a green cross"]


def _embed(url: str, body: dict[str, Any], model: str | None = None) -> tuple[str, np.ndarray]:
    payload = body if model is None else {**body, "model": model}
    r = httpx.post(f"{url}/embed", json=payload, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    return answer["model"], np.asarray(answer["embeddings"], dtype=np.float32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture
def two_models(tmp_path: Path, publish_model: Any) -> Path:
    """alpha@v1 (production); beta@v1 and beta@v2 (production)."""
    root = tmp_path / "store"
    publish_model(root, "alpha", seed=21)
    publish_model(root, "beta", seed=22)
    publish_model(root, "beta", seed=23)  # v2 becomes production
    return root


@pytest.mark.slow
def test_each_request_is_answered_by_the_model_it_names_as_a_lone_server_would(
    two_models: Path, serve_app: Any, make_image: Any
) -> None:
    bodies = {"texts": {"texts": TEXTS}, "images": {"images": [make_image("circle", "red"), make_image("cross")]}}
    picks = {  # the request's model -> the version that must answer
        None: "alpha@v1",
        "alpha": "alpha@v1",
        "beta": "beta@v2",  # the first entry named beta: beta@production
        "beta@production": "beta@v2",
        "beta@v2": "beta@v2",  # the version beta@production serves
        "beta@v1": "beta@v1",  # the pinned entry
    }
    answers: dict[tuple[str, str], np.ndarray] = {}
    with serve_app(store=str(two_models), model="alpha,beta@production,beta@v1", probes_list_models=True) as running:
        for model, version in picks.items():
            for kind, body in bodies.items():
                answered, vectors = _embed(running.url, body, model)
                assert answered == version, (model, kind)
                answers[(version, kind)] = vectors
        served = httpx.get(f"{running.url}/models").json()["served"]
        ready = httpx.get(f"{running.url}/readyz").json()
        ids = [m["id"] for m in httpx.get(f"{running.url}/v1/models").json()["data"]]
        metrics = httpx.get(f"{running.url}/metrics").text
    assert [(m["ref"], m["serving"], m["state"], m["default"]) for m in served] == [
        ("alpha", "alpha@v1", "ready", True),
        ("beta@production", "beta@v2", "ready", False),
        ("beta@v1", "beta@v1", "ready", False),
    ]
    assert ready["ready"] and ready["model"] == "alpha@v1"
    assert [m["ref"] for m in ready["models"]] == ["alpha", "beta@production", "beta@v1"]
    assert ids == ["alpha", "alpha@v1", "beta", "beta@v2", "beta@v1"]  # each accepted by `model`
    assert 'clip_model_info{encoder="base",model="beta@v1",name="beta",version="v1"} 1.0' in metrics
    assert 'clip_model_info{encoder="base",model="beta@production",name="beta",version="v2"} 1.0' in metrics
    assert 'clip_batch_size_count{batcher="text-base",model="beta@v1"}' in metrics
    # Each version answers what a server of that version alone answers.
    for version in ("alpha@v1", "beta@v2", "beta@v1"):
        with serve_app(store=str(two_models), model=version) as alone:
            for kind, body in bodies.items():
                answered, vectors = _embed(alone.url, body)
                assert answered == version
                assert np.all(_cosines(vectors, answers[(version, kind)]) >= 0.99999), (version, kind)
    # The three versions differ: the routing, not the cache, picked them.
    assert np.all(_cosines(answers[("beta@v1", "texts")], answers[("beta@v2", "texts")]) < 0.999)
    assert np.all(_cosines(answers[("alpha@v1", "texts")], answers[("beta@v1", "texts")]) < 0.999)


def _load(url: str, model: str, body: dict[str, Any], stop: threading.Event, seen: list[tuple[int, str]]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            r = client.post("/classify", json={**body, "model": model})
            seen.append((r.status_code, r.json().get("model", r.text)))


@pytest.mark.slow
def test_a_version_one_model_cannot_load_leaves_the_others_serving(
    tmp_path: Path, serve_app: Any, publish_model: Any, make_image: Any
) -> None:
    root = tmp_path / "store"
    for seed, name in enumerate(("alpha", "beta", "gamma"), start=31):
        publish_model(root, name, seed=seed)
    body = {"images": [make_image("square", "blue")], "labels": ["red circle", "blue square"]}
    seen: dict[str, list[tuple[int, str]]] = {"alpha": [], "beta": [], "gamma": []}
    stop = threading.Event()
    with serve_app(store=str(root), model="alpha,beta,gamma@production", watch_interval_s=0.2) as running:
        clients = [
            threading.Thread(target=_load, args=(running.url, model, body, stop, seen[model]))
            for model in ("alpha", "beta", "gamma", "alpha", "gamma")
        ]
        for client in clients:
            client.start()
        store = ModelStore(root)
        store.verify = lambda *_: None  # type: ignore[method-assign]  # promote would catch both; the server must
        # alpha@v2: bit rot after publishing (refused); beta@v2: its weights unreadable (retried).
        version = publish_model(root, "alpha", seed=41, aliases=())
        weights = store.version_dir("alpha", version) / "model.safetensors"
        raw = bytearray(weights.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        weights.write_bytes(bytes(raw))
        store.promote("alpha", "production", version, force=True, reason="random weights, never evaluated")
        version = publish_model(root, "beta", seed=42, aliases=())
        weights = store.version_dir("beta", version) / "model.safetensors"
        weights.unlink()
        weights.mkdir()
        store.promote("beta", "production", version, force=True, reason="random weights, never evaluated")
        wait_until(lambda: metric_value(running.url, "clip_model_swaps_total", model="alpha", result="refused") >= 1)
        wait_until(lambda: metric_value(running.url, "clip_model_swaps_total", model="beta", result="retrying") >= 2)
        time.sleep(0.5)  # more requests on every model after both failures
        stop.set()
        for client in clients:
            client.join(timeout=60)
        served = httpx.get(f"{running.url}/models").json()["served"]
        swaps = metric_value(running.url, "clip_model_swaps_total", result="ok")
        refused_gamma = metric_value(running.url, "clip_model_swaps_total", model="gamma@production")
    for model, version in (("alpha", "alpha@v1"), ("beta", "beta@v1"), ("gamma", "gamma@v1")):
        assert seen[model], model
        failed = [s for s in seen[model] if s[0] != 200]
        assert not failed, (model, failed[:3])
        assert {answered for _, answered in seen[model]} == {version}
    assert [(m["serving"], m["state"]) for m in served] == [
        ("alpha@v1", "ready"),
        ("beta@v1", "ready"),
        ("gamma@v1", "ready"),
    ]
    assert swaps == 0 and refused_gamma == 0


def test_an_unknown_model_is_a_404_that_lists_the_served_set(two_models: Path, serve_app: Any) -> None:
    with serve_app(store=str(two_models), model="alpha,beta@production,beta@v1", probes_list_models=True) as running:
        # Ready means the default entry serves; the others may still be loading (then "not loaded").
        wait_until(
            lambda: all(m["serving"] for m in httpx.get(f"{running.url}/readyz").json()["models"]),
            what="every entry of the set loaded",
        )
        for path, body in (
            ("/embed", {"texts": TEXTS, "model": "gamma"}),
            ("/embed", {"texts": TEXTS, "model": "alpha@staging"}),
            ("/embed", {"texts": TEXTS, "model": "beta@v3"}),
            ("/v1/embeddings", {"input": TEXTS, "model": "text-embedding-3-small"}),
        ):
            r = httpx.post(f"{running.url}{path}", json=body)
            assert r.status_code == 404, (path, body, r.text)
            error = r.json()["error"]
            assert error["code"] == "unknown_model" and error["field"] == "model"
            assert "alpha (alpha@v1), beta@production (beta@v2), beta@v1" in error["message"], error["message"]


@pytest.mark.slow
def test_v1_embeddings_route_by_their_model(two_models: Path, serve_app: Any) -> None:
    with serve_app(store=str(two_models), model="alpha,beta@production,beta@v1", probes_list_models=True) as running:
        vectors = {}
        for model, version in (("alpha", "alpha@v1"), ("beta", "beta@v2"), ("beta@v1", "beta@v1")):
            r = httpx.post(
                f"{running.url}/v1/embeddings", json={"model": model, "input": TEXTS, "encoding_format": "float"}
            )
            assert r.status_code == 200, r.text
            assert r.json()["model"] == version
            vectors[version] = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
            _, native = _embed(running.url, {"texts": TEXTS}, model)  # the same pipeline as /embed
            assert np.all(_cosines(vectors[version], native) >= 0.99999)
    assert np.all(_cosines(vectors["alpha@v1"], vectors["beta@v2"]) < 0.999)
    assert np.all(_cosines(vectors["beta@v1"], vectors["beta@v2"]) < 0.999)


def test_the_sdk_names_a_model_per_call_or_for_the_whole_client(
    two_models: Path, serve_app: Any, make_image: Any
) -> None:
    from clipdiff import Client

    images = [make_image("circle", "red", "large"), make_image("circle", "red", "small")]
    with serve_app(store=str(two_models), model="alpha,beta@production,beta@v1", probes_list_models=True) as running:
        with Client(running.url) as client:
            # The default is ready when the server is; the other entries load in the background.
            wait_until(lambda: all(m.state == "ready" for m in client.served_models()), what="every entry to load")
            assert [(m.ref, m.serving, m.state, m.default) for m in client.served_models()] == [
                ("alpha", "alpha@v1", "ready", True),
                ("beta@production", "beta@v2", "ready", False),
                ("beta@v1", "beta@v1", "ready", False),
            ]
            assert client.embed_texts(TEXTS).model == "alpha@v1"
            assert client.embed_texts(TEXTS, model="beta@v1").model == "beta@v1"
        with Client(running.url, model="beta") as client:
            assert client.rank(images, "The first shape is larger.").model == "beta@v2"
            assert client.rank_pair(*images, "The first shape is larger.", model="alpha").model == "alpha@v1"


def _states(url: str) -> dict[str, str]:
    return {m["ref"]: m["state"] for m in httpx.get(f"{url}/models").json()["served"]}


@pytest.mark.slow
def test_a_memory_budget_loads_on_request_and_unloads_the_idle_model(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    root = tmp_path / "store"
    for seed, name in enumerate(("alpha", "beta", "gamma"), start=51):
        publish_model(root, name, seed=seed)
    settings = {"max_loaded_models": 2, "batching": {"request_timeout_s": 5.0}}
    with serve_app(store=str(root), model="alpha,beta,gamma", **settings) as running:
        wait_until(lambda: _states(running.url)["beta"] == "ready", what="beta, within the budget, to load at start")
        assert _states(running.url) == {"alpha": "ready", "beta": "ready", "gamma": "unloaded"}
        beta = weakref.ref(running.services.models.entries[1].current.bundle.model)
        # A request for gamma loads it, unloading beta (idle; alpha, the default, never is).
        answered, _ = _embed(running.url, {"texts": TEXTS}, "gamma")
        assert answered == "gamma@v1"
        assert _states(running.url) == {"alpha": "ready", "beta": "unloaded", "gamma": "ready"}
        wait_until(lambda: gc.collect() >= 0 and beta() is None, what="beta's weights to be freed")
        assert metric_value(running.url, "clip_model_unloads_total", model="beta") == 1
        assert metric_value(running.url, "clip_model_loads_total", model="gamma") == 1
        # A model with a request in flight is never unloaded: a request for beta waits for room,
        # then gets a 503 with Retry-After when its time budget runs out.
        gamma = running.services.models.entries[2].current
        gamma.active += 1  # a request that has not finished (nothing else touches it meanwhile)
        gamma.idle.clear()
        r = httpx.post(f"{running.url}/embed", json={"texts": TEXTS, "model": "beta"}, timeout=30)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "not_ready" and int(r.headers["retry-after"]) >= 1
        assert "in flight" in r.json()["error"]["message"]
        assert _states(running.url) == {"alpha": "ready", "beta": "unloaded", "gamma": "ready"}
        # Once that request is done, beta loads in gamma's place.
        gamma.active -= 1
        gamma.idle.set()
        answered, _ = _embed(running.url, {"texts": TEXTS}, "beta")
        assert answered == "beta@v1"
        assert _states(running.url) == {"alpha": "ready", "beta": "ready", "gamma": "unloaded"}
        # Requests naming no model are still answered by the default model, never unloaded.
        assert _embed(running.url, {"texts": TEXTS})[0] == "alpha@v1"
        assert httpx.get(f"{running.url}/readyz").status_code == 200


@pytest.mark.slow
def test_the_least_recently_used_idle_model_is_the_one_unloaded(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    root = tmp_path / "store"
    names = ("alpha", "beta", "gamma", "delta")
    for seed, name in enumerate(names, start=61):
        publish_model(root, name, seed=seed)
    with serve_app(store=str(root), model=",".join(names), max_loaded_models=3) as running:
        wait_until(lambda: _states(running.url)["gamma"] == "ready", what="the first three models to load")
        for model in ("gamma", "beta", "gamma"):  # beta is now the least recently used
            _embed(running.url, {"texts": TEXTS}, model)
        assert _embed(running.url, {"texts": TEXTS}, "delta")[0] == "delta@v1"
        assert _states(running.url) == {"alpha": "ready", "beta": "unloaded", "gamma": "ready", "delta": "ready"}
        assert _embed(running.url, {"texts": TEXTS}, "beta")[0] == "beta@v1"  # gamma was used before delta
        assert _states(running.url) == {"alpha": "ready", "beta": "ready", "gamma": "unloaded", "delta": "ready"}


def _split(url: str, name: str) -> dict[str, Any]:
    """The canary and shadow of ``name`` this server follows: {"canary": {...}, "shadow": {...}}."""
    info = httpx.get(f"{url}/models/{name}", timeout=30).json()
    return {role: info.get(role) or {} for role in ("canary", "shadow")}


@pytest.mark.slow
def test_unloading_a_model_with_a_canary_and_a_shadow_frees_all_three_and_reloads_them(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    from model_store.routing import route

    root = tmp_path / "store"
    publish_model(root, "alpha", seed=71)
    publish_model(root, "beta", seed=72)  # v1, production
    publish_model(root, "beta", seed=73, aliases=())  # v2: the canary
    publish_model(root, "beta", seed=74, aliases=())  # v3: the shadow
    publish_model(root, "gamma", seed=75)
    store = ModelStore(root)
    store.canary("beta", "production", "v2", 50, force=True, reason="random weights, never evaluated")
    store.shadow("beta", "production", "v3", fraction=1.0)
    entry = store.alias_entry("beta", "production")
    assert entry is not None
    key_of = {route(entry, key): key for key in (f"caller-{i}" for i in range(64))}
    # The budget counts versions: alpha's and beta's three fill it; gamma loads in beta's place.
    settings = {"max_loaded_models": 4, "watch_interval_s": 0.2, "batching": {"request_timeout_s": 60.0}}
    with serve_app(store=str(root), model="alpha,beta@production,gamma", **settings) as running:
        url = running.url
        beta = running.services.models.entries[1]

        def split_loaded() -> bool:
            split = _split(url, "beta")
            return bool(split["canary"].get("loaded") and split["shadow"].get("loaded"))

        wait_until(split_loaded, what="beta's canary and shadow to load")
        held = [weakref.ref(rt.bundle.model) for rt in (beta.current, beta.view().canary, beta.view().shadow)]

        # Callers of beta keep sending while gamma's requests unload it (when it is idle between
        # two of them) and beta's load it again: every request is answered, none fails.
        answers: list[tuple[int, str]] = []
        stop = threading.Event()

        def beta_client(key: str) -> None:
            with httpx.Client(base_url=url, timeout=120) as client:
                while not stop.is_set():
                    r = client.post("/embed", json={"texts": TEXTS, "model": "beta"}, headers={"X-Canary-Key": key})
                    answers.append((r.status_code, r.json().get("model", r.text)))

        threads = [threading.Thread(target=beta_client, args=(key,)) for key in (key_of["v1"], key_of["v2"])]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(answers) >= 10, what="beta's first answers")
            assert _embed(url, {"texts": TEXTS}, "gamma")[0] == "gamma@v1"
            assert metric_value(url, "clip_model_unloads_total", model="beta@production") >= 1
            # The three versions beta had loaded are freed, not only its primary.
            wait_until(
                lambda: gc.collect() >= 0 and all(ref() is None for ref in held), what="beta's versions to be freed"
            )
            # Beta's callers loaded it again (gamma, idle, made room); its canary and shadow follow.
            wait_until(split_loaded, what="beta's canary and shadow to load again")
            since = len(answers)
            wait_until(lambda: len(answers) >= since + 10, what="answers after the reload")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert answers and {status for status, _ in answers} == {200}, [a for a in answers if a[0] != 200][:5]
        # Each caller stayed on its version throughout, the unload and reload included.
        with httpx.Client(base_url=url, timeout=60) as client:
            for version, key in key_of.items():
                r = client.post("/embed", json={"texts": TEXTS, "model": "beta"}, headers={"X-Canary-Key": key})
                assert r.json()["model"] == f"beta@{version}"
        assert {model for _, model in answers} == {"beta@v1", "beta@v2"}
        # The shadow compares again after the reload.
        wait_until(lambda: _split(url, "beta")["shadow"]["endpoints"].get("/embed", {}).get("compared", 0) > 0)
        assert _states(url) == {"alpha": "ready", "beta@production": "ready", "gamma": "unloaded"}


def test_a_request_for_a_model_still_loading_at_start_waits_for_it(
    tmp_path: Path, serve_app: Any, publish_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server is ready once its default model is; a request for another model that is still
    # loading waits for it (within its time budget) instead of a 503.
    from service.runtime import loader

    root = tmp_path / "store"
    publish_model(root, "alpha", seed=61)
    publish_model(root, "beta", seed=62)
    release = threading.Event()
    real_load = loader.ModelBundle.load

    def held_load(store: Any, ref: str, *args: Any, **kwargs: Any) -> Any:
        if ref.startswith("beta"):
            release.wait(timeout=60)  # beta's load lasts until the test lets it finish
        return real_load(store, ref, *args, **kwargs)

    monkeypatch.setattr(loader.ModelBundle, "load", held_load)
    with serve_app(store=str(root), model="alpha,beta") as running:
        assert _states(running.url) == {"alpha": "ready", "beta": "loading"}
        answers: list[tuple[str, np.ndarray]] = []
        request = threading.Thread(target=lambda: answers.append(_embed(running.url, {"texts": TEXTS}, "beta")))
        request.start()
        wait_until(lambda: running.services.models.entries[1].waiting == 1, what="the request to wait for beta")
        release.set()
        request.join(timeout=60)
        assert [answered for answered, _ in answers] == ["beta@v1"]
