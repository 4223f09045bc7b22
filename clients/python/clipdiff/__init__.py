"""Python client for the CLIP difference & composition scoring service.

>>> from clipdiff import Client
>>> with Client("http://127.0.0.1:8000") as client:
...     client.classify(["cat.png"], ["cat", "dog"]).labels
"""

from clipdiff.client import AsyncClient, Client
from clipdiff.errors import (
    BadRequest,
    ClipServiceError,
    ConnectionFailed,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)
from clipdiff.images import ImageRef, image_bytes, image_id, image_input, image_sha256
from clipdiff.models import (
    ClassifyResult,
    CollectionAdd,
    CollectionHit,
    CollectionInfo,
    CollectionJob,
    CollectionSearch,
    ComparativeInfo,
    DenseResult,
    EmbedResult,
    ImageClassification,
    LabelScore,
    MeasuredEffect,
    ModelInfo,
    ModelsInfo,
    PairResult,
    RankedImage,
    RankResult,
    ServedModel,
    ServerLimits,
    VersionInfo,
)
from clipdiff.transport import RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadRequest",
    "ClassifyResult",
    "CollectionAdd",
    "CollectionHit",
    "CollectionInfo",
    "CollectionJob",
    "CollectionSearch",
    "Client",
    "ClipServiceError",
    "ComparativeInfo",
    "ConnectionFailed",
    "DenseResult",
    "EmbedResult",
    "ImageClassification",
    "ImageRef",
    "LabelScore",
    "MeasuredEffect",
    "ModelInfo",
    "ModelsInfo",
    "NotFound",
    "Overloaded",
    "PairResult",
    "PayloadTooLarge",
    "RankResult",
    "ServedModel",
    "RankedImage",
    "RetryPolicy",
    "ServerLimits",
    "Unauthorized",
    "Unavailable",
    "VersionInfo",
    "image_bytes",
    "image_id",
    "image_input",
    "image_sha256",
]
