"""ME-BERT multi-vector documents on long documents (issue #72): SciFact's abstracts joined ten to a document.

The collection is ``long_documents.py``'s ``joined`` one (its :func:`joined_collection`, imported): every abstract
relevant to a SciFact test query plus random others up to ``--abstracts``, joined ten to a document in a seeded
random order (~2.5k tokens a document; a query's relevant document is the one holding its relevant abstract, at
any position 1-10).

Two models are trained with one recipe and budget, through the library's trainer (``run_training``, as
``twotower train --hard-negatives bm25``): all-MiniLM-L6-v2 fine-tuned on SciFact train's judged pairs for
``--epochs`` with in-batch negatives plus one BM25-mined hard negative per query (ranks 3-50), batch 32, lr 2e-5,
temperature 0.05, max length 256, attention dropout 0 (fused attention), each training text's first window (``--train-passage first``) —

- ``single``: the pooled single-vector in-batch softmax;
- ``ME-BERT``: the max score over the document's first ``--m`` token vectors (``multivector=M``).

Systems (document = ~2.5k tokens; the window is 256 tokens):

- ``single, truncation``: one vector per document, of its first window;
- ``single, MaxP``: one vector per passage (the library's passage splitting: 256-token windows overlapping by
  32), a document scored by its best passage;
- ``ME-BERT m, truncation``: the first m token vectors of the document's first window — the paper's recipe (it
  reads up to 512 tokens; a joined document's first 256 tokens hold its first abstract only);
- ``ME-BERT m, per passage``: the first m token vectors of every passage, a document scored by its best vector.

Rows with another m than the trained one reuse the m-trained model (labelled). Each system dense and hybrid
(λ 0.5 · min-max dense + 0.5 · min-max BM25 over each side's top 100, ``twotower.retrieval.hybrid.interpolate``,
as ``tt.Index`` fuses); BM25 alone is a row too.

    python benchmarks/multivector_long.py [--abstracts 3000] [--epochs 1] [--m 8] [--other-m 4,16] [--work DIR]

``--work`` keeps the trained models (a re-run skips training; a model another run on the same ``--work`` is
training is waited for, so the ME-BERT model can train in a second process while the first evaluates the single
vector: ``--only-train mebert``). ``--limit N`` is a smoke test (N test queries,
2 training steps; writes no results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from _common import DATA, RESULTS, load_average, write_results  # noqa: E402
from long_documents import GROUP, joined_collection, pair_metrics  # noqa: E402

K = 100  # each run's depth: recall@100, and each side of the hybrid
LAMBDA = 0.5  # tt.Index's default hybrid weight (retrieval.searcher.DEFAULT_LAMBDA)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return pid != os.getpid()


def train(name: str, multivector: int | None, args, work: Path) -> tuple[Path, float]:
    """The model ``name`` trained with the shared recipe (kept in ``work``); (model dir, training seconds)."""
    from twotower.training.config import StageConfig, TrainConfig
    from twotower.training.pipeline import TrainRequest, run_training

    out = work / name
    done, running = out / "train.json", out / "running.pid"
    while running.is_file() and not done.is_file() and _alive(int(running.read_text())):
        time.sleep(30)  # another process (a second run on the same --work) is training it: wait for it
    if (out / "model" / "twotower.json").is_file() and done.is_file():
        print(f"{name}: trained in an earlier run ({out})", flush=True)
        return out / "model", json.loads(done.read_text())["train_s"]
    out.mkdir(parents=True, exist_ok=True)
    running.write_text(str(os.getpid()))
    stage = StageConfig(name="finetune", data=None, split="train", epochs=args.epochs,
                        steps=2 if args.limit else args.steps, batch_size=args.batch_size, lr=args.lr, warmup=0.1,
                        temperature=args.temperature)
    cfg = TrainConfig(out=str(out), multivector=multivector, doc_max_length=args.max_length,
                      query_max_length=args.max_length, checkpoint_every=10_000, train_passage=args.train_passage,
                      attention_dropout=0.0,
                      stages=[stage])
    t0 = time.perf_counter()
    model_dir = run_training(TrainRequest(config=cfg, hard_negatives="bm25", num_negatives=1,
                                          data=Path(args.data), split="train"))
    train_s = time.perf_counter() - t0
    done.write_text(json.dumps({"train_s": train_s}))
    return model_dir, train_s


def per_passage_tokens(tok_vecs: np.ndarray, tok_off: np.ndarray, passage_off: np.ndarray,
                       m: int) -> tuple[np.ndarray, np.ndarray]:
    """Each passage's first ``m`` token vectors (of those kept in ``tok_vecs``: passage p owns
    ``tok_off[p]:tok_off[p+1]``), grouped by document (document i owns passages ``passage_off[i]:passage_off[i+1]``):
    ``(vectors, offsets)`` with document i owning ``vectors[offsets[i]:offsets[i+1]]``."""
    counts = np.minimum(np.diff(tok_off), m)
    keep = np.concatenate([np.arange(tok_off[p], tok_off[p] + counts[p]) for p in range(len(counts))])
    cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return tok_vecs[keep], cum[passage_off]


def dense_run(qids, q_vecs, doc_ids, vectors, offsets) -> tuple[dict, float]:
    """The exact top-K run (every vector scored, a document by its best: ``exact_multivector_search``) and the
    batch-1 p50 latency of that search in ms (query encoding excluded)."""
    from twotower.retrieval.multivector import exact_multivector_search

    scores, idx = exact_multivector_search(q_vecs, vectors, offsets, K)
    run = {q: {doc_ids[j]: float(s) for s, j in zip(scores[i], idx[i]) if np.isfinite(s)} for i, q in enumerate(qids)}
    times = []
    for i in range(min(len(qids), 100)):
        t0 = time.perf_counter()
        exact_multivector_search(q_vecs[i : i + 1], vectors, offsets, K)
        times.append((time.perf_counter() - t0) * 1000)
    return run, statistics.median(times)


def main() -> None:
    from twotower.data.beir import BeirDataset
    from twotower.encoders.passages import PassageSpec, split_documents
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.bm25 import BM25
    from twotower.retrieval.hybrid import interpolate
    from twotower.retrieval.multivector import encode_multivector

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--abstracts", type=int, default=3000, help="abstracts joined (every relevant one + random)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=None, help="training steps instead of --epochs")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--train-passage", default="first", choices=("first", "best"),
                    help="which window of a long training text both models train on (best: scored by the starting "
                         "model first, minutes more on 2 cores)")
    ap.add_argument("--m", type=int, default=8, help="ME-BERT's trained m")
    ap.add_argument("--other-m", default="4,16", help="more m evaluated with the m-trained model ('' for none)")
    ap.add_argument("--work", default=None, help="keeps the trained models (default: a temp folder)")
    ap.add_argument("--limit", type=int, default=None, help="smoke test on N test queries (writes no results)")
    ap.add_argument("--name", default="multivector_long")
    ap.add_argument("--only-train", choices=("single", "mebert"), default=None,
                    help="train that model into --work and stop")
    args = ap.parse_args()
    if args.only_train:
        work = Path(args.work or ap.error("--only-train needs --work"))
        train("single" if args.only_train == "single" else f"mebert{args.m}",
              None if args.only_train == "single" else args.m, args, work)
        return

    data = BeirDataset.load(Path(args.data), "test")
    qrels = data.qrels
    if args.limit:
        qrels = {q: qrels[q] for q in list(qrels)[: args.limit]}
        args.abstracts = min(args.abstracts, 200)
    docs, queries, pairs = joined_collection(data.corpus, data.queries, qrels, args.abstracts)
    doc_ids = [d["_id"] for d in docs]
    texts = [d["text"] for d in docs]
    qids = list(queries)
    q_texts = [queries[q] for q in qids]
    judged: dict[str, dict[str, int]] = {}
    for q, d in pairs:
        judged.setdefault(q, {})[d] = 1
    print(f"{len(docs)} documents of {GROUP} abstracts, {len(qids)} queries, {len(pairs)} (query, document) pairs",
          flush=True)

    work = Path(args.work or tempfile.mkdtemp(prefix="multivector-long-"))
    work.mkdir(parents=True, exist_ok=True)
    single_dir, single_s = train("single", None, args, work)

    t0 = time.perf_counter()
    bm25 = BM25().index(doc_ids, texts, show_progress=False)
    bm25_build_s = time.perf_counter() - t0
    bm25_run = bm25.search_run(qids, q_texts, K, show_progress=False)
    bm25_times = []
    for t in q_texts[:100]:
        t0 = time.perf_counter()
        bm25.search([t], K, show_progress=False)
        bm25_times.append((time.perf_counter() - t0) * 1000)
    bm25_p50 = statistics.median(bm25_times)
    with tempfile.TemporaryDirectory() as tmp:
        bm25.save(tmp)
        bm25_bytes = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()) / len(docs)

    rows: list[dict] = []

    def add(system: str, setting: str, trained: str, run: dict, vectors: int, vec_bytes: float, p50: float,
            train_s: float | None) -> None:
        m = evaluate(judged, run, ("ndcg@10", "recall@100"))
        by_pos = pair_metrics(run, pairs)
        rows.append({
            "system": system, "setting": setting, "model": trained,
            "ndcg@10": round(m["ndcg@10"], 4), "recall@100": round(m["recall@100"], 4),
            "ndcg@10 first": round(by_pos["first"][1], 4), "ndcg@10 later": round(by_pos["later"][1], 4),
            "vectors/doc": round(vectors / len(docs), 1), "bytes/doc": round(vec_bytes),
            "p50_ms": round(p50, 2), "train_s": round(train_s, 1) if train_s is not None else None,
        })
        print(rows[-1], flush=True)

    def dense_and_hybrid(system: str, setting: str, trained: str, q_vecs, vectors, offsets, train_s) -> None:
        run, p50 = dense_run(qids, q_vecs, doc_ids, vectors, offsets)
        vec_bytes = vectors.nbytes / len(docs)
        add(system, setting, trained, run, len(vectors), vec_bytes, p50, train_s)
        fused = interpolate(run, bm25_run, LAMBDA, n_best=K, top_k=K)
        add(system + " + BM25", setting, trained, fused, len(vectors), vec_bytes + bm25_bytes, p50 + bm25_p50, train_s)

    add("BM25", "whole document", "-", bm25_run, 0, bm25_bytes, bm25_p50, None)

    opts = EncodeOptions(show_progress=not args.limit, runtime="torch")
    popts = EncodeOptions(show_progress=not args.limit, runtime="torch", unit="passage")
    single = DualEncoder.load(single_dir)
    spec = PassageSpec().resolved(int(single.doc_max_length))
    split = split_documents(single.doc_tower.tokenizer, [""] * len(docs), texts, spec, ids=doc_ids)
    print(f"{split.num_passages} passages ({split.num_passages / len(docs):.1f} a document)", flush=True)
    one = np.arange(len(docs) + 1, dtype=np.int64)

    q_single = single.encode_queries(q_texts, EncodeOptions(show_progress=False, runtime="torch"))
    trunc = single.encode_documents(texts, opts)
    dense_and_hybrid("single vector", "truncation", "single", q_single, trunc, one, single_s)
    passages = single.encode_documents(split.texts, popts)
    dense_and_hybrid("single vector", "MaxP (passages)", "single", q_single, passages, split.offsets, single_s)
    del single, passages

    mebert_dir, mebert_s = train(f"mebert{args.m}", args.m, args, work)
    mebert = DualEncoder.load(mebert_dir)
    ms = sorted({args.m, *(int(x) for x in args.other_m.split(",") if x)})
    m_max = max(ms)
    q_mebert = mebert.encode_queries(q_texts, EncodeOptions(show_progress=False, runtime="torch"))
    tv, toff = encode_multivector(mebert.doc_tower, texts, m_max, max_length=mebert.doc_max_length,
                                  show_progress=not args.limit)
    pv, poff = encode_multivector(mebert.doc_tower, split.texts, m_max, max_length=mebert.doc_max_length,
                                  show_progress=not args.limit)
    for m in ms:
        label = f"mebert{args.m}" if m == args.m else f"mebert{args.m} (evaluated at m={m})"
        v, off = per_passage_tokens(tv, toff, one, m)
        dense_and_hybrid(f"ME-BERT m={m}", "truncation", label, q_mebert, v, off, mebert_s)
        v, off = per_passage_tokens(pv, poff, split.offsets, m)
        dense_and_hybrid(f"ME-BERT m={m}", "per passage", label, q_mebert, v, off, mebert_s)

    if args.limit:
        print(f"smoke test on {len(qids)} queries / {len(docs)} documents: no result file written")
        return
    notes = (
        f"SciFact test queries ({len(qids)}) on SciFact's abstracts joined {GROUP} to a document "
        f"({args.abstracts} abstracts: every one relevant to a test query plus random others → {len(docs)} documents "
        f"of ~2.5k tokens, {split.num_passages / len(docs):.1f} passages each; long_documents.py's joined_collection). "
        "A query's relevant document holds its relevant abstract; ndcg@10 first / later: the (query, document) pairs "
        "whose relevant abstract is first in its document, or 2nd-10th (long_documents.py's pair_metrics). "
        f"Both models: all-MiniLM-L6-v2 fine-tuned on SciFact train (judged pairs) for "
        f"{f'{args.steps} steps' if args.steps else f'{args.epochs:g} epoch(s)'} with in-batch negatives + 1 BM25-mined hard negative per query (ranks 3-50), batch {args.batch_size}, lr "
        f"{args.lr}, temperature {args.temperature}, max length {args.max_length}, train_passage "
        f"{args.train_passage}, attention dropout 0 (run_training, as `twotower train "
        "--hard-negatives bm25`); 'single' with the pooled in-batch softmax, "
        f"'mebert{args.m}' with the max over the first {args.m} token vectors (`--multivector {args.m}`); "
        f"train_s: its wall time. Rows 'evaluated at m=M' reuse the m={args.m}-trained model. truncation: the "
        "document's first 256-token window; MaxP / per passage: the library's passages (256 tokens, 32 overlapping), "
        "a document scored by its best vector. Dense search exact (exact_multivector_search: every vector scored, "
        "max per document). + BM25: λ 0.5 min-max fusion of each side's top 100 (retrieval.hybrid.interpolate, as "
        "tt.Index's hybrid). bytes/doc: float32 vectors (+ the saved BM25 index for hybrid and BM25 rows) / "
        "documents. p50_ms: batch-1 search of the top 100, query encoding excluded (hybrid: dense + BM25 search "
        f"p50s). Load average at the end: {load_average():.1f} (cores shared: times are noisy)."
    )
    write_results(args.name, rows, notes=notes)
    plot(rows, RESULTS / f"{args.name}.png")


def plot(rows: list[dict], path: Path) -> None:
    """NDCG@10 against bytes per document (log), dense filled, hybrid hollow, one colour per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.2))
    colours = {}
    palette = plt.get_cmap("tab10").colors
    for r in rows:
        base = r["system"].replace(" + BM25", "")
        key = (base, r["setting"])
        if key not in colours:
            colours[key] = palette[len(colours) % len(palette)]
        hybrid = r["system"].endswith("+ BM25")
        trained_m = "evaluated at" not in r["model"]
        marker = "s" if r["system"] == "BM25" else ("o" if trained_m else "^")
        ax.scatter(r["bytes/doc"], r["ndcg@10"], s=60, marker=marker, color=colours[key] if not hybrid else "white",
                   edgecolors=colours[key], linewidths=1.8, zorder=3,
                   label=f"{base}, {r['setting']}" if not hybrid else None)
    ax.set_xscale("log")
    ax.set_xlabel("bytes per document (float32 vectors; + BM25 index for hybrid, hollow)")
    ax.set_ylabel("NDCG@10")
    ax.set_title("SciFact abstracts joined 10 to a document: quality against index size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="filled: dense, hollow: + BM25\n▲: ME-BERT evaluated at another m\nthan it was trained at", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    main()
