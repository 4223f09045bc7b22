"""``clipdiff bulk``: whole datasets scored through a real server into Parquet, resumably.

One real uvicorn serves the tiny model with a DCSM scorer; each command reads a small dataset
of its own format (folder, JSONL, Parquet, WebDataset) with a bad row in it, and its answers are
checked against the SDK's own calls for the same images. The command line runs as a separate
process: killed with SIGKILL halfway and started again it leaves every row exactly once, and it
draws a progress bar on a pseudo-terminal but plain lines into a pipe (these start Python
processes, so they are marked slow).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pty
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("rich")

from clipdiff import Client  # noqa: E402
from clipdiff.bulk import BulkOptions, run, shard_bounds  # noqa: E402
from clipdiff.bulk.output import OutputExists  # noqa: E402

SDK = Path(__file__).resolve().parents[2] / "clients" / "python"
SHAPES = ("circle", "square", "cross")
COLOURS = ("red", "blue")
LARGER = "The first image contains a larger shape, while the second contains a smaller shape."


@pytest.fixture(scope="module")
def pictures(make_image: Any) -> list[bytes]:
    sizes = ("small", "large")
    return [base64.b64decode(make_image(SHAPES[i % 3], COLOURS[i % 2], sizes[i % 2], px=64)["data"]) for i in range(24)]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any, serve_app: Any) -> Iterator[str]:
    store = tmp_path_factory.mktemp("bulk-store")
    publish_dense_model(store)
    with serve_app(store=str(store), model="dense@production") as running:
        yield running.url


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[Client]:
    with Client(url, timeout=120) as c:
        yield c


def image_folder(root: Path, pictures: list[bytes], count: int) -> Path:
    """``count`` PNGs named 000.png ... in nested folders, and a file that is not an image last."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        path = root / f"part{i // 10}" / f"{i:03d}.png"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(pictures[i % len(pictures)])
    (root / "zz_broken.png").write_bytes(b"this is not a picture")
    return root


def read(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def test_embed_a_folder(tmp_path: Path, pictures: list[bytes], url: str, client: Client) -> None:
    folder = image_folder(tmp_path / "images", pictures, 23)
    summary = run(
        "embed", folder, tmp_path / "out.parquet", base_url=url, progress="none", batch_size=4, row_group_rows=8
    )
    rows = read(tmp_path / "out.parquet")
    assert [r["index"] for r in rows] == list(range(24))
    assert rows[0]["key"] == "part0/000.png" and rows[-1]["key"] == "zz_broken.png"
    assert rows[-1]["embedding"] is None and rows[-1]["error"].startswith("bad_image: ")
    assert all(r["error"] is None for r in rows[:-1])
    expected = client.embed_images(pictures[:23], as_numpy=True)
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows[:-1]]), expected.embeddings, atol=1e-5)
    assert [r["image_sha256"] for r in rows[:-1]] == expected.ids
    assert {r["model"] for r in rows[:-1]} == {expected.model}
    assert (summary.rows, summary.scored, summary.resumed, dict(summary.failed)) == (24, 24, 0, {rows[-1]["error"]: 1})
    assert pq.ParquetFile(tmp_path / "out.parquet").num_row_groups == 3  # 8 rows each
    assert not (tmp_path / "out.parquet.parts").exists()
    again = run("embed", folder, tmp_path / "out.parquet", base_url=url, progress="none")
    assert again.already_finished and again.scored == 0


def test_classify_jsonl_with_bad_lines(tmp_path: Path, pictures: list[bytes], url: str, client: Client) -> None:
    (tmp_path / "img").mkdir()
    lines = []
    for i in range(6):
        (tmp_path / "img" / f"{i}.png").write_bytes(pictures[i])
        lines.append(json.dumps({"id": f"item-{i}", "image": f"img/{i}.png"}))
    lines.insert(2, "{not json")
    lines.append(json.dumps({"id": "gone", "image": "img/missing.png"}))
    lines.append(json.dumps({"id": "no-image"}))
    lines.append(json.dumps({"id": "never-seen", "image": {"sha256": "0" * 64}}))
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n\n")
    labels = ("circle", "square", "cross")
    run("classify", tmp_path / "data.jsonl", tmp_path / "out.parquet", base_url=url, progress="none",
        options=BulkOptions(labels=labels))  # fmt: skip
    rows = read(tmp_path / "out.parquet")
    assert [r["key"] for r in rows] == ["item-0", "item-1", "2", "item-2", "item-3", "item-4", "item-5", "gone",
                                        "no-image", "never-seen"]  # fmt: skip
    assert rows[2]["error"].startswith("line 3 is not JSON")
    assert rows[7]["error"].startswith("unreadable image: ") and rows[8]["error"] == "no image in this row"
    assert rows[9]["error"].startswith("unknown_image: ")  # the server's 404 for this row alone
    good = [r for r in rows if r["error"] is None]
    expected = client.classify(pictures[:6], list(labels))
    assert [r["label"] for r in good] == expected.labels
    probabilities = [p for r in good for p in r["top_k_probabilities"]]
    assert probabilities == pytest.approx([s.probability for x in expected.results for s in x.top_k], abs=1e-6)


