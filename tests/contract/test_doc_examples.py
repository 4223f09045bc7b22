"""The examples of README.md and docs/api.md run as written and get the right answers.

Every ```bash block that calls the API (or prepares images for it) runs in bash, in document
order, from a copy of the repository's ``examples/`` folder, against the real service on the
default model (only the host and port are rewritten). Every ```python block runs too: the README's
SDK example as written; the fragments of docs/api.md that use a ``client`` from an earlier block
get one. An ASGI recorder in front of the app keeps every request and answer, and the answers are
checked against what the example images show (scripts/render_examples.py): which image of a pair
is larger or red, the order of a ranking, the label of a classification, the caption DCSM picks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from base64 import b64decode
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "models"
DOCS = {"README.md": REPO / "README.md", "docs/api.md": REPO / "docs" / "api.md"}
HOSTS = ("http://127.0.0.1:8000", "http://localhost:8000", "127.0.0.1:8000", "localhost:8000")
LARGER = "The first image contains a larger shape, while the second contains a smaller shape."
RED_FIRST = "The first shape is red, while the second is blue."
# What each document's examples must have exercised with a checked answer (the test cannot pass
# by running nothing).
CHECKED = {
    "README.md": {"/rank-pair", "/classify", "/rank", "/score/dense", "/embed", "/models"},
    "docs/api.md": {"/rank-pair", "/classify", "/rank", "/score/dense", "/score/dense/heatmap", "/embed", "/models"},
}
CURL_WRAPPER = r"""
set -eo pipefail
curl() {
  local rc=0
  command curl --max-time 120 "$@" || rc=$?
  echo "$rc" >> "$CURL_LOG"
  return 0
}
"""


# ----------------------------------------------------------------------------- recording the API
@dataclass
class Exchange:
    method: str
    path: str
    query: str
    request: bytes
    status: int = 0
    content_type: str = ""
    response: bytearray = field(default_factory=bytearray)

    def request_json(self) -> Any:
        try:
            return json.loads(self.request)
        except ValueError:
            return None  # not a JSON body (a multipart upload, for example): only the answer is checked

    def response_json(self) -> Any:
        return json.loads(self.response)


class Recorder:
    """ASGI wrapper that keeps every HTTP request and its answer, in order."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        exchange = Exchange(scope["method"], scope["path"], scope.get("query_string", b"").decode(), b"")

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
                exchange.content_type = headers.get("content-type", "")
            elif message["type"] == "http.response.body":
                exchange.response.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, recording_receive, recording_send)
        exchange.request = bytes(body)
        with self._lock:
            self.exchanges.append(exchange)

    def take(self) -> list[Exchange]:
        with self._lock:
            taken, self.exchanges = self.exchanges, []
        return taken


# ----------------------------------------------------------------------------- the example images
def _render_examples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_examples", REPO / "scripts" / "render_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Example:
    name: str
    description: str
    radius: float
    colour: str
    objects: int


def _examples() -> dict[str, Example]:
    """sha256 of each committed example file -> what it shows."""
    out = {}
    for name, (scene, description) in _render_examples().EXAMPLES.items():
        digest = hashlib.sha256((REPO / "examples" / name).read_bytes()).hexdigest()
        first = scene.objects[0]
        out[digest] = Example(name, description, first.radius, first.colour, len(scene.objects))
    return out


EXAMPLES = _examples()


def identify(image: Any) -> Example | None:
    """The example an image object of a request is, if it is one."""
    if not isinstance(image, dict):
        return None
    if "sha256" in image:
        return EXAMPLES.get(str(image["sha256"]).lower())
    data = image.get("data")
    if not isinstance(data, str):
        return None
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        raw = b64decode("".join(data.split()), validate=True)
    except ValueError:
        return None
    return EXAMPLES.get(hashlib.sha256(raw).hexdigest())


def describes(label: str, example: Example) -> bool:
    """Whether a label is true of an example: for one object, every word of the label is a word of
    its description ("circle", "red circle"); for a scene of two, the whole description (swapping
    the colours keeps the words)."""
    if example.objects > 1:
        return label == example.description
    return set(label.lower().split()) <= set(example.description.lower().split())


