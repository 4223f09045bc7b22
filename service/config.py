"""Typed service settings: every field is an environment variable (``CLIP_*``) and most are flags.

Settings are built once, inside ``create_app`` (or by ``python -m service``), never at import
time, so tests can run several differently configured apps in one process. Nested groups use a
double underscore in the environment: ``CLIP_LIMITS__MAX_IMAGES=16``,
``CLIP_BATCHING__MAX_WAIT_MS=2``. List fields take JSON: ``CLIP_API_KEYS='["k1","k2"]'``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from model_store import parse_ref
from model_store.location import check_location
from service.redis_url import parse_redis_url, redact_redis_url

MiB = 1024 * 1024


class Limits(BaseModel):
    """Request limits; exceeding a count or size limit answers 413 ``payload_too_large``."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(default=20 * MiB, gt=0, description="Largest request body (20 MiB).")
    max_images: int = Field(
        default=64, ge=1, description="Images per request (`images`), for /classify, /rank and /embed."
    )
    max_labels: int = Field(default=1000, ge=2, description="Labels per /classify request.")
    max_texts: int = Field(default=256, ge=1, description="Texts per /embed request.")
    max_text_chars: int = Field(
        default=2000,
        ge=1,
        description="Characters per text (label, template, description, difference, comparative).",
    )
    # Checked from the image header before any pixel is decoded (decompression-bomb guard).
    max_pixels: int = Field(
        default=40_000_000, gt=0, description="Pixels per image, checked from the image header before decoding."
    )
    max_aspect_ratio: float = Field(
        default=50.0,
        ge=1,
        allow_inf_nan=False,
        description="Longest side over shortest side that an image may have, checked from its header: a 236-byte "
        "PNG of 160000x1 pixels is within `max_pixels` but a centre crop of it is one pixel wide, and decoding "
        "the widest such images costs hundreds of MB.",
    )
    max_image_bytes: int = Field(default=10 * MiB, gt=0, description="Encoded bytes per image (10 MiB).")
    max_url_bytes: int = Field(
        default=20 * MiB,
        gt=0,
        description="Bytes that all the image URLs of one request may download together (a request of a few KB "
        "may name many large images; each is also capped by `max_image_bytes`).",
    )
    max_pairs: int = Field(default=64, ge=1, description="Pairs per /rank-pair request.")
    max_prompts_per_label: int = Field(
        default=64, ge=1, description="Templates per request and descriptions per label."
    )
    max_comparatives: int = Field(default=256, ge=0, description="Comparatives per /classify request.")
    max_concurrent_requests: int = Field(
        default=512,
        ge=1,
        description="Requests of the API (not the probes, metrics or pages) that one server process holds at "
        "once; past it a request is answered 429 `overloaded` with `Retry-After` before its body is read. "
        "The batch queues bound the work, this bounds the bodies held meanwhile.",
    )


class Batching(BaseModel):
    """Dynamic batching and backpressure (a full queue answers 429 with ``Retry-After``)."""

    model_config = ConfigDict(extra="forbid")

    max_batch_images: int = Field(default=64, ge=1, description="Largest image batch handed to the model.")
    max_batch_texts: int = Field(default=256, ge=1, description="Largest text batch handed to the model.")
    # 0: a batch runs as soon as the model is free; requests that arrive while it is busy form
    # the next batch. Measured (docs/benchmarks.md): 5 ms cost 40-45% of throughput at
    # concurrency 1 and bought nothing at concurrency 8.
    max_wait_ms: float = Field(
        default=0.0,
        ge=0,
        description="How long a batch waits to fill before it runs (0: run as soon as the model is free).",
    )
    max_queue: int = Field(
        default=4096, ge=1, description="Items a batcher queues; beyond it requests answer 429 with `Retry-After`."
    )
    max_queue_delay_s: float | None = Field(
        default=2.0,
        gt=0,
        description="Refuse (429 with Retry-After) a request whose items would wait longer than this in a batch "
        "queue, estimated from the queue and the measured batch time: overload answers at once instead of with "
        "seconds of latency. `max_queue` still bounds the items held. Unset (null): no time bound.",
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Budget of one request in the batchers; beyond it 504 `timeout`."
    )
    decode_workers: int = Field(default=2, ge=1, description="Threads that decode and preprocess images.")


