"""Training precision: the SciFact few-shot run in fp32 and under bf16 autocast, in one run.

Same recipe as ``finetune_scifact.py`` (default model, SciFact train judged pairs, batch 32, lr 2e-5,
temperature 0.05, max length 256); each precision trains from the same seed, then is evaluated on
SciFact test with the same (default, bf16-weight) encoding. Rows ``twotower fp32`` and
``twotower bf16-autocast`` with ``examples_per_s``, ``wall_s``, ``ndcg@10``, ``recall@100``.

    python benchmarks/train_precision.py [--epochs 1] [--work .cache/train_precision]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import DATA, load_average, write_results
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
    ap.add_argument("--work", default=None, help="working folder (default: a temp folder)")
    args = ap.parse_args()
    data = Path(args.data)
    work = Path(args.work or tempfile.mkdtemp(prefix="train-precision-"))
    n = len(pairs_from_beir(BeirDataset.load(data, "train"))) * args.epochs
    rows = []
    for name, precision in (("twotower bf16-autocast", "bf16"), ("twotower fp32", "fp32")):
        wall = train_tt(data, work / precision, args, precision=precision)
        rows.append({"system": name, "examples_per_s": n / wall, "wall_s": wall,
                     **evaluate_model(str(work / precision / "model"), data)})
        print(rows[-1], flush=True)
    rows[0]["speedup_vs_fp32"] = rows[1]["wall_s"] / rows[0]["wall_s"]
    write_results("train_precision", rows, notes=(
        f"SciFact train ({n:g} examples) → test. all-MiniLM-L6-v2, batch {args.batch_size}, {args.epochs} epoch(s), "
        f"lr {args.lr}, temperature {args.temperature}, max length {args.max_length}, seed 42 for both. "
        f"bf16-autocast = torch.autocast('cpu', bfloat16) around forward and loss, fp32 master weights and AdamW "
        f"(this CPU {'has' if cpu_has_fast_bf16() else 'lacks'} AVX512-BF16/AMX). Evaluation of both models uses "
        f"the default (bf16-weight) encoding. Load average at the end: {load_average():.1f}."))


if __name__ == "__main__":
    main()
