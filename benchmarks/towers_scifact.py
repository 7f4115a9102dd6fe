"""The tower-sharing study (Dong et al., Table 2) on SciFact: the five tower configurations
trained with the same budget on SciFact train from all-MiniLM-L6-v2, evaluated on test.

    python benchmarks/towers_scifact.py [--epochs 1] [--dim 384] [--work .cache/towers]

Every variant gets a projection of size --dim (identity-initialised when it equals the hidden
size, so every variant starts from the same model) so that the parameter layout is the same and
ADE-SPL has a layer to share.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import DATA, load_average, write_results
from twotower.encoders.towers import TOWER_KINDS
from twotower.evaluation.pipeline import EvalConfig, run_eval
from twotower.training.trainer import StageConfig, TrainConfig, Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--towers", nargs="+", default=list(TOWER_KINDS))
    ap.add_argument("--work", default=str(Path(__file__).resolve().parents[1] / ".cache" / "towers"))
    args = ap.parse_args()
    rows = []
    for kind in args.towers:
        out = Path(args.work) / kind
        cfg = TrainConfig(out=str(out), towers=kind, dim=args.dim, doc_max_length=args.max_length,
                          query_max_length=args.max_length, checkpoint_every=10_000, stages=[StageConfig(
                              data=args.data, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                              temperature=args.temperature)])
        t0 = time.perf_counter()
        Trainer(cfg).train()
        wall = time.perf_counter() - t0
        res = run_eval(EvalConfig(data=Path(args.data), split="test", retriever="dense", model=str(out / "model"),
                                  metrics=("ndcg@10", "mrr@10", "p@1", "recall@100"), show_progress=False))
        rows.append({"system": kind, **res.metrics, "train_s": wall})
        print(rows[-1], flush=True)
    write_results("towers_scifact", rows, notes=(
        f"all-MiniLM-L6-v2 → each tower configuration, projection {args.dim} (identity init), {args.epochs} epoch(s) "
        f"on SciFact train (919 pairs), batch {args.batch_size}, lr {args.lr}, temperature {args.temperature}, "
        f"max length {args.max_length}, bf16 autocast; evaluated on SciFact test (300 queries). Models kept in "
        f"{args.work}/<kind>/model. Load average at the end: {load_average():.1f}."))


if __name__ == "__main__":
    main()