def first_side(difference: str, a: Example, b: Example) -> str | None:
    """Which of two examples is the "first" of a difference text the examples use; None if unknown."""
    if difference == LARGER and a.radius != b.radius:
        return "a" if a.radius > b.radius else "b"
    if difference == RED_FIRST and {a.colour, b.colour} == {"red", "blue"}:
        return "a" if a.colour == "red" else "b"
    return None


# ----------------------------------------------------------------------------- checking answers
def check(exchange: Exchange) -> str | None:
    """Assert that an answer is right for what was asked; return the path when its meaning was checked."""
    where = f"{exchange.method} {exchange.path}?{exchange.query}"
    created = exchange.method == "PUT"  # a PUT creates (a collection): 201
    assert exchange.status == (201 if created else 200), f"{where} answered {exchange.status}: " + repr(
        bytes(exchange.response)[:300]
    )
    path, request = exchange.path, exchange.request_json()
    if path == "/score/dense/heatmap":
        assert exchange.content_type == "image/png" and exchange.response.startswith(b"\x89PNG"), where
        return path
    if path == "/metrics":
        assert b"clip_http_requests_total" in exchange.response
        return path
    answer = exchange.response_json()
    if path == "/readyz":
        assert answer["ready"] is True
        return path
    if path == "/models":
        assert str(answer["serving"]).startswith("default@")
        return path
    if path == "/embed":
        # Packed answers (encoding_format base64 / float16) are little-endian float32 / float16.
        packed = {"base64": "<f4", "float16": "<f2"}.get(answer.get("encoding_format", "float"))
        rows = [np.frombuffer(b64decode(r), packed) for r in answer["embeddings"]] if packed else answer["embeddings"]
        assert rows and all(len(row) == answer["dim"] for row in rows), where
        assert all(abs(float(np.linalg.norm(np.asarray(row, np.float32))) - 1) < 1e-2 for row in rows), where
        if isinstance(request, dict):
            assert len(rows) == len(request.get("texts") or request.get("images") or []), where
        return path
    if not isinstance(request, dict):
        return None
    if path == "/rank-pair":
        pairs = request.get("pairs") or [request]
        results = answer.get("results") or [answer]
        checked = False
        for pair, result in zip(pairs, results, strict=True):
            a, b = identify(pair.get("image_a")), identify(pair.get("image_b"))
            expected = first_side(pair["difference"], a, b) if a and b else None
            if expected is not None:
                assert result["first"] == expected, f"{where}: {a.name} vs {b.name}: {result}"
                checked = True
        return path if checked else None
    if path == "/rank":
        shown = [identify(image) for image in request["images"]]
        if not all(shown):
            return None
        order = [shown[item["index"]] for item in answer["ranking"]]
        if request["difference"] == LARGER:
            assert [e.radius for e in order] == sorted((e.radius for e in order), reverse=True), where
        elif request["difference"] == RED_FIRST and {"red", "blue"} <= {e.colour for e in order}:
            colours = [e.colour for e in order]
            last_red = max(i for i, c in enumerate(colours) if c == "red")
            assert last_red < colours.index("blue"), f"{where}: {colours}"
        else:
            return None
        return path
    if path == "/classify":
        checked = False
        for image, result in zip(request["images"], answer["results"], strict=True):
            example = identify(image)
            if example is not None:
                assert describes(result["label"], example), f"{where}: {example.name} classified {result['label']!r}"
                checked = True
        return path if checked else None
    if path == "/score/dense":
        example = identify(request["image"])
        if example is None or example.description not in request["texts"]:
            return None
        assert request["texts"][answer["best"]] == example.description, f"{where}: {answer}"
        return path
    return None


# ----------------------------------------------------------------------------- the documents
def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def with_host(code: str, host_port: str) -> str:
    for host in HOSTS:
        scheme = "http://" if host.startswith("http://") else ""
        code = code.replace(host, f"{scheme}{host_port}")
    return code


def api_blocks(text: str) -> list[str]:
    """The shell examples that call the API or prepare images for it (not install or training commands)."""
    return [b for b in blocks(text, "bash") if "curl " in b or "base64" in b]


