"""Contriever-style unsupervised in-domain pre-training and few-shot fine-tuning on SciFact, in one run.

Rows (each with NDCG@10 and Recall@100 on SciFact test, and the training wall time):

1. ``zero-shot``: the default model (all-MiniLM-L6-v2) as is;
2. ``pretrain <augment>+<negatives>``: continued unsupervised contrastive pre-training on the SciFact
   corpus alone (no queries, no labels) — crop vs ICT, in-batch vs MoCo, same steps and batch size;
3. ``few-shot from zero-shot`` and ``few-shot from <best pretrain>``: one fine-tuning pass on the
   SciFact train pairs (twotower's Trainer: batch 32, lr 2e-5, temperature 0.05, 1 epoch by
   default). The best pre-trained model is chosen by NDCG@10 on the *train* queries (``--select-on``),
   so the test split plays no part in any choice.

Each model's corpus embeddings are computed once and searched with the test and the train queries.
``--few-shot-row`` reuses finetune_scifact.py's fine-tune of the zero-shot model (same recipe) instead of
training it again.
Finished rows are kept in ``<work>/rows/`` with their settings: a re-run with the same ``--work``
skips them (a killed run loses only the row it was on).
``--eval-queries`` / ``--eval-docs`` evaluate on a subset (for a quick check of the script; the
output then says so and the result files get a ``_subset`` suffix).

    python benchmarks/contriever_scifact.py [--steps 200] [--batch-size 64] [--configs crop-inbatch,crop-moco,...]
    nice -n 15 python benchmarks/contriever_scifact.py --limit-docs 300 --steps 4 --batch-size 8 \\
        --ft-steps 2 --eval-queries 20 --eval-docs 200        # smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import DATA, cached_row, load_average, write_results
from twotower.data.augment import ViewConfig
from twotower.data.beir import BeirDataset
from twotower.encoders.towers import DualEncoder, EncodeOptions
from twotower.evaluation.metrics import evaluate
from twotower.retrieval.dense import exact_search, to_run
from twotower.training.pretrain import PretrainConfig, pretrain
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

CONFIGS = ("crop-inbatch", "crop-moco", "ict-inbatch", "ict-moco")


class Evaluator:
    """Test and train (selection) queries of SciFact against one corpus encoding per model."""

    def __init__(self, data: Path, n_queries: int | None, n_docs: int | None, precision: str) -> None:
        self.splits = {s: BeirDataset.load(data, s) for s in ("test", "train")}
        corpus = self.splits["test"].corpus
        for name, ds in self.splits.items():
            if n_queries:
                keep = list(ds.queries)[:n_queries]
                ds.queries = {q: ds.queries[q] for q in keep}
                ds.qrels = {q: ds.qrels[q] for q in keep}
        self.subset = bool(n_queries or n_docs)
        ids = list(corpus)
        if n_docs:
            judged = list(dict.fromkeys(d for ds in self.splits.values() for rels in ds.qrels.values() for d in rels))
            ids = list(dict.fromkeys(judged + ids))[: max(n_docs, len(judged))]
        self.doc_ids = ids
        self.texts = [corpus[d].full_text for d in ids]
        self.precision = precision

    def describe(self) -> str:
        sizes = ", ".join(f"{s} {len(ds.queries)} queries" for s, ds in self.splits.items())
        scope = "SUBSET" if self.subset else "full"
        return f"{scope} evaluation: {len(self.doc_ids)} documents, {sizes}"

    def __call__(self, model_dir: str | None) -> dict:
        t0 = time.perf_counter()
        if model_dir is None and not self.subset and self.precision == "auto":
            # the default model: the benchmarks' cached vectors (benchmarks/_vectors.py, same precision)
            from _vectors import scifact_vectors

            doc_ids, docs, all_qids, all_q = scifact_vectors()
            assert doc_ids == self.doc_ids, "cached vectors are for another corpus order: delete .cache/vectors"
            row = {q: i for i, q in enumerate(all_qids)}
            encode_queries = lambda texts, qids: all_q[[row[q] for q in qids]]  # noqa: E731
        else:
            model = DualEncoder.load(model_dir)
            opts = EncodeOptions(batch_size=32, precision=self.precision, show_progress=True)
            docs = model.encode_documents(self.texts, opts)
            encode_queries = lambda texts, qids: model.encode_queries(texts, opts)  # noqa: E731
        out = {}
        for split, ds in self.splits.items():
            qids = list(ds.queries)
            scores, idx = exact_search(encode_queries([ds.queries[q] for q in qids], qids), docs, 100)
            metrics = evaluate(ds.qrels, to_run(qids, self.doc_ids, scores, idx), ("ndcg@10", "recall@100"))
            prefix = "" if split == "test" else "train_"
            out.update({f"{prefix}ndcg@10": metrics["ndcg@10"], f"{prefix}recall@100": metrics["recall@100"]})
        out["eval_s"] = time.perf_counter() - t0
        return out


def run_pretrain(name: str, args, work: Path) -> tuple[str, float, float]:
    augment, negatives = name.split("-")
    views = ViewConfig(augment=augment, chunk_tokens=args.chunk_tokens, delete=args.delete, replace=args.replace)
    pre = PretrainConfig(corpus=str(Path(args.data) / "corpus.jsonl"), views=views, negatives=negatives,
                         queue_size=args.queue_size, momentum=args.momentum, limit_docs=args.limit_docs)
    stage = StageConfig(name="pretrain", steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=0.1,
                        temperature=args.temperature)
    out = work / f"pretrain-{name}"
    shutil.rmtree(out, ignore_errors=True)  # a run cut off midway starts again
    cfg = TrainConfig(out=str(out), precision=args.precision, doc_max_length=args.max_length,
                      query_max_length=args.max_length, seed=args.seed, checkpoint_every=10**9, stages=[stage])
    t0 = time.perf_counter()
    model_dir = pretrain(cfg, pre)
    wall = time.perf_counter() - t0
    log = json.loads((out / "train_log.json").read_text())
    return str(model_dir), wall, log[-1]["loss"] if log else float("nan")


def run_finetune(start: str | None, args, out: Path) -> tuple[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    stage = StageConfig(name="finetune", data=args.data, split="train",
                        epochs=None if args.ft_steps else args.ft_epochs, steps=args.ft_steps,
                        batch_size=args.ft_batch_size, lr=args.ft_lr, warmup=0.1, temperature=0.05)
    cfg = TrainConfig(out=str(out), model=start, precision=args.precision, doc_max_length=args.max_length,
                      query_max_length=args.max_length, seed=args.seed, checkpoint_every=10**9, stages=[stage])
    t0 = time.perf_counter()
    Trainer(cfg).train()
    return str(out / "model"), time.perf_counter() - t0


def reused_few_shot_row(args) -> dict:
    """finetune_scifact.py's 'twotower' row, checked to be this script's zero-shot fine-tune recipe."""
    try:
        saved = json.loads(args.few_shot_row.read_text())
        theirs, row = saved["settings"], saved["row"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"--few-shot-row {args.few_shot_row}: not a finetune_scifact.py row file ({exc}); "
                         "give <finetune --work>/rows/twotower.json, or leave the flag out to fine-tune here")
    ours = {"epochs": args.ft_epochs, "batch_size": args.ft_batch_size, "lr": args.ft_lr, "temperature": 0.05,
            "max_length": args.max_length}
    if args.ft_steps or args.eval_queries or args.eval_docs or args.precision != "auto" or args.seed != 42 or theirs != ours:
        raise SystemExit(f"--few-shot-row {args.few_shot_row}: recipe {theirs} differs from this run's {ours} "
                         "(or this run uses --ft-steps / a subset / another precision / seed); leave the flag out")
    return {**row, "system": "few-shot from zero-shot", "source": str(args.few_shot_row)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"pre-training runs, from {', '.join(CONFIGS)}")
    ap.add_argument("--steps", type=int, default=200, help="pre-training steps (same for every config)")
    ap.add_argument("--batch-size", type=int, default=64, help="pre-training batch size")
    ap.add_argument("--lr", type=float, default=2e-5, help="pre-training peak learning rate")
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--delete", type=float, default=0.1)
    ap.add_argument("--replace", type=float, default=0.0)
    ap.add_argument("--queue-size", type=int, default=8192)
    ap.add_argument("--momentum", type=float, default=0.999)
    ap.add_argument("--limit-docs", type=int, default=None, help="pre-train on the first N corpus documents only")
    ap.add_argument("--ft-epochs", type=float, default=1.0)
    ap.add_argument("--ft-steps", type=int, default=None, help="fine-tuning steps instead of epochs (smoke runs)")
    ap.add_argument("--ft-batch-size", type=int, default=32)
    ap.add_argument("--ft-lr", type=float, default=2e-5)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--select-on", choices=("train", "test"), default="train",
                    help="split whose NDCG@10 picks the pre-trained model to fine-tune")
    ap.add_argument("--eval-queries", type=int, default=None, help="evaluate on the first N queries of each split")
    ap.add_argument("--eval-docs", type=int, default=None,
                    help="evaluate on a corpus subset: the judged documents of those queries, then the first others")
    ap.add_argument("--work", default=None, help="working folder (default: a temp folder)")
    ap.add_argument("--few-shot-row", type=Path, default=None,
                    help="take 'few-shot from zero-shot' from finetune_scifact.py's 'twotower' row "
                         "(<its --work>/rows/twotower.json) when its recipe equals --ft-*/--max-length: the same "
                         "training from the same seed, so one fine-tune and one evaluation fewer")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        ap.error(f"unknown configs {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="contriever-"))
    evaluator = Evaluator(Path(args.data), args.eval_queries, args.eval_docs, args.precision)
    print(evaluator.describe(), flush=True)

    eval_scope = {"eval_queries": args.eval_queries, "eval_docs": args.eval_docs, "precision": args.precision,
                  "max_length": args.max_length}
    pre_settings = {**eval_scope, **{k: getattr(args, k) for k in (
        "steps", "batch_size", "lr", "temperature", "chunk_tokens", "delete", "replace", "queue_size", "momentum",
        "limit_docs", "seed")}}
    ft_settings = {k: getattr(args, k) for k in ("ft_epochs", "ft_steps", "ft_batch_size", "ft_lr")}
    rows = [cached_row(work, "zero-shot", eval_scope, lambda: {**evaluator(None), "wall_s": 0.0})]
    pretrained = {}
    for name in configs:
        def pretrain_row(name=name) -> dict:
            model_dir, wall, loss = run_pretrain(name, args, work)
            return {**evaluator(model_dir), "wall_s": wall, "final_loss": loss}

        rows.append(cached_row(work, f"pretrain {name.replace('-', '+')}", pre_settings, pretrain_row))
        pretrained[name] = (str(work / f"pretrain-{name}" / "model"), rows[-1]["wall_s"])

    def finetune_row(start: str | None, out: Path, before_s: float = 0.0) -> dict:
        model_dir, wall = run_finetune(start, args, out)
        return {**evaluator(model_dir), "wall_s": before_s + wall}

    if args.few_shot_row:
        rows.append(reused_few_shot_row(args))
    else:
        rows.append(cached_row(work, "few-shot from zero-shot", {**eval_scope, **ft_settings},
                               lambda: finetune_row(None, work / "ft-zero-shot")))
    best = None
    if pretrained:
        key = "train_ndcg@10" if args.select_on == "train" else "ndcg@10"
        best = max(configs, key=lambda c: next(r[key] for r in rows if r["system"] == f"pretrain {c.replace('-', '+')}"))
        rows.append(cached_row(work, f"few-shot from pretrain {best.replace('-', '+')}",
                               {**pre_settings, **ft_settings, "select_on": args.select_on},
                               lambda: finetune_row(pretrained[best][0], work / f"ft-{best}", pretrained[best][1])))

    ft = f"{args.ft_steps} steps" if args.ft_steps else f"{args.ft_epochs:g} epoch(s)"
    notes = (
        f"{evaluator.describe()}. ndcg@10 / recall@100: SciFact test; train_*: SciFact train queries (used to pick the "
        f"pre-trained model to fine-tune: {best or '-'}, by {args.select_on} NDCG@10; for few-shot rows the model "
        "was trained on those queries). Start: all-MiniLM-L6-v2. Pre-training: SciFact corpus "
        f"({args.limit_docs or 'all'} documents) cut into {args.chunk_tokens}-token chunks, {args.steps} steps × batch "
        f"{args.batch_size}, lr {args.lr}, warm-up 10%, temperature {args.temperature}, deletion {args.delete}, "
        f"replacement {args.replace}, crops 5–50% of a chunk, ICT keeps the sentence with p 0.1; MoCo queue "
        f"{args.queue_size}, momentum {args.momentum}. Few-shot: SciFact train pairs, {ft}, batch "
        f"{args.ft_batch_size}, lr {args.ft_lr}, temperature 0.05. wall_s: training time (pre-training + fine-tuning "
        f"for the last row); eval_s: encoding and search. Precision {args.precision}. Load average at the end: "
        f"{load_average():.1f}."
    )
    if args.few_shot_row:
        notes += (f" 'few-shot from zero-shot' is finetune_scifact.py's 'twotower' row ({args.few_shot_row}): the "
                  "same fine-tune recipe and seed, trained and evaluated there.")
    name = "contriever_scifact" + ("_subset" if evaluator.subset else "")
    path = write_results(name, rows, notes=notes, extra={"subset": evaluator.subset})
    print(f"\n{notes}\nwrote {path}")


if __name__ == "__main__":
    main()
