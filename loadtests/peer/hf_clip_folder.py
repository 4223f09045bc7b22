"""Write a Hugging Face-format CLIP folder (random weights) with open_clip's dimensions and tokenizer.

Runs in the peer server's own environment (it needs ``transformers``, which this project does
not). The architecture is open_clip's ``ViT-B-32`` config translated to ``transformers.CLIPConfig``;
the tokenizer's ``vocab.json`` / ``merges.txt`` are converted from the BPE file that open_clip ships
(the same 49,408 entries, built the way open_clip's ``SimpleTokenizer`` builds them), so both
servers tokenise a text into the same ids. Weights are random: speed does not depend on them.

    <venv>/bin/python loadtests/peer/hf_clip_folder.py --config ViT-B-32.json --bpe bpe_simple_vocab_16e6.txt.gz \
        --out /tmp/clip-vit-b-32
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]
START, END = "<|startoftext|>", "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what open_clip's tokenizer uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def clip_vocab(bpe_path: Path) -> tuple[dict[str, int], list[str]]:
    """The vocabulary and merges of open_clip's ``SimpleTokenizer`` (49,408 entries)."""
    lines = gzip.open(bpe_path).read().decode("utf-8").split("\n")
    merges = lines[1 : 49152 - 256 - 2 + 1]
    byte_chars = list(bytes_to_unicode().values())
    vocab = byte_chars + [c + "</w>" for c in byte_chars]
    vocab += ["".join(m.split()) for m in merges] + [START, END]
    return {token: i for i, token in enumerate(vocab)}, merges


def clip_config(cfg: dict) -> dict:
    """open_clip model config -> ``transformers.CLIPConfig`` keyword arguments."""
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    width = vision["width"]
    return {
        "projection_dim": cfg["embed_dim"],
        "vision_config": {
            "hidden_size": width,
            "intermediate_size": int(width * vision.get("mlp_ratio", 4.0)),
            "num_hidden_layers": vision["layers"],
            "num_attention_heads": width // vision.get("head_width", 64),
            "image_size": vision["image_size"],
            "patch_size": vision["patch_size"],
        },
        "text_config": {
            "hidden_size": text["width"],
            "intermediate_size": int(text["width"] * text.get("mlp_ratio", 4.0)),
            "num_hidden_layers": text["layers"],
            "num_attention_heads": text["heads"],
            "max_position_embeddings": text.get("context_length", 77),
            "vocab_size": text.get("vocab_size", 49408),
            "bos_token_id": 49406,
            "eos_token_id": 49407,
            "pad_token_id": 49407,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="an open_clip model config JSON")
    parser.add_argument("--bpe", type=Path, required=True, help="open_clip's bpe_simple_vocab_16e6.txt.gz")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    cfg = json.loads(args.config.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(**clip_config(cfg))).eval().save_pretrained(args.out)
    size = cfg["vision_cfg"]["image_size"]
    CLIPImageProcessor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_mean=OPENAI_MEAN,
        image_std=OPENAI_STD,
    ).save_pretrained(args.out)
    vocab, merges = clip_vocab(args.bpe)
    (args.out / "vocab.json").write_text(json.dumps(vocab))
    (args.out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer(str(args.out / "vocab.json"), str(args.out / "merges.txt"))
    tokenizer.model_max_length = cfg["text_cfg"].get("context_length", 77)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out} ({len(vocab)} tokens)")


if __name__ == "__main__":
    main()
