"""Training on long documents: which passage of a long positive to train on (``train_passage``: ``first``, the
tokenizer's first window, against ``best``, the passage the starting model scores highest for the query), against
the zero-shot model. all-MiniLM-L6-v2, one epoch, evaluated through an index with passages (the defaults).

Two settings, both from SciFact (BEIR, CC BY 4.0; ../shared/data/scifact):

- ``joined``: training pairs from SciFact's *train* qrels on SciFact's abstracts joined ten to a document
  (``long_documents.joined_collection``: every abstract relevant to a train query plus random others up to
  ``--abstracts``, relevant ones at every position), so the positive is a ~2.5k-token document whose relevant
  abstract is first in only a tenth of the pairs. Evaluated on the joined collection of SciFact's *test* queries
  (as ``benchmarks/long_documents.py`` builds it), recall@10 / NDCG@10 by the relevant abstract's position.
- ``scifact``: SciFact train (919 judged pairs, 71% of the corpus over the 256-token window) → SciFact test, on the
  test queries' relevant abstracts plus random others up to ``--scifact-docs`` (the whole corpus: 0).

Each finished row is kept in ``<work>/rows/``; a rerun with the same ``--work`` and settings skips it.

    python benchmarks/train_long.py [--parts joined,scifact] [--abstracts 1000] [--scifact-docs 1000]
                                    [--scifact-epochs 0.35] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, cached_row, load_average, write_results  # noqa: E402
from long_documents import joined_collection, pair_metrics  # noqa: E402

SYSTEMS = ("zero-shot", "first", "best")


def train_model(work: Path, name: str, choice: str, args, *, pairs: Path | None = None, data: Path | None = None,
                documents=None, epochs: float | None = None) -> tuple[Path, float, dict]:
    """A model trained ``epochs`` (default ``args.epochs``) on ``pairs`` (or ``data``'s train split) with
    ``choice``."""
    from twotower.training.config import StageConfig, TrainConfig
    from twotower.training.trainer import Trainer

    out = work / f"run-{name}-{choice}"
    if (out / "model" / "twotower.json").is_file():
        return out / "model", 0.0, {}
    shutil.rmtree(out, ignore_errors=True)
    stage = StageConfig(name="finetune", pairs=str(pairs) if pairs else None, data=str(data) if data else None,
                        split="train", epochs=epochs or args.epochs, batch_size=args.batch_size, lr=args.lr, temperature=0.05)
    cfg = TrainConfig(out=str(out), attention_dropout=0.0, seed=args.seed, checkpoint_every=0, train_passage=choice,
                      stages=[stage])
    t0 = time.perf_counter()
    trainer = Trainer(cfg, documents=documents)
    trainer.train()
    extra = {"examples_per_s": round(trainer.history[-1]["examples_per_s"], 2)}
    for c in trainer.passage_choices:
        extra["long / moved positives"] = f"{c['long_positives']}/{c['moved_positives']}"
    return out / "model", time.perf_counter() - t0, extra


def run_joined(tt, args, work: Path) -> list[dict]:
    from twotower.data.pairs import TrainExample, save_pairs

    train = tt.load_beir(DATA / "scifact", split="train")
    docs_tr, queries_tr, pairs_tr = joined_collection(train.corpus, train.queries, train.qrels, args.abstracts)
    text_of = {d["_id"]: d["text"] for d in docs_tr}
    examples = [TrainExample(query=queries_tr[q], positive=text_of[d], qid=q, pid=d) for (q, d) in sorted(pairs_tr)]
    pairs = work / "joined-train-pairs.jsonl"
    save_pairs(examples, pairs)
    first_share = sum(p == 0 for p in pairs_tr.values()) / len(pairs_tr)
    print(f"joined train: {len(docs_tr)} documents, {len(examples)} pairs, relevant abstract first in "
          f"{first_share:.1%}", flush=True)
    test = tt.load_beir(DATA / "scifact", split="test")
    docs_te, queries_te, pairs_te = joined_collection(test.corpus, test.queries, test.qrels, args.abstracts)
    settings = {"abstracts": args.abstracts, "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size,
                "seed": args.seed}
    rows = []
    for system in SYSTEMS:
        def compute(system=system):
            model, train_s, extra = (None, 0.0, {}) if system == "zero-shot" else train_model(
                work, "joined", system, args, pairs=pairs)
            index = tt.Index.build(work / f"index-joined-{system}", docs_te, encoder=str(model) if model else None,
                                   bm25=True, show_progress=True)
            out = {"collection": f"joined: train {len(docs_tr)} docs / {len(examples)} pairs → test "
                                 f"{len(docs_te)} docs", "train_s": round(train_s, 1), **extra}
            for mode in ("dense", "hybrid"):
                m = pair_metrics(index.run(queries_te, k=10, mode=mode), pairs_te)
                out.update({f"{mode} R@10 first": round(m["first"][0], 4), f"{mode} R@10 later": round(m["later"][0], 4),
                            f"{mode} nDCG@10 first": round(m["first"][1], 4),
                            f"{mode} nDCG@10 later": round(m["later"][1], 4)})
            out["pairs first/later"] = f"{m['first'][2]}/{m['later'][2]}"
            out["load"] = round(load_average(), 1)
            shutil.rmtree(work / f"index-joined-{system}", ignore_errors=True)
            return out
        rows.append(cached_row(work, f"joined {system}", {"abstracts": args.abstracts} if system == "zero-shot"
                               else settings, compute))
    return rows


def scifact_subset(tt, n_docs: int, seed: int = 0):
    """SciFact test on its relevant abstracts plus random others up to ``n_docs`` (0: the whole corpus)."""
    test = tt.load_beir(DATA / "scifact", split="test")
    if not n_docs:
        return test, [{"_id": d.id, "title": d.title, "text": d.text} for d in test.corpus.values()]
    relevant = sorted({d for rel in test.qrels.values() for d in rel})
    others = sorted(set(test.corpus) - set(relevant))
    keep = relevant + random.Random(seed).sample(others, max(0, n_docs - len(relevant)))
    return test, [{"_id": d, "title": test.corpus[d].title, "text": test.corpus[d].text} for d in sorted(keep)]


def run_scifact(tt, args, work: Path) -> list[dict]:
    from twotower.data.pairs import pairs_from_beir
    from twotower.evaluation.metrics import evaluate

    train = tt.load_beir(DATA / "scifact", split="train")
    test, docs = scifact_subset(tt, args.scifact_docs)
    epochs = args.scifact_epochs or args.epochs
    settings = {"scifact_docs": args.scifact_docs, "epochs": epochs, "lr": args.lr,
                "batch_size": args.batch_size, "seed": args.seed}
    rows = []
    for system in SYSTEMS:
        def compute(system=system):
            model, train_s, extra = (None, 0.0, {}) if system == "zero-shot" else train_model(
                work, "scifact", system, args, data=DATA / "scifact", epochs=epochs)
            index = tt.Index.build(work / f"index-scifact-{system}", docs, encoder=str(model) if model else None,
                                   bm25=True, show_progress=True)
            out = {"collection": f"scifact: train {epochs:g} epoch of {len(pairs_from_beir(train))} pairs → test on "
                                 f"{len(docs)} docs",
                   "train_s": round(train_s, 1), **extra}
            for mode in ("dense", "hybrid"):
                m = evaluate(test.qrels, index.run({q: test.queries[q] for q in test.qrels}, k=100, mode=mode),
                             ("ndcg@10", "recall@100"))
                out.update({f"{mode} nDCG@10": round(m["ndcg@10"], 4), f"{mode} R@100": round(m["recall@100"], 4)})
            out["load"] = round(load_average(), 1)
            shutil.rmtree(work / f"index-scifact-{system}", ignore_errors=True)
            return out
        rows.append(cached_row(work, f"scifact {system}", {"scifact_docs": args.scifact_docs}
                               if system == "zero-shot" else settings, compute))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="joined,scifact")
    parser.add_argument("--abstracts", type=int, default=1000, help="abstracts joined (every relevant one + random)")
    parser.add_argument("--scifact-docs", type=int, default=1000, help="SciFact test documents indexed (0: all)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--scifact-epochs", type=float, default=None, help="epochs of the scifact part (default: --epochs)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, default=None, help="keep runs and rows here (resumable)")
    args = parser.parse_args()
    import twotower as tt

    work = args.work or Path(tempfile.mkdtemp(prefix="train-long-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    parts = args.parts.split(",")
    if "joined" in parts:
        rows += run_joined(tt, args, work)
    if "scifact" in parts:
        rows += run_scifact(tt, args, work)
    name = "train_long" if set(parts) == {"joined", "scifact"} else "train_long_" + "_".join(sorted(parts))
    write_results(name, rows, notes=(
        f"all-MiniLM-L6-v2 fine-tuned (joined: {args.epochs:g} epoch; scifact: {args.scifact_epochs or args.epochs:g} "
        f"epoch), batch {args.batch_size}, lr {args.lr:g}, warmup 10%, temperature 0.05, attention dropout 0, seed "
        f"{args.seed}, no hard negatives. `train_passage` first: the positive as given, cut by the tokenizer to its "
        "first 256-token window; best: the passage the zero-shot (starting) model scores highest for the query, "
        "split as the index splits (256 tokens, overlap 32). Evaluated through `tt.Index.build` with its defaults "
        "(passages of 256 tokens, MaxP; runtime auto, which encodes 1,000 texts or more in int8 on this CPU; BM25; "
        "hybrid λ 0.5). joined: (query, document) pairs of the test collection by the position of the relevant "
        "abstract in its document (first, or 2nd-10th). scifact: the test queries over their relevant abstracts "
        f"plus random others ({args.scifact_docs} documents). long / moved positives: training positives longer "
        "than the window, and those whose best passage is not the first. load: the 1-minute load average when the "
        "row finished (the machine is shared: train_s is noisy)."))

if __name__ == "__main__":
    main()
