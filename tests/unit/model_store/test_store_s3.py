"""What only the object-store backend has: store locations, the sha256 blob cache, commit
markers, the leased lock, and alias updates from several processes, on a real S3 server."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import Root
from model_store_helpers import manifest_fields, promote_in_process, publish_simple
from store_roots import S3Root
from typer.testing import CliRunner

from model_store import (
    AliasTable,
    ChecksumMismatch,
    InvalidStoreLocation,
    ModelNotFound,
    ModelStore,
    StoreUnavailable,
    open_backend,
)
from model_store.backends.s3 import S3Backend
from model_store.cli import app


@pytest.fixture
def s3_root(s3_env: Any) -> S3Root:
    return S3Root(s3_env, s3_env.new_location())


# ------------------------------------------------------------------ locations
@pytest.mark.parametrize(
    "location",
    ["gs://bucket/models", "http://127.0.0.1:9000/models", "file:///tmp/models", "s3:/bucket/models", "S3x://b/p"],
)
def test_unknown_schemes_are_refused_never_a_local_folder(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidStoreLocation, match="s3://bucket/prefix"):
        ModelStore(location)
    result = CliRunner().invoke(app, ["--store", location, "list"])
    assert result.exit_code == 1 and result.output.startswith("error:") and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # no folder named 'gs:', 'http:' or 's3:'


def test_each_client_reads_the_aws_environment_of_its_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients share a session per AWS environment (parsing the S3 API once), so a changed
    endpoint or key pair must still reach the next client opened, and the same one a shared session."""
    from model_store.location import s3_client

    def opened(endpoint: str, key: str) -> Any:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", f"secret-{key}")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        return s3_client()

    first, again = opened("http://127.0.0.1:9101", "a"), opened("http://127.0.0.1:9101", "a")
    other_endpoint, other_key = opened("http://127.0.0.1:9102", "a"), opened("http://127.0.0.1:9101", "b")
    assert [c.meta.endpoint_url for c in (first, again, other_endpoint, other_key)] == [
        "http://127.0.0.1:9101", "http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9101",
    ]  # fmt: skip
    keys = [c._request_signer._credentials.access_key for c in (first, again, other_endpoint, other_key)]
    assert keys == ["a", "a", "a", "b"]
    assert first.meta.config.s3["addressing_style"] == "path"  # the store's own settings, on every client


def test_service_settings_refuse_unknown_schemes() -> None:
    from pydantic import ValidationError

    from service.config import Settings

    with pytest.raises(ValidationError, match="unsupported store location"):
        Settings(store="gs://bucket/models")
    assert Settings(store="s3://bucket/models").store == "s3://bucket/models"


@pytest.mark.parametrize("location", ["s3://", "s3://UPPER/x", "s3://b", "s3://bucket/a//b", "s3://bucket/../x"])
def test_malformed_s3_locations(location: str) -> None:
    with pytest.raises(InvalidStoreLocation):
        open_backend(location)


def test_credentials_in_the_location_are_refused_without_echoing_them() -> None:
    with pytest.raises(InvalidStoreLocation) as info:
        open_backend("s3://AKIAEXAMPLE:supersecret@bucket/models")
    assert "supersecret" not in str(info.value) and "AWS" in str(info.value)


@pytest.mark.slow
def test_locations_map_to_backends(tmp_path: Path, s3_env: Any) -> None:
    assert str(ModelStore(tmp_path).backend.local_path("")) == str(tmp_path)
    backend = open_backend("s3://some-bucket/team/models/", cache_dir=tmp_path / "cache")
    assert isinstance(backend, S3Backend)
    assert (backend.bucket, backend.prefix, backend.cache.root) == ("some-bucket", "team/models", tmp_path / "cache")
    assert "secret" not in repr(backend).lower() and s3_env.secret_key not in repr(backend)


@pytest.mark.slow
def test_missing_bucket_is_a_clear_store_error(s3_env: Any) -> None:
    store = ModelStore("s3://no-such-bucket-here/models")
    with pytest.raises(StoreUnavailable, match="s3://no-such-bucket-here/models: NoSuchBucket"):
        store.list_models()
    result = CliRunner().invoke(app, ["--store", "s3://no-such-bucket-here/models", "list"])
    assert result.exit_code == 1 and "NoSuchBucket" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------ cache
def _count_gets(store: ModelStore) -> list[str]:
    """Keys of every GetObject the store's client sends from now on."""
    keys: list[str] = []
    backend = store.backend
    assert isinstance(backend, S3Backend)
    backend.client.meta.events.register(
        "before-call.s3.GetObject", lambda params, **_: keys.append(params["url_path"].rsplit("/", 1)[-1])
    )
    return keys


