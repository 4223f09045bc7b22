"""Seed a model-store volume from the store baked into the service image, never overwriting.

    python /opt/clip/seed_store.py --source /models --target /store --verify default@production

Each version missing from the target is copied into a staging directory inside it and renamed
into place, so a reader never sees a half-copied version. Top-level files of a model (the alias
table) are copied only when the target has none, after its versions: promotions and rollbacks
already made on the volume are kept. Running it again is a no-op. With ``--verify`` the given
reference must then resolve and match its checksums, or the exit code is 1.

An ``s3://bucket/prefix`` target (the store in object storage, k8s/overlays/s3) is filled
through the store itself: each missing version is published under its own name with its
manifest's fields, so it appears whole (manifest written last) and is checksummed on the
way, and aliases are set only on models the target has no alias for yet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from model_store import ModelStore, StoreError
from model_store.location import check_location

STAGING_PREFIX = ".staging-seed-"  # the store ignores (and gc removes) names starting with "."


def _copy_durably(src: Path, dst: Path) -> None:
    # Plain data copy, no mode bits: versions in a store may be read-only, and a read-only
    # directory could neither be renamed into place nor cleaned up after a failed run.
    with src.open("rb") as fin, dst.open("wb") as fout:
        shutil.copyfileobj(fin, fout, 1024 * 1024)
        fout.flush()
        os.fsync(fout.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    """Remove a leftover staging tree, even one whose directories lost their write bit."""
    if not path.exists():
        return
    for root, dirs, _ in os.walk(path):
        for name in [".", *dirs]:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(path)


def _copy_version(src: Path, staging: Path) -> None:
    for directory in [src, *sorted(p for p in src.rglob("*") if p.is_dir())]:
        (staging / directory.relative_to(src)).mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in src.rglob("*") if p.is_file()):
        _copy_durably(file, staging / file.relative_to(src))
    for directory in sorted((p for p in staging.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(directory)
    _fsync_dir(staging)


def _copy_file_atomically(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f"{STAGING_PREFIX}{dst.name}")
    _copy_durably(src, tmp)
    os.replace(tmp, dst)
    _fsync_dir(dst.parent)


def seed(source: Path, target: Path) -> list[str]:
    """Copy what ``target`` lacks from ``source``; returns what was copied (``name/version``)."""
    copied: list[str] = []
    for model in sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith(".")):
        versions = model / "versions"
        dest_model = target / model.name
        (dest_model / "versions").mkdir(parents=True, exist_ok=True)
        for version in sorted(p for p in versions.iterdir() if p.is_dir() and not p.name.startswith(".")):
            final = dest_model / "versions" / version.name
            if final.exists():
                continue
            staging = dest_model / f"{STAGING_PREFIX}{version.name}"
            _remove_tree(staging)
            _copy_version(version, staging)
            os.rename(staging, final)
            _fsync_dir(final.parent)
            copied.append(f"{model.name}/{version.name}")
        for entry in sorted(p for p in model.iterdir() if p.is_file() and not p.name.startswith(".")):
            if not (dest_model / entry.name).exists():
                _copy_file_atomically(entry, dest_model / entry.name)
                copied.append(f"{model.name}/{entry.name}")
    return copied


def seed_through_store(source: ModelStore, target: ModelStore) -> list[str]:
    """``seed`` for a target that is not a directory: publish what it lacks, version by version."""
    copied: list[str] = []
    present = set(target.list_models())
    for name in source.list_models():
        have = set(target.list_versions(name)) if name in present else set()
        for version in source.list_versions(name):
            if version in have:
                continue
            manifest = source.manifest(name, version)
            directory = source.version_dir(name, version)
            files = {f: directory / f for f in [*manifest.files, *source.annex_files(name, version)]}
            fields = manifest.model_dump(mode="json", exclude={"files", "version"})
            target.publish(name, files, fields, version=version)
            copied.append(f"{name}/{version}")
        if name not in present or not target.aliases(name):
            for alias, version in sorted(source.aliases(name).items()):
                target.promote(name, alias, version)
                copied.append(f"{name}@{alias}")
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="store to copy from (read-only)")
    parser.add_argument("--target", required=True, help="store volume to fill, or s3://bucket/prefix")
    parser.add_argument(
        "--verify",
        metavar="REF",
        help="name@alias that must resolve and verify afterwards; of a served set (refs separated by commas, as "
        "CLIP_MODEL takes them) the first, which the service's readiness waits for",
    )
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        print(f"seed_store: no source store at {args.source}", file=sys.stderr)
        return 1
    try:
        if check_location(args.target) is None:
            Path(args.target).mkdir(parents=True, exist_ok=True)
            copied = seed(args.source, Path(args.target))
        else:
            copied = seed_through_store(ModelStore(args.source), ModelStore(args.target))
    except StoreError as exc:
        print(f"seed_store: {exc}", file=sys.stderr)
        return 1
    print(f"seeded {len(copied)} entries: {', '.join(copied)}" if copied else "target already holds every version")
    if args.verify:
        # The other models of a set may be published later: the service serves without them.
        ref = args.verify.split(",")[0].strip()
        store = ModelStore(args.target)
        try:
            name, version = store.resolve(ref)
            store.verify(name, version)
        except StoreError as exc:
            print(f"seed_store: {ref} does not verify: {exc}", file=sys.stderr)
            return 1
        print(f"ok {ref} -> {name}@{version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
