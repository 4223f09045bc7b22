"""How far any image-side method can go on the 2x2 set through a frozen text encoder.

YUKINO (and plain cosine) score a caption ``c`` of an image by ``v . c`` for some vector ``v``
computed from the image (``yes - no`` prompt features for YUKINO). This probe replaces the image
by its **ground-truth scene** (each object's shape, colour, size, position and relation to the
other) and trains a ``SceneEncoder`` from that to ``v`` with a pair-wise contrastive loss, on TRAIN items;
then it scores the official TEST 2x2 items. With perfect image information, what it cannot
reach shows what the caption embeddings of swapped captions do not encode in a learnable way.

    .venv/bin/python -m training.caption_probe --store models --model default@production --encoder semclip
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clipcore.methods.losses import clip_contrastive_loss
from clipcore.methods.yukino import winoground
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.world.hard_negatives import KINDS, HardNegative, hard_negative_set
from training.world.scene import Split
from training.world.structure import SceneEncoder, scene_features


def pairs(bundle: ModelBundle, items: Sequence[HardNegative], encoder: str) -> tuple[torch.Tensor, ...]:
    x0 = torch.from_numpy(np.stack([scene_features(h.scene) for h in items]))
    x1 = torch.from_numpy(np.stack([scene_features(h.negative_scene) for h in items]))
    c0 = torch.from_numpy(bundle.encode_texts([h.positive for h in items], encoder))
    c1 = torch.from_numpy(bundle.encode_texts([h.negative for h in items], encoder))
    return x0, x1, c0, c1


def train_probe(train: tuple[torch.Tensor, ...], steps: int, seed: int = 0) -> nn.Module:
    x0, x1, c0, c1 = train
    torch.manual_seed(seed)
    net = SceneEncoder(c0.shape[1])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        # Both images and both captions of each item in the batch: the swap is always a candidate.
        idx = torch.from_numpy(rng.choice(len(x0), size=64, replace=False))
        v = F.normalize(net(torch.cat([x0[idx], x1[idx]])), dim=-1)
        loss = clip_contrastive_loss(v, torch.cat([c0[idx], c1[idx]]), 100.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return net.eval()


@torch.no_grad()
def scores_2x2(net: nn.Module, data: tuple[torch.Tensor, ...], kinds: Sequence[str]) -> dict[str, float]:
    x0, x1, c0, c1 = data
    v0, v1 = F.normalize(net(x0), dim=-1), F.normalize(net(x1), dim=-1)
    s = [(v * c).sum(1).numpy() for v, c in ((v0, c0), (v0, c1), (v1, c0), (v1, c1))]
    hits, k = winoground(*s), np.asarray(kinds)
    out = {name: float(h.mean()) for name, h in hits.items()}
    out |= {f"group.{kind}": float(hits["group"][k == kind].mean()) for kind in KINDS}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--store", default="models")
    parser.add_argument("--model", default="default@production")
    parser.add_argument("--encoder", default="semclip", help="text-encoder variant whose captions are matched")
    parser.add_argument("--train-items", type=int, default=6000)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--test-items", type=int, default=200, help="per seed, as in the evaluation")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    bundle = ModelBundle.load(ModelStore(args.store), args.model)
    train_items = hard_negative_set(Split.TRAIN, 500, args.train_items)
    net = train_probe(pairs(bundle, train_items, args.encoder), args.steps)
    rows = {"TRAIN (fit)": scores_2x2(net, pairs(bundle, train_items[:400], args.encoder),
                                      [h.kind for h in train_items[:400]])}  # fmt: skip
    for seed in (1000, 1001, 1002):  # the evaluation's TEST seeds (EvalConfig seed_offset + 0, 1, 2)
        items = hard_negative_set(Split.TEST, seed, args.test_items)
        rows[f"TEST seed {seed}"] = scores_2x2(net, pairs(bundle, items, args.encoder), [h.kind for h in items])
    print(f"{bundle.ref}, captions through {args.encoder!r}, scene encoder from ground-truth scenes "
          f"({args.steps} steps)\n")  # fmt: skip
    cols = ["text", "image", "group", *(f"group.{k}" for k in KINDS)]
    print("| items | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
