"""The forms ``CLIP_REDIS_URL`` takes, read without connecting anywhere.

* ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS), ``unix:///path?db=N``: one
  Redis server, read by redis-py's own ``from_url`` (query parameters included).
* ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]
  [?sentinel_password=...]``: the Sentinels (port 26379 when left out) that monitor the master
  named ``master_name``; the cache asks them where the master is and follows a failover. The
  user and password are the master's (and its replicas'); ``sentinel_password`` is the
  Sentinels' own, only when they require one (``requirepass`` in sentinel.conf).
* ``redis+cluster://[[user]:password@]host[:port][,host[:port]...]``: a few nodes of a Redis
  Cluster (port 6379 when left out); the client reads the rest of the cluster from any of them.
  A cluster has database 0 only.

This module has no dependency beyond the standard library: the settings validate a URL with it
at start-up (a typo fails there, not at the first cache lookup) and the cache builds its client
from the same reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["CLUSTER_SCHEME", "SENTINEL_SCHEME", "RedisTarget", "parse_redis_url", "redact_redis_url"]

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
_SINGLE_SCHEMES = ("redis", "rediss", "unix")
_DEFAULT_PORT = {SENTINEL_SCHEME: 26379, CLUSTER_SCHEME: 6379}
_QUERY_KEYS = {SENTINEL_SCHEME: {"sentinel_password"}, CLUSTER_SCHEME: set()}
_REDACTED = "***"


@dataclass(frozen=True)
class RedisTarget:
    """What a URL names. ``mode`` "single": ``url`` goes to redis-py as it is; "sentinel" and
    "cluster": the other fields say where and how to connect."""

    mode: Literal["single", "sentinel", "cluster"]
    url: str
    hosts: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def parse_redis_url(url: str) -> RedisTarget:
    """Read ``url``; ValueError (whose message never repeats the URL, which may carry a
    password) when it is not one of the forms in the module docstring."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError("the Redis URL must start with a scheme such as redis://")
    if scheme in _SINGLE_SCHEMES:
        return RedisTarget(mode="single", url=url)
    if scheme not in _DEFAULT_PORT:
        known = ", ".join(f"{s}://" for s in (*_SINGLE_SCHEMES, SENTINEL_SCHEME, CLUSTER_SCHEME))
        raise ValueError(f"unknown Redis URL scheme {scheme}://; use one of {known}")
    parts = urlsplit(url)
    if parts.fragment:
        raise ValueError(f"a {scheme}:// URL has no #fragment")
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = tuple(_host_port(item, _DEFAULT_PORT[scheme], scheme) for item in hostlist.split(","))
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - _QUERY_KEYS[scheme])
    if unknown:
        allowed = sorted(_QUERY_KEYS[scheme]) or ["none"]
        raise ValueError(f"unknown {scheme}:// URL parameter(s) {unknown}; allowed: {allowed}")
    segments = [unquote(s) for s in parts.path.split("/")[1:]]
    if segments and segments[-1] == "":
        segments.pop()  # a trailing slash
    if scheme == CLUSTER_SCHEME:
        if segments not in ([], ["0"]):
            raise ValueError("a Redis Cluster has database 0 only: redis+cluster://host:port[,host:port...]")
        return RedisTarget(mode="cluster", url=url, hosts=hosts, username=username, password=password)
    if not segments or not segments[0] or len(segments) > 2:
        raise ValueError(
            "a redis+sentinel:// URL names the master after the hosts: "
            "redis+sentinel://host:port[,host:port...]/master_name[/db]"
        )
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError("the database after the master name must be a number")
        db = int(segments[1])
    return RedisTarget(
        mode="sentinel",
        url=url,
        hosts=hosts,
        master_name=segments[0],
        db=db,
        username=username,
        password=password,
        sentinel_password=query.get("sentinel_password") or None,
    )


def _host_port(item: str, default_port: int, scheme: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [IPv6]:port
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"a bad IPv6 host in a {scheme}:// URL (write [address]:port)")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ValueError(f"a {scheme}:// URL needs host[:port] entries separated by commas")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"a bad port in a {scheme}:// URL (a number from 1 to 65535)")
    return host, int(port_text)


def redact_redis_url(url: str) -> str:
    """The URL with its passwords (in the user part and ``*password`` parameters) replaced by
    ``***``; hosts, ports, the master name and the database stay readable for the logs."""
    try:
        parts = urlsplit(url)
        userinfo, at, hosts = parts.netloc.rpartition("@")
        netloc = parts.netloc
        if at and ":" in userinfo:
            netloc = f"{userinfo.partition(':')[0]}:{_REDACTED}@{hosts}"
        query = parts.query
        pairs = parse_qsl(query, keep_blank_values=True)
        if any("password" in key.lower() for key, _ in pairs):
            query = urlencode([(k, _REDACTED if "password" in k.lower() else v) for k, v in pairs], safe="*")
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "**********"
