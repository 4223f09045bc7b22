"""The cache's way to Redis: one server, a master found through Redis Sentinel, or a Redis Cluster.

``EmbeddingCache`` keeps its timeouts, circuit breaker and value format whatever the topology;
``RedisLink`` hides only what differs between redis-py's three clients:

* reads: one ``MGET`` on a server or a Sentinel-managed master; in a cluster the keys of one batch
  hash to different slots (the key layout spreads them on purpose, see ``embedding_key``), so
  ``mget_nonatomic`` sends one pipelined ``MGET`` per slot, grouped into one round trip per node,
  the nodes in parallel;
* dropping stale sockets before a probe: the pool's idle connections on a server or master (a new
  connection to a Sentinel-managed master asks the Sentinels where the master is, so it finds a
  promoted replica); in a cluster each node's idle connections, after reading the slot map
  afresh (a failed-over node's slots have moved);
* closing: the Sentinel connections too.

No client retries anywhere: a retry multiplies the latency of a dead Redis, and the cache's
breaker decides when to try again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from service.redis_url import RedisTarget, parse_redis_url

__all__ = ["RedisLink"]

# Connections per cluster node. redis-py's cluster client raises MaxConnectionsError past its
# limit (100 by default) instead of waiting, which the breaker would take for an outage under a
# burst of concurrent requests; a single server's pool has no such limit either.
_CLUSTER_MAX_CONNECTIONS = 1 << 16
# "<redis.asyncio.client.Redis(<...ConnectionPool(<...Connection(db=0,...,host=h,port=p,...)>)>)>"
_CLIENT_REPR = re.compile(r"<redis\.asyncio\.client\.Redis\(.*?\bhost=([^,]+),port=(\d+),.*?\)>\)>\)>")


class RedisLink:
    """One redis-py client for ``url`` (see service/redis_url.py for the forms)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        # Imported here so the service runs without Redis installed when no URL is configured.
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        target = parse_redis_url(url)
        self.mode = target.mode
        # Strings that must never reach a log line or a response (error texts are scrubbed).
        self.secrets = tuple(s for s in (target.password, target.sentinel_password) if s)
        common: dict[str, Any] = {
            "socket_connect_timeout": timeout_s,
            "socket_timeout": timeout_s,
            "retry": Retry(NoBackoff(), 0),
            "health_check_interval": 0,
        }
        self.client, self._sentinel = _build(target, common)

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        if self.mode == "cluster":
            return list(await self.client.mget_nonatomic(list(keys)))
        return list(await self.client.mget(list(keys)))

    def pipeline(self, transaction: bool = False) -> Any:
        """A pipeline without MULTI/EXEC; in a cluster, one per node, sent in parallel."""
        return self.client.pipeline(transaction=transaction)

    async def ping(self) -> None:
        await self.client.ping()  # in a cluster: every node

    async def drop_idle_connections(self) -> None:
        if self.mode == "cluster":
            # The slot map first (CLUSTER SLOTS from a node that answers): a failed-over node's
            # slots have moved. Not a full re-initialisation (aclose), which also fetches COMMAND:
            # about 100 ms on a busy host, most of a probe's time budget.
            await self.client.nodes_manager.initialize()
            for node in self.client.get_nodes():
                # Idle connections only where redis-py can; older releases close them all.
                drop = getattr(node, "disconnect_free_connections", None)
                await (drop() if drop is not None else node.disconnect())
        else:
            await self.client.connection_pool.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        finally:
            if self._sentinel is not None:
                for sentinel in self._sentinel.sentinels:
                    await sentinel.aclose()

    def scrub(self, text: str) -> str:
        """An error text fit for a log line and /models: no password, and redis-py's client
        reprs (a kilobyte each, several in a Sentinel error) cut down to host:port."""
        text = _CLIENT_REPR.sub(r"\1:\2", text)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def _build(target: RedisTarget, common: dict[str, Any]) -> tuple[Any, Any]:
    """The client, and the Sentinel client that finds its master (None without Sentinel)."""
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.mode == "sentinel":
        from redis.asyncio.sentinel import Sentinel

        assert target.master_name is not None  # parse_redis_url guarantees it
        # The Sentinels get the same timeouts and no retries; their own password, if any.
        sentinel = Sentinel(list(target.hosts), sentinel_kwargs={**common, "password": target.sentinel_password})
        return sentinel.master_for(target.master_name, db=target.db, **auth, **common), sentinel
    if target.mode == "cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
            # A cluster that lost a master (no replica to promote) still serves the other
            # slots; the cache would rather have those than nothing.
            require_full_coverage=False,
            # Keep asking the URL's hosts for the slot map, not only the node addresses the
            # cluster announced: in Kubernetes those are pod IPs, all of which may have changed
            # after a rolling restart, while the URL names stable DNS names.
            dynamic_startup_nodes=False,
            max_connections=_CLUSTER_MAX_CONNECTIONS,
            **auth,
            **common,
        )
        return cluster, None
    from redis.asyncio import Redis

    return Redis.from_url(target.url, **common), None
