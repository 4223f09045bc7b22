"""The forms of CLIP_REDIS_URL: one server, Redis Sentinel, Redis Cluster (parsing only)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.config import Settings
from service.redis_url import parse_redis_url, redact_redis_url


def test_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    target = parse_redis_url(
        "redis+sentinel://cache:p%40ss@sentinel-0:26379,sentinel-1,[::1]:26380/clipcache/2?sentinel_password=s3"
    )
    assert target.mode == "sentinel"
    assert target.hosts == (("sentinel-0", 26379), ("sentinel-1", 26379), ("::1", 26380))
    assert (target.master_name, target.db) == ("clipcache", 2)
    assert (target.username, target.password, target.sentinel_password) == ("cache", "p@ss", "s3")
    plain = parse_redis_url("redis+sentinel://10.0.0.1/mymaster/")
    assert plain.hosts == (("10.0.0.1", 26379),) and plain.master_name == "mymaster" and plain.db == 0
    assert plain.password is None and plain.sentinel_password is None


def test_cluster_url_names_some_nodes() -> None:
    target = parse_redis_url("redis+cluster://:secret@node-0:7000,node-1")
    assert target.mode == "cluster" and target.hosts == (("node-0", 7000), ("node-1", 6379))
    assert target.password == "secret" and target.username is None
    assert parse_redis_url("redis+cluster://node-0:7000/0").hosts == (("node-0", 7000),)


@pytest.mark.parametrize(
    "url", ["redis://:pw@cache:6379/0", "rediss://cache:6380/1?ssl_cert_reqs=none", "unix:///r.sock"]
)
def test_single_server_urls_are_left_to_redis_py(url: str) -> None:
    target = parse_redis_url(url)
    assert target.mode == "single" and target.url == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://:hunter2@s0:26379", "names the master"),
        ("redis+sentinel://:hunter2@s0:26379/", "names the master"),
        ("redis+sentinel://:hunter2@s0:26379/m/x", "must be a number"),
        ("redis+sentinel://:hunter2@s0:26379/m/0/extra", "names the master"),
        ("redis+sentinel://:hunter2@s0:26379/m?password=x", "unknown"),
        ("redis+cluster://:hunter2@n0:7000/1", "database 0 only"),
        ("redis+cluster://:hunter2@n0:7000?cluster=true", "unknown"),
        ("redis+cluster://:hunter2@n0:70000", "bad port"),
        ("redis+cluster://:hunter2@n0:7000,,n1", "separated by commas"),
        ("redis+cluster://:hunter2@[::1:7000", "IPv6"),
        ("sentinel://:hunter2@s0:26379/m", "unknown Redis URL scheme"),
        ("hunter2", "scheme"),
    ],
)
def test_malformed_urls_are_refused_without_repeating_the_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_redis_url(url)
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ValidationError) as invalid:
        Settings(redis_url=url)  # refused at start-up, not at the first cache lookup
    assert "hunter2" not in str(invalid.value)


def test_redaction_keeps_hosts_and_hides_every_password() -> None:
    url = "redis+sentinel://cache:p%40ss@s0:26379,s1:26379/clipcache/0?sentinel_password=s3cret"
    redacted = redact_redis_url(url)
    assert redacted == "redis+sentinel://cache:***@s0:26379,s1:26379/clipcache/0?sentinel_password=***"
    assert redact_redis_url("redis+cluster://:pw@n0:7000,n1:7001") == "redis+cluster://:***@n0:7000,n1:7001"
    assert redact_redis_url("redis://cache:6379/0") == "redis://cache:6379/0"
    assert redact_redis_url("redis://user@cache:6379/0") == "redis://user@cache:6379/0"  # a name, no password
