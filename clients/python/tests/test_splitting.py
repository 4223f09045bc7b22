"""How work larger than the server's limits is cut into requests and the answers merged (the
pure chunking, and the client against a scripted server; tests/service/test_sdk_split.py does the
same against the real service)."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

import numpy as np
import pytest
from scripted_server import Reply, ScriptedServer

from clipdiff import AsyncClient, Client, ClipServiceError
from clipdiff.splitting import body_bounds, chunk_bounds, json_size


def covers(bounds: list[tuple[int, int]], n: int) -> bool:
    return [i for a, b in bounds for i in range(a, b)] == list(range(n))


def test_no_limits_is_one_chunk() -> None:
    assert chunk_bounds([5] * 7, None, None) == [(0, 7)]
    assert chunk_bounds([], 3, 10) == []


def test_count_limit() -> None:
    bounds = chunk_bounds([1] * 7, 3, None)
    assert bounds == [(0, 3), (3, 6), (6, 7)]


def test_byte_limit_and_an_item_too_large_alone() -> None:
    bounds = chunk_bounds([4, 4, 4, 20, 1], None, 10)
    assert bounds == [(0, 2), (2, 3), (3, 4), (4, 5)]  # 20 alone: the server's 413 names it


@pytest.mark.parametrize(("n", "limit", "max_bytes"), [(7, 3, None), (9, 4, 2), (50, 7, 13), (1, 1, 1)])
def test_chunks_cover_the_input_in_order_within_the_limits(n: int, limit: int, max_bytes: int | None) -> None:
    bounds = chunk_bounds([1] * n, limit, max_bytes)
    assert covers(bounds, n)
    assert all(1 <= b - a <= min(limit, max_bytes or limit) for a, b in bounds), bounds


@pytest.mark.parametrize("cap", [200, 257, 1000])
def test_body_bounds_fill_each_body_up_to_the_byte_cap(cap: int) -> None:
    body = {"difference": "larger", "model": "m@1"}
    items = [{"data": "x" * (7 * i % 40)} for i in range(30)]
    bounds = body_bounds(body, "images", items, None, cap)
    assert covers(bounds, len(items))
    for a, b in bounds:
        assert json_size({**body, "images": items[a:b]}) <= cap  # the exact size sent
        if b < len(items):  # and the next item would not have fitted
            assert json_size({**body, "images": items[a : b + 1]}) > cap


def embed_answer(model: str, texts: list[str], packed: bool = False) -> Reply:
    """What /embed answers for ``texts``: 2-d vectors ``[index, -index]`` from each text's number."""
    rows = [[float(t.split()[-1]), -float(t.split()[-1])] for t in texts]
    embeddings: list[object] = rows
    if packed:
        embeddings = [base64.b64encode(struct.pack("<2f", *r)).decode() for r in rows]
    return Reply(body={"model": model, "dim": 2, "embeddings": embeddings, "ids": texts})


def test_client_splits_by_the_servers_count_limit_and_merges_in_order(server: ScriptedServer) -> None:
    server.script("/limits", Reply(body={"max_texts": 2, "max_body_bytes": 10_000}))
    texts = [f"text {i}" for i in range(5)]
    server.script("/embed", *(embed_answer("m@1", texts[a : a + 2], packed=True) for a in (0, 2, 4)))
    with Client(server.url, max_retries=0) as client:
        result = client.embed_texts(texts, as_numpy=True)
    sent = [hit.body for hit in server.hits("/embed")]
    assert [body["texts"] for body in sent] == [texts[0:2], texts[2:4], texts[4:5]]
    assert all(body["encoding_format"] == "base64" for body in sent)
    assert len(server.hits("/limits")) == 1  # read once per client
    assert result.ids == texts and result.model == "m@1"
    assert isinstance(result.embeddings, np.ndarray) and result.embeddings.dtype == np.float32
    assert result.embeddings.tolist() == [[float(i), -float(i)] for i in range(5)]


def test_a_server_without_limits_gets_one_request(server: ScriptedServer) -> None:
    texts = [f"text {i}" for i in range(5)]  # /limits is not scripted: the server answers 404
    server.script("/embed", embed_answer("m@1", texts))
    with Client(server.url, max_retries=0) as client:
        assert client.embed_texts(texts).embeddings[4] == [4.0, -4.0]
    assert len(server.hits("/embed")) == 1


def test_a_version_change_between_parts_is_an_error(server: ScriptedServer) -> None:
    server.script("/limits", Reply(body={"max_texts": 2}))
    server.script("/embed", embed_answer("m@1", ["t 0", "t 1"]), embed_answer("m@2", ["t 2"]))
    with Client(server.url, max_retries=0) as client, pytest.raises(ClipServiceError) as caught:
        client.embed_texts(["t 0", "t 1", "t 2"])
    assert caught.value.code == "model_changed"


def test_the_async_client_splits_the_same_way(server: ScriptedServer) -> None:
    server.script("/limits", Reply(body={"max_texts": 2}))
    texts = [f"text {i}" for i in range(3)]
    server.script("/embed", embed_answer("m@1", texts[:2]), embed_answer("m@1", texts[2:]))

    async def embed() -> Any:
        async with AsyncClient(server.url, max_retries=0) as client:
            return (await client.embed_texts(texts)).embeddings

    assert asyncio.run(embed()) == [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]]
    assert [hit.body["texts"] for hit in server.hits("/embed")] == [texts[:2], texts[2:]]
