"""A model version loaded from the store: image tower, text-encoder variants, tokenizer.

Text-encoder variants (``base``, ``pcclip``, ...) are full text towers that share the one
image tower; a variant's file holds only the tensors that differ from the base weights.
This is the one place that turns a manifest into encoders, for serving and evaluation alike.
A version published with a DCSM scorer (``components["dcsm"]``) also gets ``dcsm`` (the head)
and ``dense`` (a ``DenseEncoder`` over the base model) for dense token x patch scoring. The
manifest's ``components`` are parsed once, here (``components``: a ``Components``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from open_clip.model import CLIP
from PIL import Image
from safetensors.torch import load_file

from clipcore.models.clip_model import (
    architecture_config,
    family,
    load_architecture,
    normalize,
    text_features,
    tokenizer_for,
)
from clipcore.models.components import BASE_ENCODER, Components
from clipcore.models.dense import DCSMHead, DenseEncoder, DenseRunner
from clipcore.models.encoding import encode_pixels
from clipcore.models.hf_tokenizer import HfTextTokenizer, hf_tokenizer_dir
from clipcore.models.preprocess import PreprocessConfig
from clipcore.models.tokenizer import BoundedTokenizer
from clipcore.models.yukino import YukinoHead, prompt_features
from model_store import Manifest, ModelStore

START_LABEL, END_LABEL = "<start>", "<end>"


def _token_text(tok: Any, token_id: int) -> str:
    """Readable text of one BPE token (its bytes back to UTF-8, without the word-end mark)."""
    piece = tok.decoder[token_id].removesuffix("</w>")
    return bytearray(tok.byte_decoder[c] for c in piece).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class DenseLayout:
    """How the DCSM scorer reads one text: which of its L positions hold tokens and which of
    them are functional words (their map rows are replaced by fixed table rows)."""

    valid: np.ndarray  # (L,) bool: start token .. end token, cut at L
    row_index: np.ndarray  # (L,) int64: functional group of each position, -1 otherwise
    words: list[str]  # functional words found, in order
    labels: list[str]  # text of each valid position ("<start>", "red", "cy", "an", ..., "<end>")
    truncated: bool  # some tokens did not fit the L positions (or the model context)


def _dropped(tok: BoundedTokenizer, text: str, positions: int) -> bool:
    """Whether part of ``text`` is lost in ``positions`` token positions (start and end included)."""
    ids, cut = tok.encode_with_cut(text)
    return cut or len(ids) + 2 > positions


def load_weights(model: CLIP, path: Path, strict: bool = True) -> None:
    """Load ``path`` into ``model`` in fp32. The loaded tensors become the parameters (``assign``)
    rather than being copied into them: an fp32 file's tensors are safetensors' copy-on-write
    mapping of the file, so its pages are read on first use, count as file-backed memory the
    kernel may drop and read again, and rows nobody reads (most of a token-embedding table) never
    take memory; an fp16 file is widened into new tensors either way."""
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    model.load_state_dict(state, strict=strict, assign=True)


@dataclass
class ModelBundle:
    name: str
    version: str
    manifest: Manifest
    components: Components  # the manifest's, parsed
    directory: Path
    model: CLIP
    text_models: dict[str, CLIP]
    default_text_encoder: str
    device: str = "cpu"
    comparatives: list[dict[str, Any]] = field(default_factory=list)
    dcsm: DCSMHead | None = None
    dense: DenseEncoder | None = None
    yukino: YukinoHead | None = None
    hf_tokenizer: HfTextTokenizer | None = None  # set when the manifest's tokenizer is ``hf:<folder>``

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def context_length(self) -> int:
        return self.manifest.context_length

    @property
    def family(self) -> str:
        """``clip``, ``custom_text`` or ``coca`` (see ``clip_model.family``)."""
        return family(self.model)

    def per_token_unsupported(self, method: str) -> str | None:
        """Why ``method`` (DCSM, YUKINO: methods that read per-token features) cannot run on this
        model's family, or None when it can."""
        if self.family == "clip":
            return None
        return (
            f"{method} needs per-token text features, which only the CLIP family provides; "
            f"{self.ref} is a {type(self.model).__name__}"
        )

    @property
    def image_size(self) -> int:
        return self.manifest.image_size

    @property
    def preprocess_config(self) -> PreprocessConfig:
        return PreprocessConfig.from_manifest(self.manifest.preprocess)

    @property
    def mean(self) -> tuple[float, ...]:
        """Per-channel pixel mean of the version's preprocessing."""
        return self.preprocess_config.mean

    @property
    def std(self) -> tuple[float, ...]:
        """Per-channel pixel standard deviation of the version's preprocessing."""
        return self.preprocess_config.std

    @property
    def embed_dim(self) -> int:
        return self.manifest.embed_dim

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.exp().clamp(max=100).item())

    @property
    def logit_bias(self) -> float | None:
        """SigLIP-style models' learnt bias of their sigmoid logits (None for softmax-trained CLIPs).

        Zero-shot probabilities stay a softmax over the labels: the bias is one constant added to
        every label's logit, so it cancels there; see docs/models.md."""
        bias = getattr(self.model, "logit_bias", None)
        return None if bias is None else float(bias.item())

    @classmethod
    def load(cls, store: ModelStore, ref: str, device: str = "cpu") -> ModelBundle:
        """Resolve, verify checksums, build and load every text-encoder variant."""
        name, version = store.resolve(ref)
        manifest, directory = store.load_verified(name, version)
        return cls.from_directory(manifest, directory, device)

    @classmethod
    def from_directory(cls, manifest: Manifest, directory: Path, device: str = "cpu") -> ModelBundle:
        components = Components.from_manifest(manifest.components)
        model = load_architecture(manifest.architecture, device="cpu")
        if components.weights is not None:
            load_weights(model, directory / components.weights)
        model = model.to(device).eval()
        text_models = {BASE_ENCODER: model}
        for variant, filename in components.text_encoders.items():
            text_part = {k: v.float() for k, v in load_file(str(directory / filename)).items()}
            if any(k.startswith("visual.") for k in text_part):
                raise ValueError(f"text encoder {variant!r} must not contain image weights")
            tower = load_architecture(manifest.architecture)
            tower.load_state_dict({**model.state_dict(), **{k: v.to(device) for k, v in text_part.items()}})
            tower = tower.to(device)
            tower.visual = model.visual  # one image tower shared by every text variant
            text_models[variant] = tower.eval()
        comparatives: list[dict[str, Any]] = []
        if (directory / "comparatives.json").exists():
            comparatives = json.loads((directory / "comparatives.json").read_text())
        default = components.default_text_encoder
        if default not in text_models:
            raise ValueError(f"default text encoder {default!r} is not among {sorted(text_models)}")
        bundle = cls(
            manifest.name,
            manifest.version,
            manifest,
            components,
            directory,
            model,
            text_models,
            default,
            device,
            comparatives,
        )
        folder = hf_tokenizer_dir(manifest.tokenizer)
        if folder is not None:
            text_cfg = architecture_config(manifest.architecture).get("text_cfg", {})
            bundle.hf_tokenizer = HfTextTokenizer(directory / folder, text_cfg, manifest.context_length)
        if bundle.family != "clip":
            # Per-token components cannot run on this family; the load check refuses to publish them,
            # and a version that has them anyway serves its pooled methods (dense requests get a 400).
            return bundle
        bundle.dcsm = DCSMHead.from_components(directory, components)
        if bundle.dcsm is not None:
            # Dense features come from the base towers: the scorer was trained on those.
            bundle.dense = bundle.dcsm.encoder(
                model, manifest.context_length, device=device, mean=bundle.mean, std=bundle.std
            )
        bundle.yukino = YukinoHead.from_components(directory, components, device)
        if bundle.yukino is not None and bundle.yukino.text_encoder not in text_models:
            raise ValueError(f"YUKINO needs text encoder {bundle.yukino.text_encoder!r}; have {sorted(text_models)}")
        return bundle

    def text_model(self, encoder: str | None) -> CLIP:
        name = encoder or self.default_text_encoder
        if name not in self.text_models:
            raise KeyError(f"unknown text encoder {name!r}; this model has {sorted(self.text_models)}")
        return self.text_models[name]

    def preprocess(self, image: Image.Image) -> np.ndarray:
        return self.preprocess_config.fit(image, self.image_size)

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids, trimmed to the batch's longest text (whether a text was cut: ``text_truncated``).

        One bounded BPE pass per text (``BoundedTokenizer``); a text longer than the context keeps
        its first tokens and ends with the end token, as open_clip's tokenizer does. A version with a
        Hugging Face tokenizer gives its full-context ids instead (``HfTextTokenizer``), in one pass.
        """
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.tokenize(texts)
        tok = tokenizer_for(self.context_length)
        sot, eot = tok.sot_token_id, tok.eot_token_id
        rows = []
        for text in texts:
            ids = [sot, *tok.encode(text), eot]
            if len(ids) > self.context_length:
                ids = ids[: self.context_length]
                ids[-1] = eot
            rows.append(ids)
        width = max(len(r) for r in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = torch.tensor(r)
        return tokens

    @property
    def tokenizer_key(self) -> str:
        """Names the tokenization (for memos of per-text results shared across versions)."""
        if self.hf_tokenizer is not None:
            return f"{self.ref}/{self.context_length}"
        return f"bpe/{self.context_length}"

    def token_count(self, text: str) -> int:
        """Tokens ``text`` is encoded with, special ones included, at most the context: what
        OpenAI-style usage counts. The version's own tokenizer, BPE or Hugging Face."""
        if self.hf_tokenizer is not None:
            return min(self.hf_tokenizer.full_length(text), self.context_length)
        ids, _ = tokenizer_for(self.context_length).encode_with_cut(text)
        return min(len(ids) + 2, self.context_length)  # + start and end tokens

    def text_truncated(self, text: str) -> bool:
        """Whether ``text`` is cut to the model context."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.truncated(text)
        return tokenizer_for(self.context_length).truncated(text)

    @torch.no_grad()
    def encode_images(self, images: np.ndarray) -> np.ndarray:
        """(N, S, S, 3) uint8 preprocessed images -> (N, D) L2-normalised float32."""
        return encode_pixels(self.model, self.preprocess_config, images, device=self.device)[0].cpu().numpy()

    @torch.no_grad()
    def encode_tokens(self, tokens: torch.Tensor, encoder: str | None = None) -> np.ndarray:
        model = self.text_model(encoder)
        return normalize(text_features(model, tokens.to(self.device))[0]).float().cpu().numpy()

    def encode_texts(self, texts: Sequence[str], encoder: str | None = None) -> np.ndarray:
        """Texts -> (N, D) L2-normalised float32 with the chosen text-encoder variant."""
        return self.encode_tokens(self.tokenize(texts), encoder)

    # ------------------------------------------------------------------ YUKINO
    @torch.no_grad()
    def yukino_prompts(self, images: np.ndarray) -> np.ndarray:
        """(N, S, S, 3) uint8 preprocessed images -> (N, 2, D): each image's "a photo of $" and
        "a photo of no $" features with its inverted pseudo-token, in YUKINO's text encoder."""
        if self.yukino is None:
            raise ValueError(f"{self.ref} has no YUKINO component")
        _, tokens = encode_pixels(self.model, self.preprocess_config, images, device=self.device, dense=True)
        assert tokens is not None
        pseudo = self.yukino.inverter(tokens)
        yes, no = prompt_features(self.text_model(self.yukino.text_encoder), pseudo, self.context_length)
        return torch.stack([yes, no], dim=1).cpu().numpy()

    # ------------------------------------------------------------------ DCSM (dense) scoring
    def dense_encoder(self) -> DenseEncoder:
        if self.dense is None:
            raise ValueError(f"{self.ref} has no DCSM component")
        return self.dense

    def encode_dense_images(self, images: np.ndarray, runner: DenseRunner | None = None) -> np.ndarray:
        """(N, S, S, 3) uint8 preprocessed images -> (N, 1+P, D) normalised class + patch tokens
        (from ``runner``'s graphs when given, else torch)."""
        return self.dense_encoder().image_tokens(images, runner).numpy()

    def encode_dense_texts(self, texts: Sequence[str], runner: DenseRunner | None = None) -> np.ndarray:
        """Texts -> (N, L, D) normalised token features; rows past the end token are 0.

        The text tower runs on a batch cut to its longest text, and that width changes the last
        bits of every result; so texts are encoded in groups of one token count, and a text's
        features never depend on what else shares its batch.
        """
        enc = self.dense_encoder()
        counts = [min(len(enc.tokenizer.encode(t)) + 2, self.context_length) for t in texts]
        out = np.zeros((len(texts), enc.length, self.embed_dim), dtype=np.float32)
        for count in sorted(set(counts)):
            rows = [i for i, c in enumerate(counts) if c == count]
            out[rows] = enc.text_features([texts[i] for i in rows], runner).tokens.numpy()
        return out

    def dense_layouts(self, texts: Sequence[str]) -> list[DenseLayout]:
        """Token positions, functional rows and labels of each text, on the ids the tower sees.

        Not thread-safe (the encoder memoises rows per text): call it on the model thread.
        """
        enc = self.dense_encoder()
        tok = enc.tokenizer
        out = []
        for text, row in zip(texts, tok(list(texts)).tolist(), strict=True):
            ids = row[: row.index(tok.eot_token_id) + 1]  # truncated texts end with a forced end token
            rows, words = enc.functional_rows(ids)
            n = min(len(ids), enc.length)
            labels = [START_LABEL, *(_token_text(tok, i) for i in ids[1:n])]
            if ids[n - 1] == tok.eot_token_id:
                labels[-1] = END_LABEL
            out.append(
                DenseLayout(
                    valid=np.arange(enc.length) < n,
                    row_index=np.asarray(rows, dtype=np.int64),
                    words=list(words),
                    labels=labels,
                    truncated=_dropped(tok, text, min(len(row), enc.length)),
                )
            )
        return out

    @torch.no_grad()
    def score_dense(
        self, image_tokens: np.ndarray, text_tokens: np.ndarray, layouts: Sequence[DenseLayout]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One image's tokens (1+P, D) against N texts' tokens (N, L, D): scores (N,) and the
        z-scored maps (N, L, 1+P) the scorer read.

        Each text is scored on its own (a batch of one), so a score is bit-for-bit the same
        whatever else the request or the server is scoring.
        """
        if self.dcsm is None:
            raise ValueError(f"{self.ref} has no DCSM component")
        # torch.tensor copies: cached features are read-only arrays.
        img = torch.tensor(np.asarray(image_tokens, dtype=np.float32))[None]
        scores, maps = [], []
        for tokens, layout in zip(text_tokens, layouts, strict=True):
            tok = torch.tensor(np.asarray(tokens, dtype=np.float32))[None]
            score, m = self.dcsm.score_maps(img, tok, torch.tensor(layout.valid)[None],
                                            torch.tensor(layout.row_index)[None])  # fmt: skip
            scores.append(float(score[0]))
            maps.append(m[0].numpy())
        return np.asarray(scores, dtype=np.float32), np.stack(maps)
