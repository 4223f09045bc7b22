"""Tiny open_clip configs of each model family, for random-weights models in tests.

CLIP, a SigLIP-shaped CustomTextCLIP (sigmoid logits with a bias, last-token pooling, no causal
mask) and CoCa (attentional pooling, a multimodal decoder beside the contrastive towers).
"""

from __future__ import annotations

from typing import Any


def family_configs(image_size: int, patch_size: int, context_length: int) -> dict[str, dict[str, Any]]:
    vision = {"image_size": image_size, "layers": 1, "width": 64, "patch_size": patch_size}
    text = {"context_length": context_length, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}
    return {
        "clip": {"embed_dim": 32, "vision_cfg": vision, "text_cfg": text},
        "siglip": {
            "embed_dim": 32,
            "init_logit_bias": -10,
            "custom_text": True,
            "vision_cfg": vision,
            "text_cfg": {**text, "no_causal_mask": True, "pool_type": "last", "proj_bias": True},
        },
        "coca": {
            "embed_dim": 32,
            "custom_text": True,
            "vision_cfg": {**vision, "attentional_pool": True, "attn_pooler_heads": 2, "output_tokens": True},
            "text_cfg": {**text, "embed_cls": True, "output_tokens": True},
            "multimodal_cfg": {**text, "attn_pooler_heads": 2},
        },
    }
