"""The torch int8 backend: what it quantises, its gate, its attention, and its AVX2 kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from clipcore.backends.base import BackendError
from clipcore.backends.parity import PARITY_THRESHOLD, PROBE_TEXTS, probe_images, require_parity
from clipcore.backends.torch_int8 import Int8SelfAttention, Int8TorchTowers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> Path:
    root = tmp_path_factory.mktemp("int8-torch-store")
    publish_model(root, "tiny", seed=8)
    return root


@pytest.fixture(scope="module")
def bundle(store: Path) -> ModelBundle:
    return ModelBundle.load(ModelStore(store), "tiny@production")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1))


def test_the_image_tower_is_quantised_the_text_towers_and_the_version_are_not(bundle: ModelBundle) -> None:
    visual_before = {name: p.clone() for name, p in bundle.model.visual.state_dict().items()}
    towers = Int8TorchTowers(bundle)
    quantised = towers.model.visual
    attention = [m for m in bundle.model.visual.modules() if isinstance(m, nn.MultiheadAttention)]
    linears = [m for m in bundle.model.visual.modules() if type(m) is nn.Linear]
    assert attention, "the tiny image tower is a transformer"
    # Two int8 linears (qkv, out) per attention block, one per other linear; no fp32 linear left outside
    # the attention modules' fallbacks.
    assert towers.quantised == 2 * len(attention) + len(linears)
    assert sum(isinstance(m, Int8SelfAttention) for m in quantised.modules()) == len(attention)
    assert not any(type(m) is nn.Linear for name, m in quantised.named_modules() if ".fp32" not in f".{name}")
    # The version's own model is shared, not changed: its tower is fp32 and its text towers are the same objects.
    assert bundle.model.visual is not quantised and towers.model.transformer is bundle.model.transformer
    originals = {id(p) for p in bundle.model.visual.parameters()}
    assert all(id(p) in originals for p in quantised.parameters())  # no fp32 weight copied
    for name, value in bundle.model.visual.state_dict().items():
        assert torch.equal(value, visual_before[name]), name

    images = probe_images(bundle.image_size)
    int8, fp32 = towers.encode_images(images), bundle.encode_images(images)
    assert not np.allclose(int8, fp32, atol=1e-5)  # really computed in int8
    assert _cosines(int8, fp32).min() >= PARITY_THRESHOLD
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    tokens = bundle.tokenize(list(PROBE_TEXTS))
    for variant in (None, *towers.variants):
        np.testing.assert_array_equal(towers.encode_tokens(tokens, variant), bundle.encode_tokens(tokens, variant))
    assert require_parity(bundle, towers, label="torch int8") >= PARITY_THRESHOLD


@pytest.mark.parametrize("batch_first", [True, False])
def test_int8_self_attention_matches_fp32_and_hands_other_uses_to_it(batch_first: bool) -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(64, 4, batch_first=batch_first).eval()
    x = torch.randn(3, 10, 64) if batch_first else torch.randn(10, 3, 64)
    int8 = Int8SelfAttention(attention)
    with torch.no_grad():
        reference = attention(x, x, x, need_weights=False)[0]
        got, weights = int8(x, x, x, need_weights=False)
        assert weights is None and got.shape == reference.shape
        assert not torch.equal(got, reference)
        cosine = nn.functional.cosine_similarity(got.flatten(0, 1), reference.flatten(0, 1), dim=-1)
        assert cosine.min() > 0.995  # one layer in int8 on random inputs: close, not exact
        # A mask, attention weights or cross-attention: the fp32 module answers, exactly.
        mask = torch.triu(torch.full((10, 10), float("-inf")), diagonal=1)
        assert torch.equal(int8(x, x, x, need_weights=False, attn_mask=mask)[0],
                           attention(x, x, x, need_weights=False, attn_mask=mask)[0])  # fmt: skip
        assert torch.equal(int8(x, x, x)[1], attention(x, x, x)[1])
        y = torch.randn_like(x)
        assert torch.equal(int8(x, y, y, need_weights=False)[0], attention(x, y, y, need_weights=False)[0])


def test_a_tower_without_linears_or_on_cuda_is_refused() -> None:
    class ConvolutionsOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.visual = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())

    version = SimpleNamespace(device="cpu", model=ConvolutionsOnly(), text_models=["base"],
                              default_text_encoder="base", ref="conv@v1")  # fmt: skip
    with pytest.raises(BackendError, match="the image tower of conv@v1 has no linear layer to run in int8"):
        Int8TorchTowers(version)  # type: ignore[arg-type]
    version.device = "cuda"
    with pytest.raises(BackendError, match="runs on the CPU"):
        Int8TorchTowers(version)  # type: ignore[arg-type]


# Run with fbgemm held to its AVX2 kernels: the tiny version's int8 towers and the gate.
_GATE_ON_AVX2 = """
import json, sys
from clipcore.backends.parity import check_parity
from clipcore.backends.torch_int8 import Int8TorchTowers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
bundle = ModelBundle.load(ModelStore(sys.argv[1]), "tiny@production")
print(json.dumps({"min_cosine": check_parity(bundle, Int8TorchTowers(bundle))}))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="fbgemm's AVX2 kernels are x86-64's")
@pytest.mark.slow
def test_the_avx2_kernels_pass_the_gate_on_any_x86_cpu(store: Path) -> None:
    """fbgemm takes its kernels from CPUID, so a machine with AVX-512 VNNI would never run the AVX2
    ones that an AVX2-only CPU gets (products summed pairwise in a saturating int16). The
    environment variable holds fbgemm to them; the 7-bit activations keep those sums in range."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    proc = subprocess.run([sys.executable, "-c", _GATE_ON_AVX2, str(store)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["min_cosine"] >= PARITY_THRESHOLD
