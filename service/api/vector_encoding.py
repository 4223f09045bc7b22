"""How embeddings travel in a response: JSON floats, or base64 of packed little-endian floats.

``base64`` is OpenAI's format (float32, little-endian, one string per vector), so its clients
decode it unchanged; ``float16`` halves that again. Served embeddings are float16-rounded
already (see ``service.runtime.cache``), so float16 loses nothing they hold.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

EncodingFormat = Literal["float", "base64", "float16"]
PACKED_DTYPES: dict[str, np.dtype[Any]] = {"base64": np.dtype("<f4"), "float16": np.dtype("<f2")}


def encode_rows(vectors: np.ndarray, encoding_format: EncodingFormat) -> list[list[float]] | list[str]:
    """Rows of an ``(N, D)`` array as JSON floats or as base64 strings of their packed bytes."""
    if encoding_format == "float":
        return np.asarray(vectors, dtype=np.float32).tolist()  # type: ignore[no-any-return]
    packed = np.ascontiguousarray(vectors, dtype=PACKED_DTYPES[encoding_format])
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in packed]


def decode_rows(rows: Sequence[list[float] | str], encoding_format: EncodingFormat) -> np.ndarray:
    """``encode_rows`` undone: an ``(N, D)`` float32 array."""
    if encoding_format == "float":
        return np.asarray(rows, dtype=np.float32)
    packed = [row for row in rows if isinstance(row, str)]
    if len(packed) != len(rows):
        raise ValueError(f"{encoding_format} rows are strings")
    dtype = PACKED_DTYPES[encoding_format]
    return np.stack([np.frombuffer(base64.b64decode(row), dtype=dtype) for row in packed]).astype(np.float32)