@pytest.mark.slow
def test_restart_reuses_the_cache_without_downloading_weights(s3_root: S3Root, tmp_path: Path) -> None:
    weights = bytes(range(256)) * 4096  # 1 MiB
    s3_root.store().publish("clip", {"model.safetensors": weights, "text.safetensors": b"t" * 1000}, manifest_fields())
    cache_dir = tmp_path / "pod-cache"

    first = ModelStore(open_backend(s3_root.location, cache_dir))
    gets = _count_gets(first)
    _, directory = first.load_verified("clip", "v1")
    assert (directory / "model.safetensors").read_bytes() == weights
    assert first.backend.cache.fills == 3  # type: ignore[attr-defined]  # both weights and the manifest
    assert gets.count("model.safetensors") == 1

    restarted = ModelStore(open_backend(s3_root.location, cache_dir))  # a new process on the same node
    gets = _count_gets(restarted)
    _, directory = restarted.load_verified("clip", "v1")
    assert (directory / "model.safetensors").read_bytes() == weights
    cache = restarted.backend.cache  # type: ignore[attr-defined]
    assert cache.fills == 0 and cache.hits >= 2
    assert [key for key in gets if key.endswith(".safetensors")] == []
    digests = {entry.sha256 for entry in restarted.manifest("clip", "v1").files.values()}
    assert digests <= {p.name for p in (cache_dir / "blobs").iterdir()}


def _count_calls(store: ModelStore) -> Counter[str]:
    """Every S3 operation the store's client sends from now on, by name."""
    calls: Counter[str] = Counter()
    backend = store.backend
    assert isinstance(backend, S3Backend)
    backend.client.meta.events.register("before-call.s3", lambda model, **_: calls.update([model.name]))
    return calls


@pytest.mark.slow
def test_a_load_reads_each_file_once_and_a_warm_node_downloads_nothing(s3_root: S3Root, tmp_path: Path) -> None:
    files = {"model.safetensors": b"w" * 5000, "text.safetensors": b"t" * 1000, "tokenizer.json": b"{}"}
    s3_root.store().publish("clip", files, manifest_fields())
    cache_dir = tmp_path / "pod-cache"

    cold = ModelStore(open_backend(s3_root.location, cache_dir))
    calls = _count_calls(cold)
    manifest, directory = cold.load_verified("clip", "v1")
    assert {name: (directory / name).read_bytes() for name in files} == files
    # The manifest and the three files: one GET each (verification reads the downloaded copies),
    # a HEAD each for the digest that keys the node's cache, one for the version, one listing.
    assert dict(calls) == {"GetObject": 4, "HeadObject": 5, "ListObjectsV2": 1}

    warm = ModelStore(open_backend(s3_root.location, cache_dir))  # a restart on the same node
    calls = _count_calls(warm)
    assert warm.load_verified("clip", "v1")[0] == manifest
    assert "GetObject" not in calls and calls["HeadObject"] == 5  # everything, manifest included, from the cache


@pytest.mark.slow
def test_gc_deletes_a_version_without_copying_it(s3_root: S3Root) -> None:
    store = s3_root.store()
    for i in range(3):
        publish_simple(store, bytes([i]) * 1000)
    calls = _count_calls(store)
    assert store.gc("clip", keep_latest=1) == ["v1", "v2"]
    assert "CopyObject" not in calls and "UploadPartCopy" not in calls  # no O(size) server-side copies
    assert store.list_versions("clip") == ["v3"] and s3_root.children("clip/versions") == ["v3"]
    store.verify("clip", "v3")


@pytest.mark.slow
def test_gc_aborts_the_upload_a_killed_publish_left_incomplete(s3_root: S3Root) -> None:
    """A publish killed while a large file is uploading leaves that file as an incomplete
    multipart upload: its parts take space but appear in no listing. Removing the staging
    prefix aborts it."""
    store = s3_root.store()
    publish_simple(store, b"one", aliases=["production"])
    # The leftover as the upload writes it: files already staged, then the next one begun in
    # parts (what boto3 does above 8 MiB) and never completed.
    staging = "clip/.staging-0123456789abcdef"
    s3_root.write(f"{staging}/comparatives.json", b"[]")
    key = f"{s3_root.prefix}/{staging}/model.safetensors"
    upload = s3_root.client.create_multipart_upload(Bucket=s3_root.bucket, Key=key)
    s3_root.client.upload_part(
        Bucket=s3_root.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"\0" * (5 << 20)
    )

    def incomplete() -> list[str]:
        listing = s3_root.client.list_multipart_uploads(Bucket=s3_root.bucket, Prefix=f"{s3_root.prefix}/clip/")
        return [u["Key"] for u in listing.get("Uploads", [])]

    assert store.gc("clip") == [] and incomplete() == [key]  # young: may be a publish still running
    assert store.gc("clip", staging_grace_s=0) == [".staging-0123456789abcdef"]
    assert incomplete() == [] and not s3_root.exists(staging)
    assert store.list_versions("clip") == ["v1"]