class CollectionsSettings(BaseModel):
    """Collections of a user's images (``/collections``): where they are kept and their bounds
    (exceeding a count or size bound answers 413 ``payload_too_large``)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        default="file:collections",
        description="Where collections are kept: `file:///var/lib/clip/collections` (or `file:collections`, "
        "relative to the working directory) is the embedded backend, one SQLite file per collection searched "
        "with an exact FAISS index (or, chosen when a collection is created, an HNSW graph kept beside it), "
        "needing no other server; one server process owns the folder. "
        "`postgresql://user:pass@host:port/db` keeps them in PostgreSQL with pgvector, shared by every server "
        "that reaches it; its query may add `index=hnsw` (approximate search, with `hnsw_m`, "
        "`hnsw_ef_construction`, `ef_search`; default `index=exact`) and `pool_wait_s` (how long a call waits "
        "for a connection before 503 `not_ready`, default 5). Other schemes are refused at start-up.",
    )
    max_items_per_add: int = Field(default=64, ge=1, description="Images per `POST /collections/{name}/images`.")
    max_id_chars: int = Field(default=128, ge=1, description="Characters of an item id.")
    max_metadata_keys: int = Field(default=32, ge=0, description="Keys of an item's metadata.")
    max_metadata_bytes: int = Field(
        default=4096, ge=2, description="Bytes of an item's metadata written as compact JSON."
    )
    max_results: int = Field(
        default=1000, ge=1, description="`offset` + `limit` of a search, and its first stage's `k`."
    )
    image_folder: str | None = Field(
        default=None,
        description="Where the bytes of every collection image are kept (one file per distinct image of a "
        "collection, named by its SHA-256), so that a new model version can embed them again; left out, the "
        "folder of a `file:` `url`, or `collection-images` in the working directory with a `postgresql://` one "
        "(where several servers share the database, point them all at one shared folder: a re-embedding reads "
        "every image of the collection, whichever server added it).",
    )
    reembed: Literal["manual", "auto"] = Field(
        default="manual",
        description="When a collection's model serves another version than the collection holds: `manual` "
        "answers 409 `version_mismatch` until `POST /collections/{name}/reembed`; `auto` starts that "
        "re-embedding at the first request that finds the new version. Either way the collection answers "
        "503 while it runs and never mixes versions.",
    )
    import_roots: list[str] = Field(
        default_factory=list,
        description="Server folders whose images `POST /collections/{name}/imports` may add (a folder under "
        "one of them, or a JSONL manifest in one); empty, imports are refused (403).",
    )

    max_items_per_import: int = Field(
        default=100_000, ge=1, description="Images one `POST /collections/{name}/imports` adds (413 above)."
    )

    def image_path(self) -> Path:
        if self.image_folder is not None:
            return Path(self.image_folder)
        from service.collections.store import collections_path, is_postgres

        return Path("collection-images") if is_postgres(self.url) else collections_path(self.url)

    @field_validator("url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from service.collections.store import check_url

        check_url(value)  # a file: URL with a folder or a postgresql:// one; any other is refused here
        return value


class Settings(BaseSettings):
    # hide_input_in_errors: an error must not print what was given, which for redis_url or an
    # API key is a secret (`python -m service` prints validation errors to stderr, into the logs).
    model_config = SettingsConfigDict(
        env_prefix="CLIP_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
        hide_input_in_errors=True,
    )

    host: str = Field(default="127.0.0.1", description="Bind address of the HTTP server.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port of the HTTP server.")
    store: str = Field(
        default="models",
        description="Model-store location: a directory (relative paths are taken from the working directory) or "
        "`s3://bucket/prefix` on S3-compatible object storage, reached with the standard AWS environment or "
        "profile (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_PROFILE`, credentials; see docs/operations.md). Other "
        "schemes are refused. The `model-store` and `clip-train` command lines read the same variable "
        "(`MODEL_STORE` is a deprecated alias there).",
    )
    store_cache_dir: Path | None = Field(
        default=None,
        description="Local cache of the weight files of an `s3://` store, keyed by sha256 and checked on download, "
        "so a restart (or a second process on the node) reads them without downloading again; also holds the "
        "local copies that loaders open. Unset: `$XDG_CACHE_HOME/clip-service/store`. Must be writable; never "
        "evicted, so size its volume for the versions a pod loads. Unused for a directory store.",
    )
    model: str = Field(
        default="default@production",
        description="The served set: one model ref or a comma-separated list of them (`name`, `name@alias`, "
        "`name@version`; `default@production,default@v5,other`). Each is loaded, warmed, watched and hot-swapped "
        "on its own, and requests pick one with their `model` field; the first answers requests that name none, "
        "and `/readyz` is ready once it serves.",
    )
    max_loaded_models: int = Field(
        default=0,
        ge=0,
        description="Model versions of the served set held in memory at once, every role counted: each entry's "
        "primary, canary and shadow (a shadow of the canary's version once); 0: no bound. Beyond it, the first "
        "entries load at start and the others on their first request (which waits for the load, within "
        "`batching.request_timeout_s`, else 503 with Retry-After), unloading the least recently used model that "
        "has no request in flight, with its canary and shadow, once the new one has loaded: a load that fails "
        "unloads nothing, and its model is quarantined (503 with Retry-After, no load) until its backoff ends, or, "
        "for a version refused by its checksums, manifest, warm-up or parity gate, until its alias names another "
        "version. While a load on request runs, one model more than the budget is in memory, as during a hot swap "
        "(one such load at a time). A canary or shadow that would not fit even with every model but the default "
        "unloaded is refused when its alias names it (logged, `problem` in /models, "
        '`clip_side_loads_total{result="over_budget"}`). The first model is never unloaded, so a set of several '
        "needs at least 2.",
    )
    max_loaded_bytes: int = Field(
        default=0,
        ge=0,
        description="Bytes of weights of the served set held in memory at once (every loaded version's tensors as "
        "loaded, measured at its load; 0: no bound), beside `max_loaded_models` and enforced the same way: a load on "
        "request starts at once while less is loaded, and once it has loaded, idle models are unloaded until the set "
        "fits; a canary or shadow that would not fit beside the default model is refused. With this bound alone, "
        "only the first model loads at start.",
    )
    max_loads_per_minute: int = Field(
        default=30,
        ge=0,
        description="Loads on request (under `max_loaded_models`) that may start in any 60 s, all models of the set "
        "together; beyond it a request for a model that is not loaded answers 503 with Retry-After (when the "
        "oldest of those loads leaves the window) instead of loading it. Loads at start and hot swaps are not "
        "counted. 0: no bound.",
    )
    device: str = Field(
        default="cpu",
        pattern=r"^(cpu|auto|cuda(:[0-9]+)?)$",
        description="`cpu`, `cuda` (the current CUDA device), `cuda:N` (device N) or `auto` (CUDA when available).",
    )
    backend: Literal["torch", "onnx", "auto"] = Field(
        default="torch",
        description="Runtime of the pooled image and text towers. `onnx`: each version is exported once to ONNX "
        "(one text graph per text-encoder variant), loaded in onnxruntime (CUDA provider when `device` is CUDA "
        "and onnxruntime-gpu is installed) and refused unless every probe embedding is within cosine 0.999 of "
        "torch fp32. For a version with a DCSM scorer, its dense token and patch features get their own graphs, "
        "gated per token. `auto`: the faster runtime of the set `precision` on this machine, measured as "
        "`precision=auto` measures (with `fp32`: torch or ONNX Runtime, the same arithmetic; with `int8`: torch's "
        "or ONNX Runtime's quantised tower; `bf16` and `fp16` run on torch).",
    )
    onnx_cache_dir: Path | None = Field(
        default=None,
        description="Where `backend=onnx` keeps its exports, one folder per `name/version`, reused across "
        "restarts, and `precision=auto` its decisions. Unset: `$XDG_CACHE_HOME/clip-service/onnx` "
        "(`~/.cache/clip-service/onnx`). Must be writable; the model store may stay read-only.",
    )
    precision: Literal["fp32", "bf16", "fp16", "int8", "auto"] = Field(
        default="fp32",
        description="Arithmetic of the pooled towers. torch backend: `bf16` autocasts on CPU or CUDA, `fp16` on "
        "CUDA only. `int8` (CPU, either backend) quantises the image tower's matrix products (dynamic "
        "quantisation: torch's fbgemm / qnnpack linears, or onnxruntime's; text towers stay fp32). A version is "
        "refused unless every probe embedding is within cosine 0.999 of torch fp32. `auto` (any backend): the "
        "fastest candidate that passes that gate on this machine, timed briefly when a version loads (on a CPU at "
        "batch 1 and 8; on CUDA at 1, 8, 32, ... up to `batching.max_batch_images`, large batches weighing most), "
        "kept only if at least 10% faster than torch fp32. CPU candidates: torch fp32, torch bf16 (only on "
        "CPUs with AVX-512 BF16), torch int8, ONNX Runtime fp32 and int8; CUDA: torch fp32, fp16, fp16 with the "
        "image tower replayed from CUDA graphs, ONNX Runtime fp32. The decision is kept in `onnx_cache_dir`, "
        "keyed by version, settings and the CPU's instruction sets (see docs/benchmarks.md for what wins where). "
        "A decision `clip-train tune` shared in the store for this CPU kind and these settings is used first, "
        "with its graphs: nothing is exported or timed "
        '(docs/operations.md, "Shared auto decisions").',
    )
    torch_threads: int = Field(
        default=0,
        ge=0,
        description="Intra-op threads of the model thread, for torch and onnxruntime alike (0: the library "
        "default, one per core). On a machine shared with other CPU-heavy work, 1 avoids threads waiting for "
        "descheduled siblings (see docs/benchmarks.md).",
    )
    workers: int | Literal["auto"] = Field(
        default=1,
        description="Front-end processes. 1: one process does everything (HTTP, decoding, batching, the model). "
        "N > 1: `python -m service` supervises one engine process (the served set, caches, batchers and towers, "
        "on a private unix socket) and N front-ends that share the public port (SO_REUSEPORT), parse requests "
        "and decode base64 images to model-input pixels before handing them to the engine. On the CPU the "
        "engine's intra-op threads are the cores left to it (cores - N) unless `torch_threads` is set. `auto`: 1 "
        "on a CPU-only node with fewer than 8 cores, else cores // 4 (at most 8) on the CPU and cores - 2 (at "
        'most 8) with CUDA (docs/operations.md, "Front-ends and an engine").',
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Largest request head (request line and headers) the server reads; more answers 431 and "
        "closes the connection.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Time a client has to send a whole request head from its first byte (or from connecting); "
        "later answers 408 and closes the connection (slow-header clients cannot hold connections).",
    )
    body_idle_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest pause allowed between two pieces of a request body (Content-Length or chunked) "
        "while the server is reading it; a longer one answers 408 and closes the connection.",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Time a client has to send a whole request body from the end of its head (a body trickled "
        "a byte at a time cannot hold a connection); later answers 408 and closes the connection. Time the "
        "server holds off reading does not count. At the default, a 20 MiB body (the default `max_body_bytes`) "
        "needs about 3 Mbit/s: raise it for slower clients.",
    )
    keep_alive_s: float = Field(
        default=5.0,
        gt=0,
        description="How long an idle keep-alive connection stays open between requests.",
    )
    redis_url: SecretStr | None = Field(
        default=None,
        description="Shared embedding cache; unset (or while Redis is down), the in-process LRU only. One server: "
        "`redis://[[user]:password@]host:port/db` (`rediss://` for TLS). Redis Sentinel: "
        "`redis+sentinel://[[user]:password@]host:port[,host:port...]/master_name[/db]` names the Sentinels "
        "(port 26379 when left out) and the master they monitor; the password is the master's, "
        "`?sentinel_password=...` the Sentinels' own when they require one; a failover is followed. Redis "
        "Cluster: `redis+cluster://[[user]:password@]host:port[,host:port...]` names a few nodes (database 0 "
        "only); keys spread over the masters by hash slot. Passwords are redacted in logs and responses. See "
        'docs/operations.md, "Redis Sentinel or Redis Cluster".',
    )
    cache_ttl_s: int = Field(
        default=7 * 24 * 3600, gt=0, description="Lifetime of an embedding in Redis, in seconds (7 days)."
    )
    lru_items: int = Field(
        default=50_000, ge=0, description="Embeddings kept in the in-process LRU cache (0 disables it)."
    )
    redis_timeout_s: float = Field(
        default=0.25,
        gt=0,
        description="Time allowed for one Redis round trip before it counts as a miss and a timeout.",
    )
    redis_retry_after_s: float = Field(
        default=5.0,
        gt=0,
        description="After Redis failed, the cache skips it this long before probing it again on fresh "
        "connections (doubled while probes keep failing, at most 60 s): a Redis that answers again is back in use "
        "one pause later.",
    )
    redis_timeouts_to_open: int = Field(
        default=3,
        ge=1,
        description="Timeouts in a row that make the cache skip Redis (a refused or reset connection does at "
        "once): a loaded machine can be slow while Redis is healthy.",
    )
    redis_successes_to_close: int = Field(
        default=3,
        ge=1,
        description="Successful probes in a row before Redis is used normally again after a failure.",
    )
    limits: Limits = Field(default_factory=lambda: Limits())
    batching: Batching = Field(default_factory=lambda: Batching())
    collections: CollectionsSettings = Field(default_factory=lambda: CollectionsSettings())
    allow_url_images: bool = Field(
        default=False, description='Accept `{"url": ...}` images (fetched with an SSRF guard).'
    )
    url_allowlist: list[str] = Field(
        default_factory=list,
        description="Hosts (exact names or IP literals) that may be fetched even when they resolve to private, "
        "loopback or link-local addresses; every other host must resolve to public addresses.",
    )
    url_timeout_s: float = Field(
        default=5.0, gt=0, description="Total time allowed to fetch one image URL (redirects included)."
    )
    url_fetches_per_request: int = Field(
        default=4,
        ge=1,
        description="Image URLs of one request fetched at the same time; the others wait their turn (a request "
        "may name `limits.max_images` URLs). The wait is not counted in `url_timeout_s`, which each fetch has "
        "in full once it starts.",
    )
    url_fetches_per_process: int = Field(
        default=16,
        ge=1,
        description="Image URLs fetched at the same time by the whole server process, all requests together; a "
        "fetch beyond it waits for one to finish (each finishes within `url_timeout_s`).",
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Accepted API keys (`Authorization: Bearer <key>`); empty with no `api_keys_file`: no "
        "authentication. Redacted in logs.",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="File with one API key per line (`#` comments allowed), re-read when it changes.",
    )
    watch_interval_s: float = Field(
        default=2.0, gt=0, description="How often the model alias is checked for a new version."
    )
    drain_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a swapped-out version may keep finishing requests (then its batchers stop).",
    )
    auto_retime_attempts: int = Field(
        default=3,
        ge=0,
        description="With `precision=auto` / `backend=auto`: how many times a serving version whose decision was "
        "deferred (the timing rounds could not tell whether any candidate beats the reference) is measured again in "
        "the background, while the server is idle or, failing that, paced under the traffic "
        "(`auto_retime_busy_share`); a decided version is looked up in the model store as often, in case "
        "`clip-train tune` shared a decision for this CPU kind since. A winner replaces the serving towers the way "
        "a version swap does (drained, no request fails). A measurement interrupted by a request is not counted. "
        "0 turns re-timing off: a deferred decision is measured again only at the version's next load.",
    )
    auto_retime_idle_s: float = Field(
        default=30.0,
        gt=0,
        description="Re-timing starts once the server has had no request in flight (for any model it serves) "
        "for this long, and stops (nothing decided, tried again at the next idle spell) as soon as a request arrives.",
    )
    auto_retime_busy_after_s: float = Field(
        default=120.0,
        gt=0,
        description="An attempt that has found no idle spell (`auto_retime_idle_s`) for this long runs under the "
        "traffic instead, paced to `auto_retime_busy_share` of a core, and requests no longer stop it (a version "
        "loading does).",
    )
    auto_retime_busy_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="The share of one core a re-timing under traffic may use: after each piece of its work (a "
        "candidate built, a timed call) the measuring thread pauses long enough that the work, counted on every "
        "thread it may use (`torch_threads`, or every core), is at most this share of the time that passed. 0: "
        "re-time only while the server is idle, however long that takes.",
    )
    auto_retime_backoff_s: float = Field(
        default=60.0,
        ge=0,
        description="Wait after the load before the first re-timing, doubling after each attempt that decided "
        "nothing (a busy node stays busy for a while).",
    )
    auto_retime_cpu_s: float = Field(
        default=120.0,
        gt=0,
        description="CPU seconds (the process's, all threads) that re-timing may spend per served version, "
        "interrupted measurements included; once spent, no attempt starts. An attempt under traffic counts the "
        "pacing's bound instead (its work's seconds times the threads it may use): the process's CPU time then "
        "holds the requests' too.",
    )
    shadow_quiet_ms: float = Field(
        default=5.0,
        ge=0,
        description="A shadow run starts only once the primary and canary have had no request in flight for this "
        "long (a gap in the traffic, not the moment between two requests of one client), and longer while the "
        "recent traffic's gaps of that length mostly ended before a run would have; a sampled request that "
        "finds no such gap within 1 s is dropped. 0: it starts right after the answer, whatever is in flight "
        "(measured costlier for the answers: docs/benchmarks.md).",
    )
    graceful_shutdown_s: int = Field(default=20, ge=0, description="How long SIGTERM waits for in-flight requests.")
    warmup: bool = Field(
        default=True,
        description="Run a warm-up batch before a loaded version serves (and before /readyz says ready).",
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="info", description="Log level (case-insensitive)."
    )
    cors_origins: list[str] = Field(
        default_factory=list, description="Origins allowed by CORS; empty: no CORS headers at all."
    )
    probes_list_models: bool = Field(
        default=False,
        description="List the served models on the public `/readyz` (the default's `name@version` in `model`, every "
        "entry with its version, canary and shadow in `models`). `false`: `/readyz` says whether the server is "
        "ready, and the models are listed by `GET /models` only, which needs a key when keys are configured. "
        "`/metrics` keeps its per-model series either way (docs/operations.md, Metrics).",
    )
    playground: bool = Field(
        default=True,
        description="Serve the playground page at `/` (static files that call the public API; its API calls need "
        "a key like any other when keys are configured). `false`: `/` and `/playground/...` answer 404.",
    )

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_form(cls, value: Any) -> Any:
        # From the environment every value is a string: a number is the int, anything else stays for the
        # Literal to refuse with its own message.
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError("workers must be at least 1 (or auto)")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("model")
    @classmethod
    def _valid_refs(cls, value: str) -> str:
        refs = [ref.strip() for ref in value.split(",")]
        if not all(refs):
            raise ValueError(f"an empty model ref in {value!r}: refs are separated by single commas")
        seen: dict[tuple[str, str], str] = {}
        for ref in refs:
            key = parse_ref(ref)  # "name", "name@alias" or "name@version"; raises ValueError otherwise
            if key in seen:  # "tiny" and "tiny@production" are one entry
                raise ValueError(f"model refs {seen[key]!r} and {ref!r} name the same entry")
            seen[key] = ref
        return ",".join(refs)

    @model_validator(mode="after")
    def _budget_fits_the_set(self) -> Settings:
        # The first model is never unloaded (it answers requests without `model` and makes /readyz
        # ready): a budget of one would leave no room for any other model of the set.
        if self.max_loaded_models == 1 and len(self.served_refs()) > 1:
            raise ValueError("max_loaded_models=1 holds only the first model of the set; use 0 (no limit) or 2 or more")
        return self

    @field_validator("api_keys", mode="after")
    @classmethod
    def _no_empty_keys(cls, value: list[SecretStr]) -> list[SecretStr]:
        if any(not k.get_secret_value().strip() for k in value):
            raise ValueError("API keys must not be empty")
        return value

    @model_validator(mode="after")
    def _precision_fits(self) -> Settings:
        if self.precision in ("fp32", "auto"):  # auto tries only what fits the device
            return self
        if self.precision == "int8":
            if _cuda_device(self.device):
                # Neither torch's quantised linears nor onnxruntime's CUDA provider have CUDA kernels for the
                # dynamically quantised tower (onnxruntime would run it node by node on the CPU): use fp16 there.
                raise ValueError(f"precision int8 runs on the CPU (device={self.device}); use fp16 on CUDA")
            return self
        if self.backend == "onnx":
            raise ValueError(f"precision {self.precision} applies to the torch backend; backend=onnx runs fp32 or int8")
        if self.precision == "fp16" and not _cuda_device(self.device):
            # Few CPUs have fast fp16 kernels, and fp16's range (65504) can overflow where bf16, with
            # fp32's range, cannot: bf16 is the CPU choice.
            raise ValueError(f"precision fp16 needs a CUDA device (device={self.device}); use bf16 on CPU")
        return self

    @model_validator(mode="after")
    def _onnxruntime_installed(self) -> Settings:
        if self.backend == "onnx" and importlib.util.find_spec("onnxruntime") is None:
            extra = "gpu" if _cuda_device(self.device) else "cpu"
            raise ValueError(
                f"backend={self.backend} with precision={self.precision} needs onnxruntime: install the project's "
                f"`{extra}` extra (pip install '.[{extra}]'), or use backend=torch"
            )
        return self

    @field_validator("redis_url")
    @classmethod
    def _redis_url_form(cls, value: SecretStr | None) -> SecretStr | None:
        # A malformed URL fails at start-up, not at the first cache lookup. Neither the message
        # (parse_redis_url never repeats the URL) nor pydantic (hide_input_in_errors) prints the
        # URL, which may carry a password.
        if value is not None:
            parse_redis_url(value.get_secret_value())
        return value

    @field_validator("store")
    @classmethod
    def _store_location(cls, value: str) -> str:
        check_location(value)  # a directory or s3://bucket/prefix; gs://, http:// ... are refused here
        return value

    def served_refs(self) -> list[str]:
        """The refs of ``model``, in order: the first answers requests that name no model."""
        return self.model.split(",")

    def redacted(self) -> dict[str, Any]:
        """Settings for the startup log line: secrets are replaced by ``**********``."""
        data = self.model_dump(mode="json")
        data["api_keys"] = ["**********" for _ in self.api_keys]
        if self.redis_url is not None:
            data["redis_url"] = redact_redis_url(self.redis_url.get_secret_value())
        return data

    def redis_url_value(self) -> str | None:
        return self.redis_url.get_secret_value() if self.redis_url is not None else None

    def onnx_cache_root(self) -> Path:
        """``onnx_cache_dir``, or the user's cache folder (the container points it at /tmp)."""
        if self.onnx_cache_dir is not None:
            return self.onnx_cache_dir
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "clip-service" / "onnx"


def _cuda_device(device: str) -> bool:
    if device != "auto":
        return device == "cuda" or device.startswith("cuda:")
    import torch  # only here: settings stay importable without loading torch

    return bool(torch.cuda.is_available())
