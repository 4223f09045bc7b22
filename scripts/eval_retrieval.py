"""The retrieval rows of ``clip-train evaluate`` alone, for a quick look at one version (the whole
evaluation runs every family and takes far longer), printed as the world's retrieval table.

    python scripts/eval_retrieval.py default@production --store models
    python scripts/eval_retrieval.py fashion@v3 --store tutorial/models --data tutorial/fashion/test.jsonl --split all
    python scripts/eval_retrieval.py fashion@v3 ... --rerank-k 200   # a search's k: the candidates re-ranked

Same queries, seeds and aggregation as ``clip-train evaluate`` (mean and standard error over the
seeds of each figure and of its paired gain); nothing is written.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.evaluation.methods.retrieval import retrieval_gains
from training.evaluation.userdata.data import UserEvalConfig, load_eval_set
from training.evaluation.userdata.retrieval import retrieval
from training.evaluation.world.base import EvalConfig
from training.evaluation.world.run import Evaluator
from training.report import retrieval_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="name@version or name@alias")
    parser.add_argument("--store", default="models")
    parser.add_argument("--data", type=Path, help="a dataset of your own (else the shapes world)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test", "all"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n-gallery", type=int, default=UserEvalConfig.n_gallery)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--rerank-k", type=int, default=UserEvalConfig.rerank_k,
                        help="with --data: first-stage candidates the second stage ranks (a search's k)")  # fmt: skip
    args = parser.parse_args()
    if args.rerank_k < 1:
        parser.error("--rerank-k must be at least 1")
    if args.data is None and args.rerank_k != UserEvalConfig.rerank_k:
        parser.error("--rerank-k needs --data (the shapes world's retrieval rows keep the search's default k)")
    torch.set_num_threads(args.threads)
    bundle = ModelBundle.load(ModelStore(args.store), args.ref)
    started = time.process_time()
    runs = []
    if args.data is None:
        cfg = EvalConfig(seeds=tuple(range(args.seeds)))
        evaluator = Evaluator(bundle, cfg)
        runs = [evaluator.retrieval(cfg.seed_offset + seed) for seed in cfg.seeds]
    else:
        user = UserEvalConfig(seeds=tuple(range(args.seeds)), split=args.split, n_gallery=args.n_gallery,
                              rerank_k=args.rerank_k)  # fmt: skip
        es = load_eval_set(args.data, bundle, user.split)
        runs = [retrieval(es, user, seed) for seed in user.seeds]
    metrics: dict[str, float] = {}
    for run in runs:
        run.update(retrieval_gains(run))
    for key in runs[0]:
        values = np.array([run[key] for run in runs], dtype=float)
        metrics[key] = float(values.mean())
        metrics[f"{key}.stderr"] = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    reranked = f", second stage over the top {args.rerank_k}" if args.data is not None else ""
    print(f"{bundle.ref}: {len(runs)} seeds, {time.process_time() - started:.1f} CPU s{reranked}")
    print(retrieval_table(metrics))


if __name__ == "__main__":
    main()