@pytest.mark.slow
def test_cache_admits_only_blobs_matching_their_digest(s3_root: S3Root, tmp_path: Path) -> None:
    s3_root.store().publish("clip", {"model.safetensors": b"good weights"}, manifest_fields())
    store = ModelStore(open_backend(s3_root.location, tmp_path / "cache"))
    entry = store.manifest("clip", "v1").files["model.safetensors"]
    # Replaced behind the store's back, still claiming the old digest.
    s3_root.client.put_object(
        Bucket=s3_root.bucket,
        Key=f"{s3_root.prefix}/clip/versions/v1/model.safetensors",
        Body=b"evil weights",
        Metadata={"sha256": entry.sha256},
    )
    with pytest.raises(ChecksumMismatch) as info:
        store.verify("clip", "v1")
    assert info.value.problems == {"model.safetensors": "sha256 mismatch"}
    cache = store.backend.cache  # type: ignore[attr-defined]
    assert cache.rejected == 1 and cache.fills == 0
    assert not (tmp_path / "cache" / "blobs" / entry.sha256).exists()
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []  # the download was not left behind


# ------------------------------------------------------------------ visibility
@pytest.mark.slow
def test_a_version_without_its_commit_marker_is_invisible_and_replaceable(s3_root: S3Root) -> None:
    store = s3_root.store()
    publish_simple(store, b"one")
    # What an interrupted commit leaves: files copied, manifest (the marker) not yet written.
    s3_root.write("clip/versions/v2/model.safetensors", b"half")
    assert store.list_versions("clip") == ["v1"]
    with pytest.raises(ModelNotFound):
        store.resolve("clip@v2")
    assert publish_simple(store, b"two") == "v2"
    assert s3_root.read("clip/versions/v2/model.safetensors") == b"two"
    store.verify("clip", "v2")


@pytest.mark.slow
def test_local_copies_follow_annex_updates(s3_root: S3Root, tmp_path: Path) -> None:
    store = ModelStore(open_backend(s3_root.location, tmp_path / "cache"))
    publish_simple(store)
    assert store.write_annex("clip", "v1", "eval.json", b'{"acc": 0.1}').read_bytes() == b'{"acc": 0.1}'
    path = store.write_annex("clip", "v1", "eval.json", b'{"acc": 0.9}')
    assert (
        json.loads(store.file_path("clip", "v1", "eval.json").read_text())
        == {"acc": 0.9}
        == json.loads(path.read_text())
    )


# ------------------------------------------------------------------ locking
@pytest.mark.slow
def test_a_dead_holders_lock_is_taken_over_after_its_lease(s3_root: S3Root, tmp_path: Path) -> None:
    backend = open_backend(s3_root.location, tmp_path / "cache")
    assert isinstance(backend, S3Backend)
    backend.lease_s = 1.0
    # A holder that crashed: the lock object is there and nobody renews it.
    s3_root.write("clip/.lock", json.dumps({"owner": "crashed", "lease_s": 1.0}).encode())
    with backend.lock("clip/.lock"):
        holder = json.loads(s3_root.read("clip/.lock"))
        assert holder["owner"] != "crashed"
    assert not s3_root.exists("clip/.lock")  # released


@pytest.mark.slow
def test_the_lock_excludes_other_holders(s3_root: S3Root, tmp_path: Path) -> None:
    backend = open_backend(s3_root.location, tmp_path / "cache")
    inside: list[int] = []
    overlaps: list[int] = []
    counter_lock = threading.Lock()

    def critical(i: int) -> None:
        with backend.lock("clip/.lock"):
            with counter_lock:
                inside.append(i)
                if len(inside) > 1:
                    overlaps.append(i)
            threading.Event().wait(0.05)
            with counter_lock:
                inside.remove(i)

    threads = [threading.Thread(target=critical, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [] and inside == []


# ------------------------------------------------------------------ concurrent promotes
@pytest.mark.slow
def test_concurrent_promotes_from_processes_never_tear_or_lose_the_alias_table(root: Root) -> None:
    store = root.store()
    for payload in (b"one", b"two", b"three"):
        publish_simple(store, payload)
    torn: list[str] = []
    stop = threading.Event()

    def read_continuously() -> None:
        while not stop.is_set():
            try:
                raw = root.read("clip/aliases.json")
            except FileNotFoundError:  # before the first promote
                continue
            try:
                AliasTable.model_validate_json(raw)
            except ValueError:
                torn.append(raw.decode(errors="replace"))

    reader = threading.Thread(target=read_continuously)
    reader.start()
    # Separate processes, as separate pods would be (they inherit the S3 environment).
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=promote_in_process, args=(root.location, "clip", f"alias{i}", f"v{i % 3 + 1}"))
        for i in range(6)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=180)
    finally:
        stop.set()
        reader.join()
    assert [p.exitcode for p in processes] == [0] * 6
    assert torn == []
    assert store.aliases("clip") == {f"alias{i}": f"v{i % 3 + 1}" for i in range(6)}