def test_rank_pairs_parquet(tmp_path: Path, pictures: list[bytes], url: str, client: Client) -> None:
    pairs = [(pictures[i], pictures[i + 1]) for i in range(0, 10, 2)]
    differences = [LARGER, None, LARGER, "The first image is bluer, while the second is redder.", None]
    table = pa.table({"image_a": [a for a, _ in pairs], "image_b": [b for _, b in pairs], "difference": differences})
    pq.write_table(table, tmp_path / "pairs.parquet", row_group_size=2)
    run("rank-pairs", tmp_path / "pairs.parquet", tmp_path / "out.parquet", base_url=url, progress="none",
        options=BulkOptions(difference=LARGER))  # fmt: skip
    rows = read(tmp_path / "out.parquet")
    expected = client.rank_pairs([(a, b, d or LARGER) for (a, b), d in zip(pairs, differences, strict=True)])
    assert [r["first"] for r in rows] == [e.first for e in expected]
    assert [r["score"] for r in rows] == pytest.approx([e.score for e in expected], abs=1e-5)
    assert [r["key"] for r in rows] == ["0", "1", "2", "3", "4"]


def wds_shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_score_dense_webdataset(tmp_path: Path, pictures: list[bytes], url: str, client: Client) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    captions = ["a red circle", "a blue square", "no cross"]
    wds_shard(shards / "s-000.tar", [(f"s0/{i}", {"png": pictures[i], "txt": captions[i].encode()}) for i in range(3)])
    wds_shard(shards / "s-001.tar", [
        ("s1/0", {"jpg": pictures[3], "json": json.dumps({"texts": ["a cross", "a circle"]}).encode()}),
        ("s1/1", {"png": b"broken", "txt": b"a red circle"}),
        ("s1/2", {"json": b"{}"}),
    ])  # fmt: skip
    summary = run("score-dense", shards, tmp_path / "out.parquet", base_url=url, progress="none",
                  options=BulkOptions(texts=("a shape",)))  # fmt: skip
    rows = read(tmp_path / "out.parquet")
    assert [r["key"] for r in rows] == ["s0/0", "s0/1", "s0/2", "s1/0", "s1/1", "s1/2"]
    assert rows[3]["texts"] == ["a cross", "a circle", "a shape"]
    for row, image in zip(rows[:4], pictures[:4], strict=True):
        expected = client.score_dense(image, row["texts"])
        assert row["scores"] == pytest.approx(expected.scores, abs=1e-5) and row["best"] == expected.best
    assert rows[4]["error"].startswith("bad_image: ") and rows[5]["error"] == "no image in this row"
    assert sum(summary.failed.values()) == 2


def test_shards_of_a_run_cover_every_row_once(tmp_path: Path, pictures: list[bytes], url: str) -> None:
    folder = image_folder(tmp_path / "images", pictures, 10)
    for i in range(3):
        run("embed", folder, tmp_path / f"out-{i}.parquet", base_url=url, progress="none", shard=(i, 3))
    merged = pa.concat_tables([pq.read_table(tmp_path / f"out-{i}.parquet") for i in range(3)])
    assert merged.column("index").to_pylist() == list(range(11))
    assert [shard_bounds(11, (i, 3)) for i in range(3)] == [(0, 3), (3, 7), (7, 11)]


def test_an_output_of_other_settings_is_refused(tmp_path: Path, pictures: list[bytes], url: str) -> None:
    folder = image_folder(tmp_path / "images", pictures, 3)
    run("embed", folder, tmp_path / "out.parquet", base_url=url, progress="none")
    labels = BulkOptions(labels=("circle", "square"))
    with pytest.raises(OutputExists, match="written by another run"):
        run("classify", folder, tmp_path / "out.parquet", base_url=url, progress="none", options=labels)
    replaced = run("classify", folder, tmp_path / "out.parquet", base_url=url, progress="none", options=labels,
                   overwrite=True)  # fmt: skip
    assert replaced.scored == 4 and "label" in pq.read_schema(tmp_path / "out.parquet").names


