"""The async client sends the same requests and parses the same answers as the sync one."""

from __future__ import annotations

import asyncio

from scripted_server import Reply, ScriptedServer, envelope

from clipdiff import AsyncClient, NotFound

IMG = b"img"


async def test_every_endpoint(server: ScriptedServer) -> None:
    top = [{"label": "x", "probability": 1.0, "cosine": 0.2}]
    server.script("/classify", Reply(body={"model": "m@1", "comparative": {"applied": False, "pairs": [], "alpha": 0.9},
                                           "results": [{"label": "x", "top_k": top}]}))  # fmt: skip
    server.script("/rank-pair", Reply(body={"model": "m@1", "results": [{"first": "b", "score": -0.2}]}))
    server.script("/rank", Reply(body={"model": "m@1", "ranking": [{"index": 0, "score": 0.1}], "scores": [0.1]}))
    server.script("/embed", Reply(body={"model": "m@1", "dim": 1, "embeddings": [[1.0]], "ids": ["0" * 64]}))
    server.script("/score/dense", Reply(body={"model": "m@1", "scores": [0.5], "best": 0, "cosine": [0.1],
                                              "functional_words": [[]]}))  # fmt: skip
    server.script("/models", Reply(body={"serving": "m@1", "models": []}))
    server.script("/models/m", Reply(404, envelope("unknown_model", "no model m", "name")))
    server.script("/healthz", Reply(body={"status": "ok"}))
    server.script("/readyz", Reply(body={"ready": True, "model": "m@1"}))
    async with AsyncClient(server.url, max_retries=0) as c:
        await c.wait_ready(timeout=2)
        res = await c.classify([IMG], ["x", "y"], comparative=True, top_k=1)
        assert res.labels == ["x"] and not res.comparative.applied
        assert server.hits("/classify")[0].query == {"comparative": ["true"]}
        assert [p.first for p in await c.rank_pairs([(IMG, IMG, "d")])] == ["b"]
        assert (await c.rank([IMG], "d")).order == [0]
        assert (await c.embed_images([IMG])).dim == 1
        assert (await c.score_dense(IMG, ["t"])).best == 0
        assert (await c.models()).serving == "m@1"
        try:
            await c.model("m")
        except NotFound as exc:
            assert exc.code == "unknown_model" and exc.field == "name"
        else:
            raise AssertionError("expected NotFound")


async def test_concurrent_requests_share_one_client(server: ScriptedServer) -> None:
    server.script("/rank-pair", Reply(body={"model": "m@1", "first": "a", "score": 0.3}, delay=0.05))
    async with AsyncClient(server.url) as c:
        results = await asyncio.gather(*(c.rank_pair(IMG, IMG, f"d{i}") for i in range(8)))
    assert all(r.first == "a" for r in results)
    assert sorted(h.body["difference"] for h in server.hits("/rank-pair")) == [f"d{i}" for i in range(8)]
