"""The cache, backend and service-vs-naive benchmarks run end to end and print complete tables (tiny sizes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, env_extra: dict[str, str] | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    module = f"loadtests.{name.removesuffix('.py')}"
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=240, cwd=REPO, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def table(output: str) -> list[list[str]]:
    rows = [line.strip("|").split("|") for line in output.splitlines() if re.match(r"^\| [^-]", line)]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # without the header


def test_bench_cache_measures_both_layers_against_its_own_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    rows = table(run_script("bench_cache.py", "--n", "200", "--warmup", "20", "--keys", "1", "20", "--dim", "64"))
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("lru", "1", "200"), ("lru", "20", "200"), ("redis", "1", "200"), ("redis", "20", "200"),
    ]  # fmt: skip
    for layer, _, _, p50, p95, p99, worst, misses in rows:
        assert 0 < float(p50) <= float(p95) <= float(p99) <= float(worst), layer
        assert misses == "0", layer  # every stored key came back: Redis really answered


@pytest.mark.slow
def test_bench_backends_reports_parity_and_throughput(tiny_store: Path) -> None:
    # With fbgemm held to its AVX2 kernels (what an AVX2-only CPU runs): the header says so, int8 passes.
    out = run_script("bench_backends.py", "--store", str(tiny_store), "--model", "tiny@production",
                     "--batch-sizes", "1", "4", "--min-seconds", "0.05", "--rounds", "1", "--threads", "1",
                     env_extra={"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"})  # fmt: skip
    rows = table(out)
    backends = ["torch fp32", "torch bf16", "onnx", "torch int8", "onnx int8"]
    assert [(r[0], r[2]) for r in rows] == [(b, bs) for b in backends for bs in ("1", "4")]
    for backend, parity, _, rate, _ in rows:
        assert float(rate) > 0
        if backend != "torch fp32":
            assert float(parity) >= 0.999, backend
    assert "ONNX export of 2 text tower(s)" in out  # base and the pcclip variant
    assert re.search(r"^torch kernels \w+; FBGEMM_ENABLE_INSTRUCTIONS=AVX2$", out, re.M), out
    bound = re.search(r"fp32 bound here: ([\d.e-]+) GFLOP per image, fp32 matmul peak (\d+) GFLOP/s .* at most "
                      r"([\d.]+) images/s", out)  # fmt: skip
    assert bound, out
    gflop, peak, most = (float(g) for g in bound.groups())
    # The peak is printed to the GFLOP/s (up to 0.5 off): on a busy machine, whose peak is a dozen
    # GFLOP/s, that rounding alone is a few per cent of the bound.
    assert gflop > 0 and peak > 0 and most == pytest.approx(peak / gflop, rel=0.01 + 0.5 / peak)
    shares = re.findall(r"^  (torch fp32|onnx) batch (\d+): [\d.]+ images/s = (\d+)% of the fp32 bound", out, re.M)
    assert sorted((b, bs) for b, bs, _ in shares) == [
        ("onnx", "1"),
        ("onnx", "4"),
        ("torch fp32", "1"),
        ("torch fp32", "4"),
    ]


@pytest.mark.slow
def test_the_fp32_bound_counts_every_matrix_product_of_a_vit_b_32() -> None:
    """8.73 GFLOP per image: the twelve blocks' projections and MLPs on 50 tokens, the 32 px patch
    convolution and the output projection, 2 FLOP per multiply-add (open_clip's table: 4.41 GMACs
    with the attention scores, which torch's counter leaves out on the CPU)."""
    import open_clip

    from loadtests.bench_backends import image_flops

    model = open_clip.create_model("ViT-B-32").eval()
    width, tokens, layers = 768, 50, 12
    blocks = layers * tokens * (4 * width * width + 2 * width * 4 * width)
    patches = 49 * (3 * 32 * 32) * width
    projection = width * 512
    assert image_flops(model, 224) == 2 * (blocks + patches + projection)


@pytest.mark.slow
def test_benchmark_runs_service_and_naive_server_with_the_services_backend_as_ceiling(tiny_store: Path) -> None:
    out = run_script("benchmark.py", "--store", str(tiny_store), "--model", "tiny@production", "--duration", "1",
                     "--concurrency", "2", "--batch-sizes", "1", "4", "--torch-threads", "1", "--ceiling-seconds",
                     "0.2", env_extra={"CLIP_BACKEND": "onnx", "CLIP_PRECISION": "int8"})  # fmt: skip
    assert "service backend onnx int8" in out
    ceiling, results = (table(part) for part in out.split("ceiling:"))
    assert [row[0] for row in ceiling] == ["1", "4"]
    assert all(float(cell) > 0 for row in ceiling for cell in row[1:])
    assert [(row[0], row[1]) for row in results] == [("/classify", "2"), ("/rank-pair", "2")]
    for row in results:
        naive, service = float(row[2]), float(row[3])
        assert naive > 0 and service > 0 and row[-1] == "0/0", row  # both answered, without errors


@pytest.mark.slow
def test_bench_backends_adds_the_dense_table_for_a_dcsm_version(tmp_path: Path, publish_dense_model: Any) -> None:
    publish_dense_model(tmp_path)
    out = run_script("bench_backends.py", "--store", str(tmp_path), "--model", "dense@production",
                     "--batch-sizes", "2", "--min-seconds", "0.05", "--rounds", "1", "--threads", "1")  # fmt: skip
    dense = table(out.split("DCSM dense image features")[1])
    assert [row[0] for row in dense] == ["torch fp32", "onnx", "onnx int8"]
    for backend, parity, batch, rate, _ in dense:
        assert batch == "2" and float(rate) > 0
        if backend != "torch fp32":
            assert float(parity) >= 0.999, backend


@pytest.mark.slow
def test_soak_samples_the_servers_rss_under_unique_traffic(tiny_store: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "loadtests.soak", "--store", str(tiny_store), "--model", "tiny@production",
           "--duration", "4", "--concurrency", "2", "--threads", "1", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    statuses = re.search(r"statuses (\{.*\})", proc.stdout)
    assert statuses and set(eval(statuses.group(1))) == {200}, proc.stdout  # every request answered
    samples = (tmp_path / "soak_rss.csv").read_text().splitlines()
    assert samples[0] == "seconds,rss_mib" and len(samples) >= 4  # about one sample a second
    assert all(float(line.split(",")[1]) > 50 for line in samples[1:])  # a real process's RSS
    assert (tmp_path / "soak_rss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "slope over the second half" in proc.stdout


@pytest.mark.slow
def test_bench_collections_searches_real_embeddings_with_recall_per_query_kind(tmp_path: Path) -> None:
    # Real photos and scenes through the committed default model, padded with noisy copies; the
    # exact store must find numpy's true top 10 (the ids line up), the approximate indexes report
    # recall per query kind, and a second run reuses the file instead of embedding again.
    vectors = tmp_path / "real.npz"
    args = ["--vectors", str(vectors), "--backends", "embedded,faiss-hnsw,faiss-ivf", "--queries", "10",
            "--faiss-ef-search", "8,64", "--ivf-probe", "2"]  # fmt: skip
    out = run_script("bench_collections.py", *args, "--fashion", "200", "--shapes", "100", "--held-out", "20",
                     "--threads", "1", "--grow", "500")  # fmt: skip
    assert "embedded with default@production" in out
    assert "300 real vectors (200 photos, 100 scenes), grown to 500 with noisy copies" in out
    assert "queries: 40 held-out images, 60 captions" in out  # 20 scene captions + 10 labels x 4 templates
    # The report's rows: a name padded to its column, then the figures, recall@10 and its query count last.
    table_rows = re.findall(r"^((?:embedded|faiss)\S*(?: \S+)*) {2,}(\d.* \(\d+\))$", out, re.M)
    rows = {name: figures.split() for name, figures in table_rows}
    assert rows["embedded"][-3:] == ["1.0000", "1.0000", "(10)"]  # filtered (shard = 3) and plain
    hnsw = "faiss hnsw m=32 efc=40 ef_search=64"
    assert rows[hnsw][-1] == "(100)" and float(rows[hnsw][-2]) >= 0.9  # 500 vectors: efSearch 64 finds nearly all
    assert set(rows) == {"embedded", "faiss hnsw m=32 efc=40 ef_search=8", hnsw, "faiss ivf lists=89 nprobe=2"}
    kinds = re.search(rf"^{hnsw} +recall@10 by query: (\w+) [\d.]+ \((\d+)\), (\w+) [\d.]+ \((\d+)\)$", out, re.M)
    assert kinds is not None, out
    assert {kinds[1]: kinds[2], kinds[3]: kinds[4]} == {"image": "40", "text": "60"}
    again = run_script("bench_collections.py", *args)
    assert "embedded with" not in again and "300 real vectors (200 photos, 100 scenes); queries" in again


def test_the_peer_model_folder_gets_open_clips_exact_vocabulary() -> None:
    import json

    import open_clip

    from loadtests.peer.hf_clip_folder import clip_config, clip_vocab

    package = Path(open_clip.__file__).parent
    vocab, merges = clip_vocab(package / "bpe_simple_vocab_16e6.txt.gz")
    reference = open_clip.tokenizer.SimpleTokenizer()
    ordinary = {t: i for t, i in reference.encoder.items() if i < 49406}
    assert len(vocab) == 49408 and {t: i for t, i in vocab.items() if i < 49406} == ordinary  # same ids
    assert (vocab["<|startoftext|>"], vocab["<|endoftext|>"]) == (49406, 49407)  # HF's names for the specials
    assert len(merges) == 49152 - 256 - 2
    cfg = clip_config(json.loads((package / "model_configs" / "ViT-B-32.json").read_text()))
    assert cfg["vision_config"] == {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                    "num_attention_heads": 12, "image_size": 224, "patch_size": 32}  # fmt: skip
    assert (cfg["projection_dim"], cfg["text_config"]["hidden_size"], cfg["text_config"]["vocab_size"]) == (
        512,
        512,
        49408,
    )


@pytest.mark.slow
def test_gpu_benchmarks_say_clearly_that_there_is_no_gpu() -> None:
    """Each GPU benchmark, on a machine without one, exits 2 with what to do and measures nothing;
    bench_cuda asked for the CPU points to bench_backends. The four start at once (each process
    spends its seconds importing torch and open_clip)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the benchmarks would measure it (run them by hand)")
    runs = {
        "bench_cuda": (["loadtests.bench_cuda", "--arch", "ViT-B-32"], {}),
        "benchmark": (["loadtests.benchmark", "--store", "models", "--duration", "1"], {"CLIP_DEVICE": "cuda"}),
        "peer.benchmark": (["loadtests.peer.benchmark", "--device", "cuda:0"], {}),
        "bench_cuda on the CPU": (["loadtests.bench_cuda", "--device", "cpu"], {}),
    }
    base_env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = {
        label: subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**base_env, **env_extra},
        )  # fmt: skip
        for label, (args, env_extra) in runs.items()
    }
    for label, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert "Traceback" not in err and "|" not in out, (label, err)  # no table: nothing was measured
        if label == "bench_cuda on the CPU":
            assert proc.returncode == 1 and "on a CPU use bench_backends" in err, (label, err)
        else:
            assert proc.returncode == 2, (label, err)
            assert "no CUDA GPU here" in err and "nothing measured" in err, (label, err)


@pytest.mark.slow
def test_bench_single_splits_a_lone_requests_latency_against_the_batch_1_ceiling(tiny_store: Path) -> None:
    out = run_script("bench_single.py", "--store", str(tiny_store), "--model", "tiny@production", "--duration", "1",
                     "--rounds", "1", "--threads", "1", "--ceiling-seconds", "0.2")  # fmt: skip
    (row,) = table(out)
    label, per_round, ceiling, share, p50, model, outside, direct = row
    assert label == "this tree" and float(per_round) > 0 and float(ceiling) > 0
    assert 0 < float(share.strip("*%")) and 0 < float(model) <= float(p50) and float(outside) >= 0 < float(direct)
    assert "backend torch fp32" in out


@pytest.mark.slow
def test_bench_shadow_compares_primary_latency_with_the_shadow_off_and_on(tiny_store: Path) -> None:
    out = run_script("bench_shadow.py", "--store", str(tiny_store), "--model", "tiny@production", "--requests", "12",
                     "--rounds", "1", "--warmup", "2", "--fraction", "1.0", "--threads", "1",
                     "--think-ms", "30")  # fmt: skip
    rows = table(out)
    assert [(r[0], r[1]) for r in rows] == [("off", "12"), ("on", "12")]
    for _, _, p50, p99, mean in rows:
        assert 0 < float(p50) <= float(p99) and float(mean) > 0
    assert re.search(r"^ratio on / off: p50 [\d.]+, p99 [\d.]+, mean [\d.]+$", out, re.M), out
    # At fraction 1 every request is sampled (and run in the clients' pauses: shadow runs wait for
    # gaps in the traffic); the copy agrees with the answers sent.
    shadow = re.search(r"^shadow: 14 of 14 requests sampled \((\d+) compared, (\d+) dropped, 0 failed\), mean cosine "
                       r"to the answers sent ([\d.]+)", out, re.M)  # fmt: skip
    assert shadow, out
    assert int(shadow[1]) > 0 and float(shadow[3]) > 0.9999


@pytest.mark.slow
def test_the_peer_benchmark_names_what_auto_chose_for_the_service(
    tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from clipcore.backends.select import select_towers
    from clipcore.models.bundle import ModelBundle
    from loadtests.peer.benchmark import print_auto_decision
    from model_store import ModelStore

    bundle = ModelBundle.load(ModelStore(tiny_store), "tiny@production")
    select_towers(bundle, backend="auto", precision="fp32", device="cpu", onnx_cache_root=tmp_path, threads=1)
    print_auto_decision(tmp_path)
    (path,) = tmp_path.glob("auto/tiny/*.json")
    chosen = json.loads(path.read_text())["chosen"]
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"service auto chose {chosen['backend']} {chosen['precision']} (images/s at batch 1 / 8: ")
    assert re.search(r"torch fp32 [\d.]+ / [\d.]+, onnx fp32 [\d.]+ / [\d.]+\)$", line), line


@pytest.mark.slow
def test_the_peer_benchmark_ceiling_is_the_served_backends(
    tiny_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "% of ceiling" is against the image tower the service serves (CLIP_BACKEND / CLIP_PRECISION),
    and an auto decision made for the ceiling lands where the service then finds it."""
    from loadtests.peer.benchmark import service_ceiling

    rate, backend = service_ceiling(tiny_store, "tiny@production", 1, "cpu", tmp_path / "a", min_s=0.2)
    assert backend == "torch fp32" and rate > 0
    monkeypatch.setenv("CLIP_PRECISION", "int8")
    rate, backend = service_ceiling(tiny_store, "tiny@production", 1, "cpu", tmp_path / "b", min_s=0.2)
    assert backend == "torch int8" and rate > 0
    monkeypatch.setenv("CLIP_BACKEND", "auto")
    _, backend = service_ceiling(tiny_store, "tiny@production", 1, "cpu", tmp_path / "c", min_s=0.2)
    assert backend.endswith("int8") and len(list((tmp_path / "c").glob("auto/tiny/*.json"))) == 1


@pytest.mark.slow
def test_bench_served_set_measures_memory_per_set_and_one_models_latency_beside_another() -> None:
    # ViT-S-32: the smallest open_clip ViT, so the set's servers start in seconds.
    rows = table(run_script("bench_served_set.py", "rss", "--arch", "ViT-S-32", "--counts", "1", "3", "--budget", "2"))
    assert [(r[0], r[1]) for r in rows] == [("1", "1"), ("3", "3"), ("3, max_loaded_models=2", "2")]
    one, three = float(rows[0][2]), float(rows[1][2])
    assert 0 < one < three  # each loaded model holds memory of its own
    rows = table(run_script("bench_served_set.py", "threads", "--arch", "ViT-S-32", "--busy-batch", "2",
                            "--samples", "3"))  # fmt: skip
    assert [(r[0], r[1]) for r in rows] == [
        ("one per model", "idle"), ("one per model", "busy"), ("one shared", "idle"), ("one shared", "busy"),
    ]  # fmt: skip
    assert all(0 < float(r[2]) <= float(r[3]) <= float(r[4]) for r in rows)


def table_after(output: str, heading: str) -> list[list[str]]:
    """The rows (without the header) of the first markdown table from ``heading`` on."""
    lines = output[output.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return table("\n".join(lines[start:end]))


@pytest.mark.slow
def test_bench_host_path_measures_every_endpoint_with_wrk_against_the_decode_ceiling(tmp_path: Path) -> None:
    import json

    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    out = run_script("bench_host_path.py", "--no-infinity", "--duration", "1", "--warmup", "0", "--concurrency", "2",
                     "--rounds", "1", "--endpoints", "embed", "classify", "rank-pair", "--bases", "8",
                     "--ceiling-duration", "0.5", "--threads", "1", "--json", str(tmp_path / "out.json"))  # fmt: skip
    assert re.search(r"^command: .*-m loadtests.bench_host_path --no-infinity", out, re.M), out
    assert re.search(r"^machine: .+, \d+ cores.*avx2 (yes|no), avx512f (yes|no), avx512_vnni (yes|no)", out, re.M)
    for endpoint in ("embed", "classify", "rank-pair"):
        rows = {row[0]: row[1:] for row in table_after(out, f"### /{endpoint}:")}
        assert set(rows) == {"torch-fp32", f"torch-fp32: % of decode-only ceiling ({os.cpu_count()} proc.)",
                             "torch-fp32: wrk CPU ms per request", "torch-fp32: server CPU ms per answer",
                             "torch-fp32: engine CPU ms per answer", "torch-fp32: non-2xx + socket errors"}  # fmt: skip
        (rate,) = rows["torch-fp32"]
        assert float(rate.split(" (")[0]) > 0, (endpoint, rate)
        assert rows["torch-fp32: non-2xx + socket errors"] == ["0"], endpoint
        assert float(rows["torch-fp32: wrk CPU ms per request"][0]) > 0, endpoint
        assert float(rows["torch-fp32: server CPU ms per answer"][0]) > 0, endpoint
        # One process: the engine's CPU is the server's
        assert rows["torch-fp32: engine CPU ms per answer"] == rows["torch-fp32: server CPU ms per answer"]
    ((label, idle, after, each),) = table_after(out, "| server | RSS idle")
    assert label == "torch-fp32" and float(idle) > 50 and float(after) > 50 and each.startswith("server ")
    record = json.loads((tmp_path / "out.json").read_text())
    assert all(v > 0 for v in record["decode_ceiling_images_per_s"].values())
    assert [(c["endpoint"], c["concurrency"]) for c in record["cells"]] == [
        ("embed", 2), ("classify", 2), ("rank-pair", 2),
    ]  # fmt: skip
    for cell in record["cells"]:
        assert cell["req_per_s"] > 0 and cell["ok"] > 0, cell
        assert cell["status_503"] == cell["status_other"] == cell["socket_errors"] == 0, cell
        assert cell["images_per_s"] == pytest.approx(cell["req_per_s"] * cell["images_per_request"])
        assert cell["server_cpu_ms_per_request"] > 0, cell


@pytest.mark.slow
def test_bench_host_ab_alternates_two_servers_and_splits_their_cpu_per_answer() -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    out = run_script("bench_host_ab.py", "--a", "one", "--b", "two", "--cells", "2", "--cell", "1", "--warmup", "0",
                     "--concurrency", "2", "--threads", "1")  # fmt: skip
    ((label, cpu_a, cpu_b, ratio, engine_a, engine_b, engine_ratio, loop_a, loop_b, rate_a, rate_b, _, _,
      batch_a, batch_b, failed),) = table_after(out, "| endpoint, c |")  # fmt: skip
    assert label == "/embed, c=2" and failed == "0"
    # one process each: its engine is the server, and the event loop one of its threads
    assert float(engine_a) == float(cpu_a) and float(engine_b) == float(cpu_b)
    assert 0 < float(loop_a) < float(cpu_a) and 0 < float(loop_b) < float(cpu_b)
    assert float(ratio.strip("*x")) == pytest.approx(float(cpu_b) / float(cpu_a), abs=0.01)
    assert float(engine_ratio.strip("*x")) == pytest.approx(float(engine_b) / float(engine_a), abs=0.01)
    assert float(rate_a) > 0 and float(rate_b) > 0
    # the mean image batch each model ran, from its /metrics: at least one image per batch
    assert float(batch_a) >= 1 and float(batch_b) >= 1


@pytest.mark.slow
def test_bench_broken_neighbour_shows_the_healthy_model_kept_in_memory() -> None:
    out = run_script("bench_broken_neighbour.py", "--seconds", "1", "--interval", "0.2")
    rows = table(out)
    assert [row[0] for row in rows] == ["alone", "broken neighbour"]
    for _, answered, failed, p50, p99 in rows:
        assert int(answered) > 0 and failed == "0" and 0 < float(p50) <= float(p99)
    assert "bench@v2: unloaded 0x, loaded again 0x" in out, out
    assert re.search(r"bench@v3: loads tried and failed 1, 503s without a load [1-9]", out), out
    assert "bench@v3 quarantined" in out, out


@pytest.mark.slow
def test_bench_pg_add_splits_an_adds_cost_on_its_own_postgresql() -> None:
    out = run_script("bench_pg_add.py", "--items", "640", "--rounds", "2", "--dim", "16", "--tokens", "257")
    rows = {r[0]: [float(x) for x in r[1:]] for r in table(out)}
    assert set(rows) == {"store", "no-tokens", "hnsw", "async-commit"}
    for name, (rate, p50, p95, client_cpu, server_cpu, wal) in rows.items():
        assert rate > 0 and 0 < p50 <= p95 and client_cpu > 0 and server_cpu >= 0 and wal > 0, name
    # CPU is read in clock ticks (10 ms): the variants that cost the database most are seen to.
    assert rows["store"][4] > 0 and rows["hnsw"][4] > rows["no-tokens"][4]
    # 257 x 16 float16 tokens an item are 8,224 bytes, written to the WAL beside the item.
    assert rows["store"][5] - rows["no-tokens"][5] > 6
    # BEGIN, the catalogue row locked, 64 items, 64 token rows, the count, COMMIT.
    assert re.search(r"^one add of 64 items with tokens: 132 statements, \d+ round trips$", out, re.M), out
    again = run_script("bench_pg_add.py", "--reembed", "300", "--dim", "16", "--tokens", "9")
    line = (
        r"^re-embedding 300 items \(index=hnsw\): staged copy filled in [\d.]+ s \([\d.]+ s PostgreSQL CPU\), "
        r"switched in [\d.]+ s; in all [\d.]+ s, PostgreSQL CPU [\d.]+ s$"
    )
    assert re.search(line, again, re.M), again