@pytest.fixture(scope="module")
def server(serve_app: Any) -> Iterator[tuple[str, Recorder]]:
    if not (STORE / "default" / "aliases.json").exists():
        pytest.skip(f"the committed default model is not in {STORE}")
    recorders: list[Recorder] = []

    def wrap(app: Any) -> Recorder:
        recorders.append(Recorder(app))
        return recorders[0]

    with serve_app(store=str(STORE), model="default@production", torch_threads=1, wrap=wrap) as running:
        recorders[0].take()  # the readiness probes of the fixture
        yield running.url, recorders[0]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A folder laid out like a fresh clone, as far as the examples need: examples/ with its images."""
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


def _sdk_module(text: str) -> str:
    found = re.search(r"^from (\w+) import .*\bClient\b", text, re.MULTILINE)
    assert found, "no SDK import in the document"
    return found.group(1)


def run_bash(script: str, cwd: Path, host_port: str) -> None:
    log = cwd / "curl.log"
    log.write_text("")
    completed = subprocess.run(
        ["bash", "-c", CURL_WRAPPER + with_host(script, host_port)],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "CURL_LOG": str(log), "CLIP_SERVICE_API_KEY": "unused"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, f"the examples failed:\n{completed.stderr[-3000:]}"
    codes = log.read_text().split()
    assert codes and all(code == "0" for code in codes), f"curl exit codes {codes}:\n{completed.stderr[-2000:]}"


def run_python(code: str, cwd: Path) -> str:
    completed = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, f"the example failed:\n{code}\n{completed.stderr[-3000:]}"
    return completed.stdout


# ----------------------------------------------------------------------------- documented answers
# The answers the documents show (a ```json block right after an example's ```bash block, or a
# `# {...}` comment after a command) are compared with the service's answers to those examples:
# every field shown must be in the answer with that value (strings exactly, numbers within
# NUMBER_TOLERANCE absolute or relative, whichever is larger); `...` stands for any value, for
# more list items after it, or (`, ...}`) for more fields. CLIP_UPDATE_DOC_OUTPUTS=1 writes the
# service's answers into the documents instead (the shown fields only, `...` kept).
MARKER = "doc-block"
NUMBER_TOLERANCE = 0.05
UPDATE_OUTPUTS = os.environ.get("CLIP_UPDATE_DOC_OUTPUTS") == "1"
ANY = "\u2026any"


def split_by_marker(exchanges: list[Exchange]) -> list[list[Exchange]]:
    """The exchanges of each block, in block order (the markers themselves left out)."""
    out: list[list[Exchange]] = [[]]
    for exchange in exchanges:
        if MARKER in exchange.query:
            out.append([])
        else:
            out[-1].append(exchange)
    return out[:-1]


def lenient_json(text: str) -> Any:
    """A documented answer: JSON where `...` elides values, list items or fields."""
    text = re.sub(r",\s*\.\.\.\s*}", "}", text)
    text = re.sub(r"{\s*\.\.\.\s*}", "...", text)  # an object shown as {...}: any value
    return json.loads(re.sub(r"\.\.\.", lambda _: json.dumps(ANY), text))


def differences(shown: Any, actual: Any, where: str = "") -> list[str]:
    """Where a documented answer differs from the service's (empty: it matches)."""
    if shown == ANY:
        return []
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return [f"{where or '.'}: an object in the docs, {type(actual).__name__} in the answer"]
        out = []
        for key, value in shown.items():
            if key not in actual:
                out.append(f"{where}.{key}: in the docs, not in the answer")
            else:
                out += differences(value, actual[key], f"{where}.{key}")
        return out
    if isinstance(shown, list):
        if not isinstance(actual, list):
            return [f"{where}: a list in the docs, {type(actual).__name__} in the answer"]
        more = bool(shown) and shown[-1] == ANY
        items = shown[:-1] if more else shown
        if len(actual) < len(items) or (not more and len(actual) != len(items)):
            return [f"{where}: {len(items)} items in the docs, {len(actual)} in the answer"]
        return [d for i, item in enumerate(items) for d in differences(item, actual[i], f"{where}[{i}]")]
    if isinstance(shown, bool) or not isinstance(shown, (int, float)):
        return [] if shown == actual else [f"{where}: {shown!r} in the docs, {actual!r} in the answer"]
    if isinstance(actual, bool) or not isinstance(actual, (int, float)):
        return [f"{where}: {shown!r} in the docs, {actual!r} in the answer"]
    if abs(shown - actual) > NUMBER_TOLERANCE * max(1.0, abs(actual)):
        return [f"{where}: {shown} in the docs, {actual} in the answer"]
    return []


