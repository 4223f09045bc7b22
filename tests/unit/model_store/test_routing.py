"""Routing a request on an alias entry: a canary's share by stable caller key, and shadow sampling."""

from __future__ import annotations

import os
import random
import secrets
import subprocess
import sys
from pathlib import Path

from model_store.aliases import AliasEntry, Canary, Shadow
from model_store.routing import key_point, route, shadow_target

REPO = Path(__file__).resolve().parents[3]
CANARY = AliasEntry(version="v6", canary=Canary(version="v7", weight=10))


def test_two_thousand_random_keys_split_ten_percent_within_three_points() -> None:
    keys = [secrets.token_hex(12) for _ in range(2000)]
    share = sum(route(CANARY, key) == "v7" for key in keys) / len(keys)
    assert 0.07 <= share <= 0.13
    assert {route(CANARY, key) for key in keys} == {"v6", "v7"}


def test_the_same_key_always_gets_the_same_version_in_any_process() -> None:
    keys = [f"caller-{i}" for i in range(200)]
    first = [route(CANARY, key) for key in keys]
    assert [route(CANARY, key) for key in keys] == first
    assert [route(CANARY, key.encode()) for key in keys] == first  # str and bytes keys agree
    # A fresh interpreter (another pod): Python's own hash() is salted per process, this is not.
    code = "from model_store.routing import key_point; print(repr(key_point('v7', 'caller-1')))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert float(out) == key_point("v7", "caller-1")


def test_raising_the_weight_keeps_every_caller_the_canary_had() -> None:
    keys = [secrets.token_hex(8) for _ in range(1000)]
    at_10 = {k for k in keys if route(CANARY, k) == "v7"}
    at_50 = {k for k in keys if route(AliasEntry(version="v6", canary=Canary(version="v7", weight=50)), k) == "v7"}
    assert at_10 < at_50


def test_without_a_canary_the_primary_answers_and_without_a_key_the_odds_hold() -> None:
    plain = AliasEntry(version="v6")
    assert {route(plain, k) for k in ("a", "b", None)} == {"v6"}
    rng = random.Random(7)
    share = sum(route(CANARY, None, rng) == "v7" for _ in range(4000)) / 4000
    assert 0.08 <= share <= 0.12


def test_shadow_sampling_follows_the_fraction() -> None:
    entry = AliasEntry(version="v6", shadow=Shadow(version="v8", fraction=0.2))
    rng = random.Random(3)
    draws = [shadow_target(entry, rng) for _ in range(5000)]
    assert set(draws) == {"v8", None}
    assert 0.17 <= draws.count("v8") / len(draws) <= 0.23
    assert shadow_target(AliasEntry(version="v6"), rng) is None
