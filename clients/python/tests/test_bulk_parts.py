"""The pieces of ``clipdiff bulk`` that need no server: reading datasets by row range, the parted
output a killed run resumes from, and the shards' row blocks."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from clipdiff.bulk import open_dataset, shard_bounds  # noqa: E402
from clipdiff.bulk.output import OutputExists, PartedOutput  # noqa: E402
from clipdiff.bulk.tasks import TASKS, output_schema  # noqa: E402


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_formats_are_told_by_the_path(tmp_path: Path) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.PNG").write_bytes(b"x")
    (tmp_path / "pics" / "notes.txt").write_text("not an image")
    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "0.tar", "w") as tar:
        add(tar, "k.png", b"x")
    (tmp_path / "rows.jsonl").write_text("{}\n")
    assert open_dataset(tmp_path / "pics").kind == "folder"
    assert open_dataset(tmp_path / "pics").count() == 1  # only image files
    assert open_dataset(tmp_path / "shards").kind == "webdataset"
    assert open_dataset(tmp_path / "rows.jsonl").kind == "jsonl"
    with pytest.raises(FileNotFoundError, match="no dataset at"):
        open_dataset(tmp_path / "absent")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        open_dataset(tmp_path / "rows.csv")
    with pytest.raises(ValueError, match="unknown dataset format"):
        open_dataset(tmp_path / "rows.jsonl", "csv")


def test_webdataset_rows_from_the_middle(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i in range(3):
            add(tar, f"s/{i}.jpg", f"image {i}".encode())
            add(tar, f"s/{i}.json", json.dumps({"texts": [f"text {i}"]}).encode())
    with tarfile.open(tmp_path / "b.tar", "w") as tar:
        add(tar, "p/0.image_a.png", b"A")
        add(tar, "p/0.image_b.png", b"B")
        add(tar, "p/0.txt", b"larger")
    data = open_dataset(tmp_path, "webdataset")
    assert data.count() == 4
    rows = list(data.rows(2, 4))
    assert [(r.index, r.key) for r in rows] == [(2, "s/2"), (3, "p/0")]
    assert rows[0].fields == {"image": b"image 2", "texts": ["text 2"]}
    assert rows[1].fields == {"image_a": b"A", "image_b": b"B", "text": "larger"}


def test_parquet_rows_across_row_groups(tmp_path: Path) -> None:
    (tmp_path / "x.png").write_bytes(b"png bytes")
    table = pa.table({"id": [f"r{i}" for i in range(7)], "image": ["x.png"] * 6 + ["missing.png"]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=3)
    rows = list(open_dataset(tmp_path / "t.parquet").rows(2, 7))
    assert [r.key for r in rows] == ["r2", "r3", "r4", "r5", "r6"]
    assert rows[0].fields["image"] == b"png bytes" and rows[0].error is None
    assert rows[-1].error is not None and rows[-1].error.startswith("unreadable image: ")


def test_parts_resume_after_the_last_complete_one(tmp_path: Path) -> None:
    schema = output_schema(TASKS["rank-pairs"])
    settings = {"task": "rank-pairs", "rows": [0, 10]}
    out = PartedOutput(tmp_path / "o.parquet", schema, settings)
    assert out.resume() == 0
    out.write([{"index": i, "key": str(i), "first": "a", "score": 0.5} for i in range(4)])
    out.write([{"index": i, "key": str(i), "error": "bad"} for i in range(4, 6)])
    (out.parts / "part-000002.parquet.tmp").write_bytes(b"half a part")  # killed while writing it
    again = PartedOutput(tmp_path / "o.parquet", schema, settings)
    assert again.resume() == 6 and not list(out.parts.glob("*.tmp"))
    with pytest.raises(OutputExists, match="other settings"):
        PartedOutput(tmp_path / "o.parquet", schema, {**settings, "rows": [0, 9]}).resume()
    again.write([{"index": 6, "key": "6", "first": "b", "score": -1.0}])
    assert again.finish() == 7 and not out.parts.exists()
    assert pq.read_table(tmp_path / "o.parquet").column("index").to_pylist() == list(range(7))
    assert pq.ParquetFile(tmp_path / "o.parquet").num_row_groups == 3
    assert PartedOutput(tmp_path / "o.parquet", schema, settings).finished_rows() == 7


@pytest.mark.parametrize("total", [0, 1, 7, 100])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_shards_cover_every_row_once(total: int, count: int) -> None:
    blocks = [shard_bounds(total, (i, count)) for i in range(count)]
    covered = [row for start, stop in blocks for row in range(start, stop)]
    assert covered == list(range(total))
    with pytest.raises(ValueError, match="index must be in"):
        shard_bounds(total, (count, count))
