"""Settings from the environment, secret redaction, and ``python -m service`` as a process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from service.__main__ import parse_args
from service.config import Settings

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_defaults() -> None:
    s = Settings()
    assert (s.host, s.port, s.store, s.model, s.device) == ("127.0.0.1", 8000, "models", "default@production", "cpu")
    assert s.limits.max_body_bytes == 20 * 1024 * 1024 and s.limits.max_pixels == 40_000_000
    assert s.batching.max_queue == 4096 and not s.allow_url_images and s.api_keys == []


def test_a_served_set_of_refs_and_its_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIP_MODEL", "default@production, default@v5 ,other")
    monkeypatch.setenv("CLIP_MAX_LOADED_MODELS", "2")
    s = Settings()
    assert s.served_refs() == ["default@production", "default@v5", "other"] and s.max_loaded_models == 2
    for refs, why in (
        ("default,default@production", "name the same entry"),  # a bare name is name@production
        ("default,,other", "empty model ref"),
        ("default,bad name", "model name"),
    ):
        with pytest.raises(ValidationError, match=why):
            Settings(model=refs)
    with pytest.raises(ValidationError, match="max_loaded_models=1 holds only the first model"):
        Settings(model="default,other", max_loaded_models=1)
    assert Settings(model="default", max_loaded_models=1).max_loaded_models == 1


def test_environment_with_nested_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIP_PORT", "9001")
    monkeypatch.setenv("CLIP_DEVICE", "auto")
    monkeypatch.setenv("CLIP_LIMITS__MAX_IMAGES", "7")
    monkeypatch.setenv("CLIP_BATCHING__MAX_WAIT_MS", "2.5")
    monkeypatch.setenv("CLIP_API_KEYS", '["k1", "k2"]')
    monkeypatch.setenv("CLIP_LOG_LEVEL", "DEBUG")
    s = Settings()
    assert s.port == 9001 and s.device == "auto" and s.limits.max_images == 7
    assert s.batching.max_wait_ms == 2.5 and [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"]
    assert s.log_level == "debug"
    assert Settings(port=9002).port == 9002  # explicit values (flags) win over the environment


def test_invalid_settings_are_rejected() -> None:
    for bad in (
        {"device": "tpu"},
        {"port": -1},
        {"limits": {"max_images": 0}},
        {"api_keys": [""]},
        {"limits": {"nope": 1}},
        {"model": "../etc@x"},
        {"model": "a@b@c"},
    ):
        with pytest.raises(ValidationError):
            Settings(**bad)


def test_validation_errors_do_not_print_the_values_given() -> None:
    """`python -m service` prints validation errors to stderr: a secret given where it does not
    fit must not end up in the logs."""
    with pytest.raises(ValidationError) as invalid:
        Settings(device="hunter2", api_keys=["ok", " "])
    assert "hunter2" not in str(invalid.value) and "device" in str(invalid.value)


def test_secrets_are_redacted() -> None:
    s = Settings(api_keys=["super-secret"], redis_url="redis://:hunter2@cache:6379/0")
    text = repr(s.redacted()) + repr(s) + str(s)
    assert "super-secret" not in text and "hunter2" not in text
    assert s.redis_url_value() == "redis://:hunter2@cache:6379/0"
    assert s.redacted()["redis_url"] == "redis://:***@cache:6379/0"
    sentinel = Settings(redis_url="redis+sentinel://:hunter2@s0:26379,s1:26379/clipcache/0?sentinel_password=hunter3")
    assert (
        sentinel.redacted()["redis_url"] == "redis+sentinel://:***@s0:26379,s1:26379/clipcache/0?sentinel_password=***"
    )
    cluster = Settings(redis_url="redis+cluster://cache:hunter2@n0:7000,n1:7000")
    assert cluster.redacted()["redis_url"] == "redis+cluster://cache:***@n0:7000,n1:7000"
    for settings in (sentinel, cluster):
        text = repr(settings.redacted()) + repr(settings) + str(settings)
        assert "hunter2" not in text and "hunter3" not in text


def test_cli_flags_mirror_settings() -> None:
    args = parse_args(
        [
            "--host",
            "0.0.0.0",
            "--port",
            "8080",
            "--store",
            "/m",
            "--model",
            "x@staging",
            "--redis-url",
            "redis://r:6379/0",
            "--device",
            "cuda",
            "--log-level",
            "warning",
        ]
    )
    s = Settings(**args)
    assert (s.host, s.port, s.store, s.model, s.device, s.log_level) == (
        "0.0.0.0",
        8080,
        "/m",
        "x@staging",
        "cuda",
        "warning",
    )
    assert s.redis_url_value() == "redis://r:6379/0"
    assert parse_args([]) == {}


@pytest.mark.slow
def test_python_m_service_serves_and_shuts_down(tmp_path: Path, publish_model: Any) -> None:
    publish_model(tmp_path / "store", "cli", seed=14)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLIP_WATCH_INTERVAL_S": "0.5"}
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--store",
        str(tmp_path / "store"),
        "--model",
        "cli@production",
        "--port",
        str(port),
        "--redis-url",
        "redis://127.0.0.1:1/0",
        "--log-level",
        "info",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/embed", json={"texts": ["hello"]})
        assert r.status_code == 200 and r.json()["model"] == "cli@v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    # uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is the clean exit here.
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out
    assert "unreachable" in out  # Redis down at start: a warning, not a failure
    assert '"route": "/embed"' in out and '"status": 200' in out  # one structured access line
    assert "hunter2" not in out


def test_invalid_flag_value_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service", "--port", "99999"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "invalid settings" in proc.stderr


# ----------------------------------------------------------------------------- flags from the settings model
def _leaf_settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            names += _leaf_settings(ann, f"{prefix}{name}.")
        else:
            names.append(prefix + name)
    return names


def test_every_setting_is_a_flag_and_its_help_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for key in _leaf_settings(Settings):
        parts = key.split(".")
        flag = "--" + "-".join(parts).replace("_", "-")
        env = "CLIP_" + "__".join(p.upper() for p in parts)
        assert re.search(re.escape(flag) + "[ ,]", text), flag
        assert f"env {env};" in text, env
    # nested groups join with a dash on the command line, a double underscore in the environment
    assert "--batching-max-batch-images INTEGER" in text and "env CLIP_BATCHING__MAX_BATCH_IMAGES;" in text
    assert "--warmup, --no-warmup" in text
    # a secret may be given as a flag, but the help says why not to
    assert "--api-keys SECRET" in text and "visible to every user of the machine in ps" in text


# (flag arguments, variable, its value, how to read the setting, from the flag, from the variable, default)
FLAG_CASES = [
    (["--host", "0.0.0.0"], "CLIP_HOST", "10.1.2.3", lambda s: s.host, "0.0.0.0", "10.1.2.3", "127.0.0.1"),
    (["--lru-items", "5"], "CLIP_LRU_ITEMS", "7", lambda s: s.lru_items, 5, 7, 50_000),
    (
        ["--batching-max-batch-images", "8"],
        "CLIP_BATCHING__MAX_BATCH_IMAGES",
        "5",
        lambda s: s.batching.max_batch_images,
        8,
        5,
        64,
    ),
    (
        ["--limits-max-aspect-ratio", "2.5"],
        "CLIP_LIMITS__MAX_ASPECT_RATIO",
        "3.5",
        lambda s: s.limits.max_aspect_ratio,
        2.5,
        3.5,
        50.0,
    ),
    (["--no-warmup"], "CLIP_WARMUP", "true", lambda s: s.warmup, False, True, True),
    (["--allow-url-images"], "CLIP_ALLOW_URL_IMAGES", "false", lambda s: s.allow_url_images, True, False, False),
    (["--precision", "INT8"], "CLIP_PRECISION", "bf16", lambda s: s.precision, "int8", "bf16", "fp32"),
    (["--log-level", "warning"], "CLIP_LOG_LEVEL", "DEBUG", lambda s: s.log_level, "warning", "debug", "info"),
    (
        ["--cors-origins", "https://a.example", "--cors-origins", "https://b.example"],
        "CLIP_CORS_ORIGINS",
        '["https://c.example"]',
        lambda s: s.cors_origins,
        ["https://a.example", "https://b.example"],
        ["https://c.example"],
        [],
    ),
    (
        ["--api-keys", "k1", "--api-keys", '["k2", "k3"]'],
        "CLIP_API_KEYS",
        '["k4"]',
        lambda s: [k.get_secret_value() for k in s.api_keys],
        ["k1", "k2", "k3"],
        ["k4"],
        [],
    ),
    (
        ["--batching-max-queue-delay-s", "none"],
        "CLIP_BATCHING__MAX_QUEUE_DELAY_S",
        "0.5",
        lambda s: s.batching.max_queue_delay_s,
        None,
        0.5,
        2.0,
    ),
]


@pytest.mark.parametrize(("args", "env", "env_value", "read", "from_flag", "from_env", "default"), FLAG_CASES)
def test_flags_win_over_variables_and_variables_over_defaults(
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: str,
    env_value: str,
    read: Any,
    from_flag: Any,
    from_env: Any,
    default: Any,
) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CLIP_"):
            monkeypatch.delenv(name)
    assert read(Settings(**parse_args([]))) == default
    assert read(Settings(**parse_args(args))) == from_flag
    monkeypatch.setenv(env, env_value)
    assert read(Settings(**parse_args([]))) == from_env
    assert read(Settings(**parse_args(args))) == from_flag


def test_a_nested_flag_keeps_the_variables_of_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIP_BATCHING__MAX_QUEUE", "7")
    monkeypatch.setenv("CLIP_BATCHING__MAX_BATCH_IMAGES", "5")
    s = Settings(**parse_args(["--batching-max-batch-images", "8"]))
    assert (s.batching.max_batch_images, s.batching.max_queue) == (8, 7)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--batching-max-batch-images", "0"], "--batching-max-batch-images / CLIP_BATCHING__MAX_BATCH_IMAGES"),
        (["--limits-max-pixels", "lots"], "--limits-max-pixels / CLIP_LIMITS__MAX_PIXELS"),
        (["--precision", "fp16"], "precision fp16 needs a CUDA device"),
        (["--batching-max-batch-image", "4"], "did you mean --batching-max-batch-images?"),
        (["--backend", "tpu"], "argument --backend: invalid choice"),
        (["--cors-origins", "[1"], "argument --cors-origins: not a JSON list"),
    ],
)
def test_bad_flag_values_exit_2_with_a_message(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


# ----------------------------------------------------------------------------- CLIP_* variables nothing reads
def test_an_unknown_variable_warns_with_the_closest_name() -> None:
    from service.cli import unknown_variables

    warnings = unknown_variables({"CLIP_BATCHING__MAX_BATCH_IMAGE": "4", "CLIP_TORCH_THREAD": "1", "HOME": "/"})
    assert len(warnings) == 2
    assert "CLIP_BATCHING__MAX_BATCH_IMAGE" in warnings[0]
    assert warnings[0].endswith("did you mean CLIP_BATCHING__MAX_BATCH_IMAGES?")
    assert warnings[1].endswith("did you mean CLIP_TORCH_THREADS?")
    assert "docs/configuration.md" in unknown_variables({"CLIP_NOTHING_LIKE_IT": "1"})[0]


def test_known_variables_do_not_warn() -> None:
    from service.cli import unknown_variables

    known = {
        "CLIP_PORT": "1",
        "clip_log_level": "debug",  # matched case-insensitively, as pydantic-settings does
        "CLIP_BATCHING__MAX_BATCH_IMAGES": "4",
        "CLIP_LIMITS": "{}",  # a whole group as JSON
        "CLIP_STORE": "models",  # the service and both command lines
        "CLIP_STORE_CACHE_DIR": "/tmp",
        "CLIP_TORCH_THREADS": "1",
        "CLIP_SERVICE_URL": "http://x",  # the Python client
        "CLIP_SERVICE_API_KEY": "k",
        "CLIP_FEATURE_CACHE": "/tmp",  # clip-train
    }
    assert unknown_variables(known) == []


def test_no_clip_variable_the_repository_sets_warns() -> None:
    """Manifests, compose files, load tests, the SDK and the docs name only variables something reads."""
    from service.cli import unknown_variables

    pattern = re.compile(r"\bCLIP_[A-Z0-9_]*[A-Z0-9]\b")
    places = ["k8s", "deploy", "loadtests", "clients", "training", "model_store", "scripts", "docs", "README.md"]
    found: dict[str, str] = {}
    for place in places:
        for path in [REPO / place] if (REPO / place).is_file() else sorted((REPO / place).rglob("*")):
            # The reference page and its generator show a misspelling on purpose.
            if not path.is_file() or path.name in ("configuration.md", "config_doc.py"):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            found.update({name: str(path.relative_to(REPO)) for name in pattern.findall(text)})
    assert "CLIP_BATCHING__MAX_BATCH_IMAGES" in found and "CLIP_SERVICE_URL" in found  # the scan saw them
    assert unknown_variables(dict.fromkeys(found, "x")) == [], found


# ----------------------------------------------------------------------------- the process
@pytest.mark.slow
def test_python_m_service_takes_nested_flags_and_warns_about_unknown_variables(tiny_store: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CLIP_")}
    env |= {
        "PYTHONPATH": str(REPO),
        "CLIP_LIMITS__MAX_IMAGES": "7",  # a variable of the group the flag sets: kept
        "CLIP_LIMITS__MAX_PIXELS": "999",  # the flag wins
        "CLIP_WATCH_INTERVALS": "1",  # misspelt
    }
    cmd = [
        sys.executable, "-m", "service", "--store", str(tiny_store), "--model", "tiny@production",
        "--port", str(port), "--limits-max-pixels", "123456", "--no-warmup", "--log-level", "info",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/limits", timeout=1)
                if response.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        limits = response.json()
        assert (limits["max_pixels"], limits["max_images"]) == (123456, 7)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert (
        "unknown variable CLIP_WATCH_INTERVALS (not a setting of the service): did you mean CLIP_WATCH_INTERVAL_S?"
        in out
    )


def test_help_does_not_import_the_application() -> None:
    """``--help`` parses before the app is imported: torch, open_clip and FastAPI take seconds to load."""
    code = (
        "import json, runpy, sys\n"
        "sys.argv = ['clip-service', '--help']\n"
        "try:\n"
        "    runpy.run_module('service', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "heavy = ('torch', 'open_clip', 'numpy', 'fastapi', 'uvicorn', 'service.app')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--batching-max-batch-images" in proc.stdout
    assert json.loads(proc.stdout.splitlines()[-1]) == []
