"""Hugging Face tokenizers held inside a version (SigLIP's SentencePiece, PE-Core's, ...).

An architecture whose text config names ``hf_tokenizer_name`` tokenizes with that tokenizer, not
open_clip's BPE. Its files are copied into the version under ``tokenizer/`` at import (and so are
checksummed like the weights); the manifest's ``tokenizer`` is then ``hf:tokenizer``. Loading reads
that folder only (``local_files_only``): nothing is downloaded. The tokenization is open_clip's own
``HFTokenizer`` with the text config's ``tokenizer_kwargs`` (cleaning, separator stripping) and
``tokenizer_mode``, so ids equal what ``open_clip.get_tokenizer`` gives for the same model.

Needs the ``transformers`` package (the ``hf`` extra); without it such a version is refused with
that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

BPE_TOKENIZER = "open_clip:bpe"  # the manifest's value for open_clip's own BPE tokenizer
HF_TOKENIZER_PREFIX = "hf:"
TOKENIZER_DIR = "tokenizer"
# The files a saved Hugging Face tokenizer may consist of (others in the folder are not copied).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)


class TokenizerUnavailable(ValueError):
    """The version's tokenizer cannot be loaded; the message says why."""


def hf_tokenizer_dir(tokenizer: str) -> str | None:
    """The folder inside the version of a manifest's ``hf:<folder>`` tokenizer, else None."""
    return tokenizer[len(HF_TOKENIZER_PREFIX) :] if tokenizer.startswith(HF_TOKENIZER_PREFIX) else None


def find_tokenizer_files(directory: Path) -> dict[str, Path]:
    """The tokenizer files in ``directory`` (empty when it holds no saved tokenizer)."""
    found = {name: directory / name for name in TOKENIZER_FILES if (directory / name).is_file()}
    if not {"tokenizer.json", "tokenizer_config.json"} & set(found):
        return {}
    return found


class HfTextTokenizer:
    """Token ids for a text tower from a tokenizer folder, padded to the full context."""

    def __init__(self, directory: Path, text_cfg: dict[str, Any], context_length: int) -> None:
        from open_clip.tokenizer import HFTokenizer

        if not directory.is_dir():
            raise TokenizerUnavailable(f"the tokenizer folder {directory.name}/ is missing from the version")
        try:
            self._tokenizer = HFTokenizer(
                str(directory),
                context_length=context_length,
                tokenizer_mode=text_cfg.get("tokenizer_mode"),
                local_files_only=True,
                **text_cfg.get("tokenizer_kwargs", {}),
            )
        except ImportError:
            raise TokenizerUnavailable(
                "this version tokenizes with a Hugging Face tokenizer, which needs the transformers package "
                "(pip install '.[hf]')"
            ) from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise TokenizerUnavailable(f"the tokenizer in {directory.name}/ does not load: {exc}") from None
        self.context_length = context_length

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (its vocabulary with added tokens)."""
        return len(self._tokenizer.tokenizer)

    def full_length(self, text: str) -> int:
        """Tokens of ``text``, special ones included, before cutting to the context."""
        clean = self._tokenizer.clean_fn(text)
        return len(self._tokenizer.tokenizer(clean, truncation=False).input_ids)

    def truncated(self, text: str) -> bool:
        """Whether ``text`` has more tokens (special ones included) than the context holds."""
        return self.full_length(text) > self.context_length

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """(N, context_length) ids as open_clip's ``HFTokenizer`` makes them (one pass per text; a
        caller that needs to know whether a text was cut asks ``truncated``)."""
        return self._tokenizer(list(texts))
