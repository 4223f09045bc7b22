"""The two places a store can live, behind one small interface the store tests use to look
under the store (read, tamper with, list raw blobs) without going through ``ModelStore``.

``LocalRoot`` is a directory; ``S3Root`` a private prefix in a real S3 server's bucket
(loadtests/seaweed_s3.py). Raw S3 writes carry no sha256 metadata, as a blob replaced
behind the store's back would not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_store import ModelStore


class LocalRoot:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)

    def store(self) -> ModelStore:
        return ModelStore(self.location)

    def write(self, key: str, data: bytes) -> None:
        target = self.path / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def read(self, key: str) -> bytes:
        return (self.path / key).read_bytes()

    def delete(self, key: str) -> None:
        (self.path / key).unlink()

    def exists(self, key: str = "") -> bool:
        return (self.path / key).exists()

    def children(self, key: str = "") -> list[str]:
        base = self.path / key
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


class S3Root:
    def __init__(self, server: Any, location: str) -> None:
        self.location = location
        self.client = server.client()
        self.bucket, _, self.prefix = location[len("s3://") :].partition("/")

    def store(self) -> ModelStore:
        return ModelStore(self.location)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if key else self.prefix

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def read(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(key) from None

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def exists(self, key: str = "") -> bool:
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(key), MaxKeys=1)
        return any(
            o["Key"] == self._key(key) or o["Key"].startswith(self._key(key) + "/") for o in page.get("Contents", [])
        )

    def children(self, key: str = "") -> list[str]:
        base = self._key(key) + "/"
        names = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            names.update(o["Key"][len(base) :].split("/")[0] for o in page.get("Contents", []))
        return sorted(names)
