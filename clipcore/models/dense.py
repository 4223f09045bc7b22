"""Dense (per-token and per-patch) features for DCSM, and a loaded DCSM scorer.

``DenseEncoder`` turns texts into L fixed positions of normalised token features with a
validity mask and the functional-row index of every position, and images into normalised
class + patch tokens. Functional words are located on the real token ids the text tower
sees: position 0 is the start token, so a word's tokens start at position 1 or later (an
implementation that looks words up without the start token lands one position early).
``DCSMHead`` is the scorer with its functional-row table and config, as stored in a model
version (``dcsm.safetensors`` + the config in the manifest's ``components["dcsm"]``).

The towers run in torch unless a call is given a ``runner`` (the ONNX backend's dense graphs,
``clipcore.backends.onnx.OnnxTowers``): then the runner computes the features and
everything around them (positions, masks, functional rows) stays here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from open_clip.model import CLIP
from safetensors.torch import load, load_file, save

from clipcore.methods.dcsm import (
    DEFAULT_LENGTH,
    DEFAULT_SCORER_CONFIG,
    FUNCTIONAL_GROUPS,
    DCSMScorer,
    dcsm_scores,
    prepare_maps,
)
from clipcore.methods.token_spans import find_word_spans
from clipcore.models.clip_model import normalize, text_features, tokenizer_for, trimmed
from clipcore.models.components import Components
from clipcore.models.encoding import encode_pixels
from clipcore.models.preprocess import OPENAI_MEAN, OPENAI_STD, PreprocessConfig

TABLE_KEY = "functional_table"
SCORER_PREFIX = "scorer."
# Rows of recent token sequences: a text's layout and its features ask for the same rows, and
# training repeats captions. Keyed by token ids (at most the context), never by the text (up to
# max_text_chars each): 4,096 entries hold a few MB whatever the texts.
ROW_CACHE_SIZE = 4096


class DenseRunner(Protocol):
    """Normalised (pooled, per-position) features from uint8 pixels / full-context token ids."""

    def dense_image_features(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def dense_text_features(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class DenseText:
    tokens: torch.Tensor  # (B, L, D) normalised, padding rows 0
    valid: torch.Tensor  # (B, L) bool: start token .. end token
    row_index: torch.Tensor  # (B, L) long: functional group, -1 for ordinary tokens
    pooled: torch.Tensor  # (B, D) normalised sentence embedding
    words: list[list[str]]  # functional words found in each text, in order
    truncated: list[bool]


class DenseEncoder:
    """Dense text and image features of one CLIP model for DCSM."""

    def __init__(
        self,
        model: CLIP,
        context_length: int,
        functional_groups: Mapping[str, Sequence[str]] = FUNCTIONAL_GROUPS,
        length: int = DEFAULT_LENGTH,
        mean: Sequence[float] = OPENAI_MEAN,
        std: Sequence[float] = OPENAI_STD,
        device: str = "cpu",
    ) -> None:
        self.model, self.length, self.device = model, length, device
        self.mean, self.std = tuple(mean), tuple(std)
        self.tokenizer = tokenizer_for(context_length)
        # Row i of the functional-row table belongs to the i-th group by name: manifests are
        # stored with sorted keys, so no other order survives a publish.
        self.groups = {g: tuple(functional_groups[g]) for g in sorted(functional_groups)}
        self.group_of = {w: i for i, ws in enumerate(self.groups.values()) for w in ws}
        self.word_ids = {w: self.tokenizer.encode(w) for w in self.group_of}
        self._rows: OrderedDict[tuple[int, ...], tuple[list[int], list[str]]] = OrderedDict()

    def word_start_ok(self, ids: Sequence[int]) -> list[bool]:
        # A word starts right after the start token or after a token that ends a word, so
        # "but" inside "rebut" (re + but</w>) is not the functional word.
        sot = self.tokenizer.sot_token_id
        decoder = self.tokenizer.decoder
        return [i > 0 and (ids[i - 1] == sot or decoder.get(ids[i - 1], "").endswith("</w>")) for i in range(len(ids))]

    def functional_rows(self, ids: Sequence[int]) -> tuple[list[int], list[str]]:
        """Per position (first L) of the token ``ids``: functional group index or -1; and the words found."""
        key = tuple(ids)
        if key in self._rows:
            self._rows.move_to_end(key)
            return self._rows[key]
        rows = [-1] * self.length
        words = []
        for start, end, word in find_word_spans(key, self.word_ids, self.word_start_ok(key)):
            words.append(word)
            for t in range(start, min(end, self.length)):
                rows[t] = self.group_of[word]
        self._rows[key] = (rows, words)
        if len(self._rows) > ROW_CACHE_SIZE:  # a serving process sees unbounded distinct texts
            self._rows.popitem(last=False)
        return rows, words

    @torch.no_grad()
    def text_features(self, texts: Sequence[str], runner: DenseRunner | None = None) -> DenseText:
        """Per-position features of ``texts``, from ``runner``'s graphs when given, else torch."""
        texts = list(texts)
        full = self.tokenizer(texts)  # (B, context) with end token forced in when truncated
        ids_per_text = []
        for row in full.tolist():
            eot = row.index(self.tokenizer.eot_token_id)
            ids_per_text.append(row[: eot + 1])
        truncated = [self.tokenizer.truncated(t) for t in texts]
        if runner is not None:  # full context: the causal mask keeps positions <= end exact
            pooled_np, tok_np = runner.dense_text_features(full.numpy())
            pooled, tok = torch.from_numpy(pooled_np), torch.from_numpy(tok_np)
        else:
            tokens = trimmed(full).to(self.device)
            pooled, tok_raw = text_features(self.model, tokens, dense=True)
            assert tok_raw is not None
            tok = normalize(tok_raw.float())
        b, n, d = tok.shape
        out = torch.zeros(b, self.length, d)
        keep = min(n, self.length)
        out[:, :keep] = tok[:, :keep].cpu()
        eot_pos = torch.tensor([len(ids) - 1 for ids in ids_per_text])
        valid = torch.arange(self.length)[None] <= eot_pos[:, None]
        out = out * valid[:, :, None]  # padding rows carry nothing, whatever shares the batch
        rows_words = [self.functional_rows(ids) for ids in ids_per_text]
        row_index = torch.tensor([rw[0] for rw in rows_words], dtype=torch.long)
        row_index = torch.where(valid, row_index, torch.full_like(row_index, -1))
        return DenseText(
            out, valid, row_index, normalize(pooled.float()).cpu(), [rw[1] for rw in rows_words], truncated
        )

    def text_tokens(
        self, texts: Sequence[str], runner: DenseRunner | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tok (B, L, D) normalised, valid (B, L), row_index (B, L))."""
        f = self.text_features(texts, runner)
        return f.tokens, f.valid, f.row_index

    @torch.no_grad()
    def image_features(
        self, images: np.ndarray, runner: DenseRunner | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, S, S, 3) uint8 -> pooled (N, D) and tokens (N, 1+P, D), both normalised; from
        ``runner``'s graphs when given, else torch."""
        if runner is not None:
            pooled_np, tok_np = runner.dense_image_features(images)
            return torch.from_numpy(pooled_np), torch.from_numpy(tok_np)
        preprocess = PreprocessConfig(mean=self.mean, std=self.std)
        pooled, tok = encode_pixels(self.model, preprocess, images, device=self.device, dense=True)
        if tok is None:
            raise ValueError("this image tower does not expose patch tokens")
        return pooled.cpu(), tok.cpu()

    def image_tokens(self, images: np.ndarray, runner: DenseRunner | None = None) -> torch.Tensor:
        return self.image_features(images, runner)[1]


