"""SemCLIP on the shapes world trained on the fixed caption templates and on the negation grammar's
training forms, from one base model, both read on the same TEST scenes (docs/model_card.md,
"SemCLIP on the grammar's phrasings"): two-sided negation per form family and on the held-out
forms, paraphrase consistency per paraphrase family and on the held-out forms, and SemCLIP's own
triplet figures. Prints the training progress, then one JSON object (mean and standard error over
the evaluation seeds). The model card's run:

    PYTHONPATH=. python scripts/semclip_grammar_ab.py --ref default@production --steps 100 --scenes 1000 \
        --batch-size 32 --seeds 0 --n-negation 100 --n-semclip 200
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace

import numpy as np
import torch

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import load_architecture
from model_store import ModelStore
from training.evaluation.methods.negation import headline
from training.evaluation.methods.paraphrase import headline as paraphrase_headline
from training.evaluation.world.base import EvalConfig
from training.evaluation.world.run import Evaluator
from training.train_semclip import SemClipConfig, train_semclip, triplet_dataset
from training.world.scene import Split
from training.world.semantic import triplet_set


def _tower(bundle: ModelBundle, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    tower = load_architecture(bundle.manifest.architecture)
    tower.load_state_dict(state)
    tower.visual = bundle.model.visual  # the image tower is shared, as a published version's is
    return tower.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="models")
    parser.add_argument("--ref", default="default@production")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--scenes", type=int, default=12000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-negation", type=int, default=200, help="TEST scenes for two-sided negation, per seed")
    parser.add_argument("--n-semclip", type=int, default=500, help="caption triplets per seed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = ModelBundle.load(ModelStore(args.store), args.ref)
    base = bundle.text_models["base"]
    cfg = SemClipConfig(steps=args.steps, scenes=args.scenes, batch_size=args.batch_size, seed=args.train_seed)
    t0 = time.process_time()
    data = triplet_dataset(replace(cfg, grammar=False), base, bundle.preprocess_config)
    grammar = triplet_set(Split.TRAIN, cfg.seed + 300, cfg.scenes, grammar=True)  # the same scenes and images
    variants = {
        "semclip_templates": data,
        "semclip_grammar": {
            **data,
            **{k: [getattr(t, k) for t in grammar] for k in ("original", "paraphrase", "negation")},
        },
    }
    for name, texts in variants.items():
        state = train_semclip(base, replace(cfg, grammar=name == "semclip_grammar"), data=texts,
                              preprocess=bundle.preprocess_config, log=lambda _: None)  # fmt: skip
        bundle.text_models[name] = _tower(bundle, state)
    train_cpu = time.process_time() - t0
    ev = Evaluator(bundle, EvalConfig(seeds=tuple(args.seeds), n_negation=args.n_negation, n_semclip=args.n_semclip))
    ev.encoders = [e for e in ("base", "pcclip", "semclip", *variants) if e in bundle.text_models]
    runs = []
    for seed in args.seeds:
        s = ev.cfg.seed_offset + seed
        flat: dict[str, float] = {}
        for scorer, figures in ev.negation_forms(s).items():
            flat.update({f"negation_forms.{scorer}.{k}": v for k, v in headline(figures).items()})
        for enc, figures in ev.paraphrase_forms(s).items():
            flat.update({f"paraphrase_forms.{enc}.{k}": v for k, v in paraphrase_headline(figures).items()})
        for enc, figures in ev.semclip(s, Split.TEST, ev.encoders).items():
            flat.update({f"{enc}.semclip.{k}": v for k, v in figures.items()})
        runs.append(flat)
    out = {"ref": args.ref, "steps": args.steps, "scenes": args.scenes, "train_seed": args.train_seed,
           "seeds": args.seeds, "train_cpu_s": round(train_cpu, 1), "figures": {}}  # fmt: skip
    for key in runs[0]:
        values = np.array([r[key] for r in runs])
        stderr = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
        out["figures"][key] = [round(float(values.mean()), 4), round(stderr, 4)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
