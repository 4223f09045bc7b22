"""A version's load-check receipt: the installed validators passed these files once, so an alias
move need not build the model again.

The load check (``model_store.validators``: build the model from the manifest, run one image and
two texts through it) was what made ``model-store canary`` and ``promote`` take 10-24 s: importing
torch and open_clip, building the model and the smoke passes, for a version that had passed the
same check when it was published. Its outcome depends only on the version's files, its
model-defining manifest fields and the validators' code. So a version that passes keeps a receipt
naming all three (``versions/<version>/.load_check.json``, written beside the files at publish,
or by the first move that runs the check), and a move whose receipt matches skips the check. A
receipt of other files, another configuration or other validators (another release of their
package, an edited validator module) does not match: the check runs and the receipt is replaced.
``model-store verify`` always runs the check. The receipt is not a manifest file: ``verify``
does not checksum it, and a lost one only costs the next move the check.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from model_store.evaluation import binding
from model_store.manifest import Manifest, utc_now_iso

RECEIPT_FILE = ".load_check.json"


def receipt(manifest: Manifest, validators: Sequence[str]) -> bytes:
    """The receipt of ``manifest``'s version passing ``validators`` now."""
    bound = binding(manifest)
    body = {"files": bound["files"], "config": bound["config"], "validators": list(validators), "at": utc_now_iso()}
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def passed_at(raw: bytes | None, manifest: Manifest, validators: Sequence[str]) -> str | None:
    """When the receipt ``raw`` says these validators passed these files and configuration
    (None: no receipt, an unreadable one, or one of anything else)."""
    if raw is None or not validators:
        return None
    try:
        body: Any = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    bound = binding(manifest)
    same = (
        body.get("files") == bound["files"]
        and body.get("config") == bound["config"]
        and body.get("validators") == list(validators)
    )
    at = body.get("at")
    return (at if isinstance(at, str) else "an unknown time") if same else None