# ----------------------------------------------------------------------------- the command line
def cli_env() -> dict[str, str]:
    # The SDK of this checkout, whatever clipdiff the interpreter has installed.
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")])}


def cli_args(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "clipdiff", "bulk", *args[:1], "--url", url, *args[1:]]


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_args(url, *args), capture_output=True, text=True, env=cli_env(), timeout=120)


@pytest.fixture(scope="module")
def slow_url(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any, serve_app: Any) -> Iterator[str]:
    """A server whose /embed answers 40 ms late, so that a run of 200 rows lasts long enough to be
    killed in its middle."""
    import asyncio

    store = tmp_path_factory.mktemp("bulk-slow-store")
    publish_dense_model(store)

    def late(app: Any) -> Any:
        async def wrapped(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == "/embed":
                await asyncio.sleep(0.04)
            await app(scope, receive, send)

        return wrapped

    with serve_app(store=str(store), model="dense@production", wrap=late) as running:
        yield running.url


@pytest.mark.slow
def test_a_killed_run_resumes_with_every_row_once(tmp_path: Path, pictures: list[bytes], slow_url: str) -> None:
    folder = image_folder(tmp_path / "images", pictures, 199)
    out = tmp_path / "out.parquet"
    args = cli_args(slow_url, "embed", "--input", str(folder), "--output", str(out), "--batch-size", "4",
                    "--row-group-rows", "12", "--concurrency", "2", "--progress", "plain")  # fmt: skip
    first = subprocess.Popen(args, env=cli_env(), stderr=subprocess.DEVNULL)
    parts = tmp_path / "out.parquet.parts"
    deadline = time.monotonic() + 60
    while len(list(parts.glob("part-*.parquet"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    written = sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet"))
    assert 0 < written < 200 and not out.exists()  # killed halfway: some rows, not all

    second = subprocess.run(args, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert f"{written} resumed" in second.stderr
    rows = read(out)
    assert [r["index"] for r in rows] == list(range(200))
    assert len({r["key"] for r in rows}) == 200
    assert sum(r["error"] is not None for r in rows) == 1 and rows[-1]["key"] == "zz_broken.png"
    assert not parts.exists()


@pytest.mark.slow
def test_plain_progress_lines_when_piped(tmp_path: Path, pictures: list[bytes], url: str) -> None:
    folder = image_folder(tmp_path / "images", pictures, 12)
    done = cli(url, "embed", "--input", str(folder), "--output", str(tmp_path / "out.parquet"), "--batch-size", "2",
               "--progress-interval", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = re.findall(r"^embed: (\d+)/13 rows \([\d.]+ %\), [\d.]+ rows/s, ETA [\d:?]+$", done.stderr, re.M)
    assert len(lines) >= 2 and lines[-1] == "13"
    assert "\x1b[" not in done.stderr  # no escape codes in a log
    assert "13 rows in" in done.stderr and "1 failed" in done.stderr and "1 x bad_image" in done.stderr


@pytest.mark.slow
def test_progress_bar_on_a_terminal(tmp_path: Path, pictures: list[bytes], url: str) -> None:
    folder = image_folder(tmp_path / "images", pictures, 12)
    terminal, child_end = pty.openpty()
    process = subprocess.Popen(
        cli_args(url, "embed", "--input", str(folder), "--output", str(tmp_path / "out.parquet")),
        env={**cli_env(), "TERM": "xterm-256color", "COLUMNS": "120"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=child_end,
    )
    os.close(child_end)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    assert process.wait(timeout=60) == 0
    text = shown.decode("utf-8", "replace")
    assert "\x1b[" in text and "━" in text  # drawn with escape codes and a bar
    assert re.search(r"13/13", text) and "rows/s" in text and "ETA" in text
    assert not re.search(r"^embed: \d+/13 rows", text, re.M)  # not the plain lines


@pytest.mark.slow
def test_unusable_arguments_exit_2(tmp_path: Path, pictures: list[bytes], url: str) -> None:
    folder = image_folder(tmp_path / "images", pictures, 3)
    one_label = cli(url, "classify", "--labels", "circle", "--input", str(folder), "--output", "x.parquet")
    assert one_label.returncode == 2 and "at least two labels" in one_label.stderr
    nothing = cli(url, "embed", "--input", str(tmp_path / "absent"), "--output", "x.parquet")
    assert nothing.returncode == 2 and "no dataset at" in nothing.stderr