def missing_fields(shown: Any, actual: Any) -> int:
    """How many top-level fields of a documented answer an answer lacks (which answer it shows)."""
    if not isinstance(shown, dict) or not isinstance(actual, dict):
        return 0 if type(shown) is type(actual) else 1
    return sum(key not in actual for key in shown)


def mismatch(shown: Any, actual: Any) -> tuple[int, int]:
    """(differences of shape: fields, lengths, types; differences of value) between a documented
    answer and an answer: a block's shown answer is the one of its answers whose shape it has."""
    found = differences(shown, actual)
    shape = sum("in the answer" in d and (" items " in d or "not in the answer" in d or " a " in d) for d in found)
    return shape, len(found) - shape


def updated(shown: Any, actual: Any) -> Any:
    """``shown`` with the answer's values in it: the same fields, items and elisions."""
    if shown == ANY:
        return ANY
    if isinstance(shown, dict) and isinstance(actual, dict):
        return {k: updated(v, actual[k]) if k in actual else v for k, v in shown.items()}
    if isinstance(shown, list) and isinstance(actual, list):
        more = bool(shown) and shown[-1] == ANY
        items = shown[:-1] if more else shown
        if more:  # the shown items, then the elision
            return [*(updated(item, actual[i]) for i, item in enumerate(items) if i < len(actual)), ANY]
        # Every item of the answer, each shaped like the shown item in its place (or the last one).
        return [updated(items[min(i, len(items) - 1)] if items else value, value) for i, value in enumerate(actual)]
    if isinstance(actual, float) and not isinstance(shown, bool) and isinstance(shown, (int, float)):
        decimals = len(repr(float(shown)).split(".")[1]) if "." in repr(shown) else 2
        return round(actual, max(2, min(decimals, 4)))
    return actual


WIDTH = 110


def render(value: Any, one_line: bool, column: int = 0) -> str:
    """JSON as the documents write it: on one line where it fits (always for a `# {...}` comment),
    else one field or item per line, aligned; elisions written as `...`."""
    flat = json.dumps(value, ensure_ascii=False).replace(json.dumps(ANY, ensure_ascii=False), "...")
    if one_line or column + len(flat) <= WIDTH or not isinstance(value, (dict, list)) or not value:
        return flat
    joint = ",\n" + " " * (column + 1)
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            prefix = json.dumps(key, ensure_ascii=False) + ": "
            parts.append(prefix + render(item, False, column + 1 + len(prefix)))
        return "{" + joint.join(parts) + "}"
    return "[" + joint.join(render(item, False, column + 1) for item in value) + "]"


def documented_outputs(doc_text: str, script: str) -> list[tuple[str, int | None]]:
    """(documented text, which answer of the block: its index, or None for the one it matches best) for
    the `# {...}` comments of a block and the ```json block that follows it."""
    out: list[tuple[str, int | None]] = []
    curls = 0
    for line in script.splitlines():
        curls += line.count("curl ")
        if line.startswith("# {"):
            out.append((line[2:], curls - 1))
    after = doc_text[doc_text.index(script) + len(script) :]
    following = re.match(r"```\n\s*```json\n(.*?)^```", after, re.MULTILINE | re.DOTALL)
    if following:
        out.append((following.group(1), None))
    return out


def json_answers(exchanges: list[Exchange]) -> list[Any]:
    found = []
    for e in exchanges:
        try:
            found.append(e.response_json() if "json" in e.content_type else None)
        except ValueError:
            found.append(None)
    return found


