"""Few-shot fine-tuning of all-MiniLM-L6-v2 on SciFact train, evaluated on SciFact test, in one run:

- ``sentence-transformers mnrl``: sentence-transformers' MultipleNegativesRankingLoss trainer;
- ``twotower``: twotower's trainer (bi-directional in-batch softmax, bf16 autocast where fast);
- ``twotower + mined negatives``: the twotower model mines its own hard negatives on train
  (ranks 3..50, judged positives excluded) and trains on with one hard negative per query.

Same model, data (judged train pairs), batch size, epochs, learning rate and max length.

    python benchmarks/finetune_scifact.py [--epochs 1] [--batch-size 32] [--lr 2e-5] [--work DIR]

Each finished row is kept in ``<work>/rows/<system>.json`` with the settings it ran under; a
re-run with ``--work`` and the same settings skips it (a row cut off midway is run again).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import DATA, cached_row, load_average, write_results
from twotower.data.beir import BeirDataset
from twotower.data.pairs import pairs_from_beir
from twotower.encoders.backbone import default_model_path
from twotower.encoders.inference import cpu_has_fast_bf16
from twotower.evaluation.pipeline import EvalConfig, run_eval
from twotower.training.pipeline import mine_pairs
from twotower.training.trainer import StageConfig, TrainConfig, Trainer


def evaluate_model(path: str | None, data: Path) -> dict:
    if path is None and data.resolve() == (DATA / "scifact").resolve():
        return zero_shot_cached(data)
    res = run_eval(EvalConfig(data=data, split="test", retriever="dense", model=path, show_progress=False))
    return {"ndcg@10": res.metrics["ndcg@10"], "recall@100": res.metrics["recall@100"]}


def zero_shot_cached(data: Path) -> dict:
    """The default model on SciFact test from the benchmarks' cached vectors (``_vectors.py``, same
    default precision as ``twotower eval``): saves one corpus encoding per run."""
    from _vectors import scifact_vectors
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import exact_search, to_run

    ds = BeirDataset.load(data, "test")
    doc_ids, docs, qids, q_vecs = scifact_vectors()
    test = [q for q in qids if q in ds.qrels]
    scores, idx = exact_search(q_vecs[[qids.index(q) for q in test]], docs, 1000)
    return evaluate(ds.qrels, to_run(test, doc_ids, scores, idx), ("ndcg@10", "recall@100"))


def train_st(data: Path, out: Path, args) -> tuple[float, int]:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    ds = BeirDataset.load(data, "train")
    pairs = pairs_from_beir(ds)
    train = Dataset.from_dict({"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]})
    model = SentenceTransformer(str(default_model_path()), device="cpu")
    model.max_seq_length = args.max_length
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(out / "st-tmp"), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_ratio=0.1, weight_decay=0.01, save_strategy="no", report_to=[],
        logging_steps=10, seed=42, dataloader_drop_last=False, use_cpu=True,
    )
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train,
                                         loss=MultipleNegativesRankingLoss(model, scale=1 / args.temperature))
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    model.save(str(out / "st-model"))
    return wall, len(pairs) * args.epochs


def train_tt(data: Path, out: Path, args, *, pairs: Path | None = None, model: str | None = None,
             epochs: float | None = None, hard: int = 0, precision: str = "auto",
             attention_dropout: float | None = None) -> float:
    stage = StageConfig(data=None if pairs else str(data), pairs=str(pairs) if pairs else None,
                        epochs=epochs or args.epochs, batch_size=args.batch_size, lr=args.lr, warmup=0.1,
                        temperature=args.temperature, hard_negatives=hard)
    cfg = TrainConfig(out=str(out), model=model, precision=precision, doc_max_length=args.max_length,
                      query_max_length=args.max_length, checkpoint_every=10_000, stages=[stage],
                      attention_dropout=attention_dropout)
    t0 = time.perf_counter()
    Trainer(cfg).train()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--mined-epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--skip-st", action="store_true")
    ap.add_argument("--work", default=None, help="working folder (default: a temp folder)")
    args = ap.parse_args()
    data = Path(args.data)
    work = Path(args.work or tempfile.mkdtemp(prefix="finetune-"))
    n_pairs = len(pairs_from_beir(BeirDataset.load(data, "train")))
    settings = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "temperature", "max_length")}
    rows = [cached_row(work, "zero-shot", {}, lambda: {**evaluate_model(None, data), "wall_s": 0.0,
                                                       "examples_per_s": 0.0})]

    def st_row() -> dict:
        wall, n = train_st(data, work, args)
        return {**evaluate_model(str(work / "st-model"), data), "wall_s": wall, "examples_per_s": n / wall}

    if not args.skip_st:
        rows.append(cached_row(work, "sentence-transformers mnrl", settings, st_row))

    def tt_row() -> dict:
        shutil.rmtree(work / "tt", ignore_errors=True)  # a run cut off midway starts again from scratch
        wall = train_tt(data, work / "tt", args)
        return {**evaluate_model(str(work / "tt" / "model"), data), "wall_s": wall,
                "examples_per_s": n_pairs * args.epochs / wall}

    rows.append(cached_row(work, "twotower", settings, tt_row))
    first_wall = rows[-1]["wall_s"]

    def mined_row() -> dict:
        shutil.rmtree(work / "tt-mined", ignore_errors=True)
        t0 = time.perf_counter()
        mined = work / "mined.jsonl"
        mine_pairs(data, "train", mined, retriever="model", model=str(work / "tt" / "model"), num_negatives=8,
                   rank_range=(3, 50))
        mine_s = time.perf_counter() - t0
        wall2 = train_tt(data, work / "tt-mined", args, pairs=mined, model=str(work / "tt" / "model"),
                         epochs=args.mined_epochs, hard=1)
        return {**evaluate_model(str(work / "tt-mined" / "model"), data), "wall_s": first_wall + mine_s + wall2,
                "examples_per_s": n_pairs * args.mined_epochs / wall2, "mine_s": mine_s}

    if args.mined_epochs > 0:
        rows.append(cached_row(work, "twotower + mined negatives", {**settings, "mined_epochs": args.mined_epochs},
                               mined_row))
    write_results("finetune_scifact", rows, notes=(
        f"SciFact train ({n_pairs} judged pairs) → test (300 queries). all-MiniLM-L6-v2, batch {args.batch_size}, "
        f"{args.epochs} epoch(s), lr {args.lr}, temperature {args.temperature} (sentence-transformers scale "
        f"{1 / args.temperature:g}), max length {args.max_length}, warmup 10%. twotower trains under bf16 autocast "
        f"where the CPU has AMX or AVX512-BF16 (this one {'has' if cpu_has_fast_bf16() else 'lacks them: fp32'}). "
        "Zero-shot row from the cached default-precision vectors (benchmarks/_vectors.py). 'twotower + mined negatives' wall_s includes the first round, mining (model "
        f"retrieval on train, negatives from ranks 3..50) and {args.mined_epochs} more epoch(s) with 1 hard "
        f"negative per query; its examples_per_s is for that second round. Load average at the end: {load_average():.1f}."))


if __name__ == "__main__":
    main()
