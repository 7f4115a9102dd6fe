"""Training precision: the SciFact few-shot run in fp32 and under bf16 autocast, in one run.

Same recipe as ``finetune_scifact.py`` (default model, SciFact train judged pairs, batch 32, lr 2e-5,
temperature 0.05, max length 256); each precision trains from the same seed, then is evaluated on
SciFact test with the same (default, bf16-weight) encoding. Rows ``twotower fp32`` and
``twotower bf16-autocast`` with ``examples_per_s``, ``wall_s``, ``ndcg@10``, ``recall@100``.

    python benchmarks/train_precision.py [--epochs 1] [--attention-dropout 0] [--work .cache/train_precision]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from _common import DATA, cached_row, load_average, write_results
from finetune_scifact import evaluate_model, train_tt
from twotower.data.beir import BeirDataset
from twotower.data.pairs import pairs_from_beir
from twotower.encoders.inference import cpu_has_fast_bf16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--attention-dropout", type=float, default=None,
                    help="also train bf16 with this dropout on attention probabilities (the model's own: 0.1)")
    ap.add_argument("--work", default=None, help="working folder (default: a temp folder); finished rows are kept "
                    "in <work>/rows and skipped by a re-run with the same settings")
    args = ap.parse_args()
    data = Path(args.data)
    work = Path(args.work or tempfile.mkdtemp(prefix="train-precision-"))
    n = len(pairs_from_beir(BeirDataset.load(data, "train"))) * args.epochs
    settings = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "temperature", "max_length")}
    runs = [("twotower bf16-autocast", "bf16", None), ("twotower fp32", "fp32", None)]
    if args.attention_dropout is not None:
        runs.append((f"twotower bf16-autocast, attention dropout {args.attention_dropout:g}", "bf16",
                     args.attention_dropout))

    def row(folder: str, precision: str, attention_dropout: float | None):
        def compute() -> dict:
            shutil.rmtree(work / folder, ignore_errors=True)  # a run cut off midway starts again
            wall = train_tt(data, work / folder, args, precision=precision, attention_dropout=attention_dropout)
            return {"examples_per_s": n / wall, "wall_s": wall, **evaluate_model(str(work / folder / "model"), data)}
        return compute

    rows = [cached_row(work, name, {**settings, "precision": precision, "attention_dropout": ad},
                       row(name.replace(" ", "_").replace(",", ""), precision, ad))
            for name, precision, ad in runs]
    for r in rows:
        if r["system"] != "twotower fp32":
            r["speedup_vs_fp32"] = rows[1]["wall_s"] / r["wall_s"]
    write_results("train_precision", rows, notes=(
        f"SciFact train ({n:g} examples) → test. all-MiniLM-L6-v2, batch {args.batch_size}, {args.epochs} epoch(s), "
        f"lr {args.lr}, temperature {args.temperature}, max length {args.max_length}, seed 42 for every row. "
        f"bf16-autocast = torch.autocast('cpu', bfloat16) around forward and loss, fp32 master weights and AdamW "
        f"(this CPU {'has' if cpu_has_fast_bf16() else 'lacks'} AVX512-BF16/AMX). Evaluation of every model uses "
        f"the default (bf16-weight) encoding. 'attention dropout' rows set the dropout on attention probabilities "
        f"(twotower train --attention-dropout; the model's own is 0.1), which lets scaled_dot_product_attention "
        f"run fused. Load average at the end: {load_average():.1f}."))


if __name__ == "__main__":
    main()