@dataclass
class DCSMHead:
    """A trained scorer, its functional-row table and its config (groups, length, layout)."""

    scorer: DCSMScorer
    table: torch.Tensor
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def functional_groups(self) -> dict[str, tuple[str, ...]]:
        return {g: tuple(ws) for g, ws in self.config.get("functional_groups", FUNCTIONAL_GROUPS).items()}

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> DCSMHead:
        cfg = {**DEFAULT_SCORER_CONFIG, **dict(config)}
        scorer = DCSMScorer(cfg)
        weights = {k[len(SCORER_PREFIX) :]: v.float() for k, v in state.items() if k.startswith(SCORER_PREFIX)}
        scorer.load_state_dict(weights)
        return cls(scorer.eval(), state[TABLE_KEY].float(), cfg)

    @classmethod
    def load(cls, path: Path, config: Mapping[str, Any]) -> DCSMHead:
        return cls.from_state(load_file(str(path)), config)

    @classmethod
    def from_bytes(cls, data: bytes, config: Mapping[str, Any]) -> DCSMHead:
        return cls.from_state(load(data), config)

    @classmethod
    def from_components(cls, directory: Path, components: Components) -> DCSMHead | None:
        """The head of a model version (``components.dcsm``), or None if it has none."""
        entry = components.dcsm
        if entry is None:
            return None
        return cls.load(directory / entry.weights, entry.config)

    def encoder(self, model: CLIP, context_length: int, **kwargs: Any) -> DenseEncoder:
        return DenseEncoder(model, context_length, self.functional_groups, int(self.config["length"]), **kwargs)

    @torch.no_grad()
    def score_maps(
        self, img_tok: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, row_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (B,) of image tokens (B, 1+P, D) against text tokens (B, L, D), and the maps
        (B, L, 1+P) the scorer read: z-scored, functional rows in place."""
        maps = prepare_maps(img_tok, tokens, valid, row_index, self.table)
        return dcsm_scores(self.scorer.eval(), maps), maps

    def score(self, img_tok: torch.Tensor, text: DenseText) -> torch.Tensor:
        """Scores of image tokens (B, 1+P, D) or (1, 1+P, D) against B texts."""
        if img_tok.shape[0] == 1 and text.tokens.shape[0] > 1:
            img_tok = img_tok.expand(text.tokens.shape[0], -1, -1)
        return self.score_maps(img_tok, text.tokens, text.valid, text.row_index)[0]


def dcsm_state_bytes(scorer_state: Mapping[str, torch.Tensor], table: torch.Tensor) -> bytes:
    """``dcsm.safetensors``: scorer weights under ``scorer.`` plus the functional-row table."""
    out = {SCORER_PREFIX + k: v.detach().cpu().float().contiguous() for k, v in scorer_state.items()}
    out[TABLE_KEY] = table.detach().cpu().float().contiguous()
    return save(out)


def dcsm_files(
    scorer_state: Mapping[str, torch.Tensor], config: Mapping[str, Any], table: torch.Tensor
) -> dict[str, bytes]:
    """Files of the DCSM component of a model version: weights + table (the config lives in the
    manifest's component entry, ``dcsm_component``)."""
    return {"dcsm.safetensors": dcsm_state_bytes(scorer_state, table)}


def dcsm_component(config: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest entry: ``components["dcsm"] = dcsm_component(config)``."""
    return {"weights": "dcsm.safetensors", "config": dict(config)}
