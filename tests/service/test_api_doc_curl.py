"""The ``curl -F`` (multipart) and OpenAI-compatible examples of docs/api.md, run as written.

Each command of those sections is run by bash with the real ``curl`` against the committed
default model under uvicorn (only the host and port are changed), from ``examples/`` like every
example of the document (the repository's images, or drawn the same way when a checkout lacks them), and
its answer is checked: the larger circle comes first, the circle is a circle, and so on.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
API_DOC = REPO / "docs" / "api.md"
STORE = REPO / "models"
DOC_URL = "http://127.0.0.1:8000"
SECTIONS = ("## Multipart uploads", "## OpenAI-compatible embeddings")

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def doc_commands() -> list[str]:
    """Every curl command of the sections, backslash continuations joined."""
    text = API_DOC.read_text(encoding="utf-8")
    commands = []
    for heading in SECTIONS:
        for block in re.findall(r"```bash\n(.*?)```", section(text, heading), flags=re.S):
            joined = block.replace("\\\n", " ")
            commands += [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]
    return commands


def test_the_sections_have_curl_form_examples() -> None:
    commands = doc_commands()
    assert sum(" -F " in c for c in commands) >= 5
    for path in ("/rank-pair", "/classify", "/rank ", "/score/dense", "/embed", "/v1/embeddings", "/v1/models"):
        assert any(f"{DOC_URL}{path.strip()}" in c for c in commands), path


def draw_examples(folder: Path) -> None:
    """The example images the commands name: the repository's, or drawn from the shapes world."""
    from training.world.render import render_scene
    from training.world.scene import Scene, SceneObject
    from training.world.vocab import SIZE_RANGES

    def obj(shape: str, colour: str, size: str, x: float = 0.5) -> SceneObject:
        low, high = SIZE_RANGES[size]
        return SceneObject(shape, colour, size, (low + high) / 2, x, 0.5)

    scenes = {
        "big_circle.png": Scene(objects=(obj("circle", "red", "large"),)),
        "small_circle.png": Scene(objects=(obj("circle", "red", "small"),)),
        "red.png": Scene(objects=(obj("circle", "red", "medium"),)),
        "blue.png": Scene(objects=(obj("square", "blue", "medium"),)),
        "scene.png": Scene(
            objects=(obj("circle", "red", "medium", 0.27), obj("square", "blue", "medium", 0.73)), relation="left of"
        ),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, scene in scenes.items():
        shipped = REPO / "examples" / name
        if shipped.exists():
            shutil.copy(shipped, folder / name)
        else:
            Image.fromarray(render_scene(scene, size=128)).save(folder / name)


@pytest.fixture(scope="module")
def server(serve_app: Any, service_redis: Any) -> Iterator[str]:
    if not (STORE / "default" / "aliases.json").exists():
        pytest.skip(f"the committed default model is not in {STORE}")
    with serve_app(store=str(STORE), model="default@production", redis_url=service_redis.url) as running:
        yield running.url


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    examples = tmp_path_factory.mktemp("doc-curl") / "examples"
    draw_examples(examples)
    return examples


def run(command: str, url: str, cwd: Path) -> Any:
    proc = subprocess.run(
        ["bash", "-c", command.replace(DOC_URL, url) + " -w '\\n%{http_code}'"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    body, _, status = proc.stdout.rpartition("\n")
    created = " -X PUT " in command and status == "201"  # a collection made
    assert proc.returncode == 0 and (status == "200" or created), (command, proc.stdout[-2000:], proc.stderr[-2000:])
    return json.loads(body)


def check(command: str, answer: Any) -> None:
    path = re.search(r"127\.0\.0\.1:\d+(/[\w/-]+)", command)
    assert path is not None
    route = path.group(1)
    if route == "/rank-pair":
        assert answer["first"] == "a", answer  # image_a is the big circle
    elif route == "/classify":
        assert [r["label"] for r in answer["results"]] == ["circle", "square"], answer
    elif route == "/rank":
        assert [r["index"] for r in answer["ranking"]] == [1, 0], answer  # the big circle first
    elif route == "/score/dense":
        assert answer["best"] == 0 and len(answer["scores"]) == 2, answer  # the true caption
    elif route == "/embed":
        rows = [np.frombuffer(base64.b64decode(r), dtype="<f2") for r in answer["embeddings"]]
        assert answer["encoding_format"] == "float16" and rows[0].shape == (answer["dim"],)
        assert abs(float(np.linalg.norm(rows[0].astype(np.float32))) - 1.0) < 1e-2
    elif route == "/v1/embeddings":
        assert answer["object"] == "list" and len(answer["data"][0]["embedding"]) == 32, answer
    elif route == "/v1/models":
        assert answer["data"][0]["id"] == "default", answer
        assert answer["data"][0]["answers"] == answer["data"][0]["serving"], answer  # no canary: the primary
    elif route == "/collections/shop":
        assert answer["name"] == "shop" and answer["count"] == 0, answer
    elif route == "/collections/shop/images":
        assert answer["added"] == ["sku-1", "sku-2"] and answer["count"] == 2, answer
    else:
        raise AssertionError(f"no check for {route}")


def test_every_doc_command_runs_and_answers_right(server: str, workdir: Path) -> None:
    commands = doc_commands()
    for command in commands:
        check(command, run(command, server, workdir))