def compare_documented_outputs(doc: str, scripts: list[str], per_block: list[list[Exchange]]) -> None:
    path = DOCS[doc]
    text = path.read_text(encoding="utf-8")
    assert len(per_block) == len(scripts), (len(per_block), len(scripts))
    problems, replacements, compared = [], [], 0
    for script, exchanges in zip(scripts, per_block, strict=True):
        answers = json_answers(exchanges)
        for shown_text, index in documented_outputs(text, script):
            shown = lenient_json(shown_text)
            if index is not None and 0 <= index < len(answers) and answers[index] is not None:
                actual = answers[index]
            else:  # a block's shown answer: the one of its answers it describes best
                candidates = [a for a in answers if a is not None]
                assert candidates, f"{doc}: no JSON answer for {shown_text[:60]!r}"
                actual = min(candidates, key=lambda a: (missing_fields(shown, a), *mismatch(shown, a)))
            compared += 1
            found = differences(shown, actual)
            if found:
                problems.append(f"{shown_text.strip()[:80]}...: " + "; ".join(found[:5]))
                one_line = "\n" not in shown_text.strip()
                end = "\n" if shown_text.endswith("\n") else ""
                replacements.append((shown_text, render(updated(shown, actual), one_line) + end))
    if UPDATE_OUTPUTS and replacements:
        for old, new in replacements:
            text = text.replace(old, new, 1)
        path.write_text(text, encoding="utf-8")
        return
    assert compared > 0, f"{doc} shows no answer of its examples"
    assert not problems, (
        f"{doc}: documented answers differ from the service's (CLIP_UPDATE_DOC_OUTPUTS=1 rewrites them):\n"
        + "\n".join(problems)
    )


@pytest.mark.parametrize("doc", list(DOCS))
def test_the_shell_examples_run_and_answer_right(doc: str, server: tuple[str, Recorder], clone: Path) -> None:
    url, recorder = server
    host_port = url.removeprefix("http://")
    scripts = api_blocks(DOCS[doc].read_text(encoding="utf-8"))
    assert scripts, f"{doc} has no API examples"
    recorder.take()
    # One shell for the whole document, as a reader would type them (variables carry over). The
    # README's examples start with `cd examples`; docs/api.md's run from that folder.
    cwd = clone if doc == "README.md" else clone / "examples"
    # A marker request after each block tells which answers each block's commands got.
    marked = [
        f"{script}\ncommand curl -s -o /dev/null 'http://{host_port}/healthz?{MARKER}={i}'"
        for i, script in enumerate(scripts)
    ]
    run_bash("\n".join(marked), cwd, host_port)
    exchanges = recorder.take()
    compare_documented_outputs(doc, scripts, split_by_marker(exchanges))
    exchanges = [e for e in exchanges if MARKER not in e.query]
    checked = {path for path in map(check, exchanges) if path is not None}
    missing = CHECKED[doc] - checked
    assert not missing, f"{doc}: no checked answer from {sorted(missing)}; requests: {[e.path for e in exchanges]}"
    if doc == "docs/api.md":
        assert (clone / "examples" / "heatmap.png").read_bytes().startswith(b"\x89PNG")


def test_the_readme_sdk_example_runs_as_written(server: tuple[str, Recorder], clone: Path) -> None:
    url, recorder = server
    text = DOCS["README.md"].read_text(encoding="utf-8")
    sdk = [b for b in blocks(text, "python") if "Client(" in b]
    assert len(sdk) == 1
    recorder.take()
    printed = run_python(with_host(sdk[0], url.removeprefix("http://")), clone / "examples").splitlines()
    exchanges = recorder.take()
    checked = {path for path in map(check, exchanges) if path is not None}
    assert {"/rank-pair", "/classify"} <= checked, [e.path for e in exchanges]
    assert printed[0].split()[0] == "a"  # pair.first: the big circle is the larger
    assert printed[1].split()[0] == "circle"  # the top label of the big circle


def test_the_api_reference_python_examples_run(server: tuple[str, Recorder], clone: Path) -> None:
    url, recorder = server
    text = DOCS["docs/api.md"].read_text(encoding="utf-8")
    sdk = _sdk_module(text)
    examples = blocks(text, "python")
    assert len(examples) >= 10
    recorder.take()
    for code in examples:
        # A fragment continues an earlier example's `client`; give it one.
        prelude = "" if "Client(" in code else f"from {sdk} import Client\nclient = Client({url!r})\n"
        run_python(prelude + with_host(code, url.removeprefix("http://")), clone / "examples")
    exchanges = recorder.take()
    checked = {path for path in map(check, [e for e in exchanges if e.status == 200]) if path is not None}
    assert {"/rank-pair", "/classify", "/rank", "/score/dense", "/embed"} <= checked
    # The one error example asks for it (a duplicate label); every other answer is a success.
    refused = [e for e in exchanges if e.status != 200]
    assert [(e.path, e.status, e.response_json()["error"]["code"]) for e in refused] == [
        ("/classify", 400, "bad_input")
    ]
