"""The text-tower finetunes (PC-CLIP, SemCLIP) on each family: a few real optimisation steps on
toy models, then exactly the text tower (less its token table) has moved.

CLIP keeps its text tower at the top level; CustomTextCLIP (SigLIP-shaped here) and CoCa under
``text.``; CoCa's captioning decoder, the image tower, ``logit_scale`` and SigLIP's ``logit_bias``
must stay as they were.
"""

from __future__ import annotations

import pytest
import torch
from tiny_families import family_configs

from clipcore.models.clip_model import build_model, is_trainable_text_param
from clipcore.models.preprocess import PreprocessConfig
from training.train_pcclip import PCClipConfig, train_pcclip
from training.train_semclip import SemClipConfig, train_semclip

# The finetunes render the shapes world at 64 px.
CONFIGS = family_configs(image_size=64, patch_size=16, context_length=32)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _finetune(method: str, base: torch.nn.Module) -> dict[str, torch.Tensor]:
    quiet = lambda *_: None  # noqa: E731
    if method == "pcclip":
        return train_pcclip(
            base, PCClipConfig(pairs=16, steps=3, batch_size=8, lr=1e-2), log=quiet, preprocess=PreprocessConfig()
        )  # type: ignore[arg-type]
    cfg = SemClipConfig(scenes=16, steps=3, batch_size=8, lr=1e-2)
    return train_semclip(base, cfg, log=quiet, preprocess=PreprocessConfig())  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["pcclip", "semclip"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_finetune_moves_exactly_the_text_tower(family: str, method: str) -> None:
    torch.manual_seed(0)
    base = build_model(CONFIGS[family]).eval()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    tuned = _finetune(method, base)
    params = dict(base.named_parameters())
    moved = {k for k in params if not torch.equal(tuned[k], before[k])}
    text_tower = {k for k in params if is_trainable_text_param(k)}
    assert moved, "nothing trained"
    assert moved <= text_tower, sorted(moved - text_tower)
    # Every block of the text transformer and its projection learn (not just one stray tensor).
    assert any(".resblocks.0." in k for k in moved) and any("text_projection" in k for k in moved)
    frozen = [k for k in params if k.startswith(("visual.", "logit_", "text_decoder.")) or "token_embedding" in k]
    assert frozen and not moved & set(frozen)
