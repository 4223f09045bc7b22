"""Comparative texts from an OpenAI-compatible chat endpoint, filtered, retried and cached on disk.

Any server that speaks ``POST {base_url}/chat/completions`` works (OpenAI, vLLM, llama.cpp's
server, Ollama's OpenAI API, ...). The prompt is few-shot in PC-CLIP's question / answer form; a
model continues it with one sentence in the "The first ..., while the second ..." form, and often
with more than was asked for. ``clean_comparative`` keeps the sentence and drops what cannot be a
caption: code, markup, non-ASCII junk, a next "Q:", notes and pleasantries ("Note", "I hope"),
numbered alternatives ("#2:"), and anything under 60 characters.

Responses are cached by (base URL, model, prompt, sample index) in a folder, so a rerun of the same
command makes no calls. The API key is read from an environment variable (never from a flag, so it
stays out of shell history and process lists) and never logged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

MIN_CHARS = 60
CUT_MARKERS = ("Q:", "Note", "I hope", "#2:")
_JUNK = re.compile(r"```|<[^>]+>|\bdef |\bimport |[{}\[\]|\\]|https?://")
FEW_SHOT = """\
Q: How does a photo of a tabby cat differ from a photo of a tiger cat? Answer in one sentence that starts with "The first".
A: The first shows a cat with swirling blotched stripes on a grey-brown coat, while the second shows narrow vertical stripes like a tiger's over an orange coat.
Q: How does a photo of a sports car differ from a photo of a minivan? Answer in one sentence that starts with "The first".
A: The first shows a low, sleek two-door car with a long hood, while the second shows a tall, boxy vehicle with sliding side doors and many windows.
Q: How does a photo of {a} differ from a photo of {b}? Answer in one sentence that starts with "The first".
A:"""  # noqa: E501


def prompt_for(a: str, b: str) -> str:
    return FEW_SHOT.format(a=_with_article(a), b=_with_article(b))


def _with_article(label: str) -> str:
    return f"{'an' if label[:1].lower() in 'aeiou' else 'a'} {label}"


def clean_comparative(text: str) -> str | None:
    """The usable comparative in a model's answer, or None."""
    text = re.sub(r"^A:\s*", "", text.strip()).strip().strip('"').strip()
    for marker in CUT_MARKERS:
        at = text.find(marker)
        if at >= 0:
            text = text[:at]
    text = text.split("\n\n")[0]
    if not text.isascii() or _JUNK.search(text):
        return None
    text = re.sub(r"[*_#]+", "", text)  # markdown emphasis and headings: the words are kept
    text = " ".join(text.split()).strip('"').strip()
    if len(text) < MIN_CHARS:
        return None
    return text


class LLMError(RuntimeError):
    """The endpoint kept failing (after retries) or answered in an unknown shape."""


@dataclass
class ChatClient:
    """A minimal OpenAI-compatible chat client: retries with exponential backoff, a disk cache."""

    base_url: str
    model: str
    cache_dir: Path
    api_key_env: str = "OPENAI_API_KEY"
    retries: int = 4
    backoff_s: float = 1.0
    timeout_s: float = 60.0
    temperature: float = 0.7
    max_tokens: int = 120
    calls: int = 0  # requests actually sent (cache hits send none)

    def _cache_path(self, prompt: str, sample: int) -> Path:
        key = json.dumps([self.base_url.rstrip("/"), self.model, prompt, sample, self.temperature])
        return self.cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def complete(self, prompt: str, sample: int = 0) -> str:
        path = self._cache_path(prompt, sample)
        if path.exists():
            return str(json.loads(path.read_text())["content"])
        content = self._request(prompt)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"prompt": prompt, "model": self.model, "content": content}))
        tmp.replace(path)
        return content

    def _request(self, prompt: str) -> str:
        headers = {"content-type": "application/json"}
        if key := os.environ.get(self.api_key_env):
            headers["authorization"] = f"Bearer {key}"
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        url = f"{self.base_url.rstrip('/')}/chat/completions"
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.calls += 1
            try:
                resp = httpx.post(url, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last = f"HTTP {resp.status_code}"
                continue
            if resp.status_code != 200:
                raise LLMError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
            try:
                return str(resp.json()["choices"][0]["message"]["content"])
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise LLMError(f"{url} answered in an unknown shape: {resp.text[:300]}") from exc
        raise LLMError(f"{url} failed {self.retries + 1} times (last: {last})")


def llm_comparatives(client: ChatClient, a: str, b: str, samples: int = 3) -> list[str]:
    """Up to ``samples`` distinct clean comparatives of ``a`` against ``b``."""
    texts: list[str] = []
    for sample in range(samples):
        cleaned = clean_comparative(client.complete(prompt_for(a, b), sample))
        if cleaned is not None and cleaned not in texts:
            texts.append(cleaned)
    return texts
