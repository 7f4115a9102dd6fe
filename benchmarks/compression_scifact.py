"""Compressed vectors on SciFact (issue #33): quality against memory per document.

Every twotower row is a real index directory written by ``twotower.retrieval.store.IndexStore.build`` from
the same cached document vectors (``--vectors``, ``--dim``, ``--kind``; build_s = that write, without
encoding) and searched through ``IndexStore.search`` with the cached query vectors:

- fp32 / fp16 / int8 (FAISS SQfp16 / SQ8 with per-dimension ranges from the corpus), exact;
- binary: sign bits in a FAISS binary flat index, Hamming top k × 4 rescored with the float query against the
  int8 (or fp32) vectors memory-mapped from disk, and without rescoring;
- PQ: the existing ``ivfpq`` kind (48 sub-quantizers, 48 B codes), every IVF list probed so that only PQ's
  approximation is measured;
- the peer, sentence-transformers on the same vectors: ``quantize_embeddings(…, "ubinary")`` in a FAISS binary
  index, Hamming top k × 4 rescored with the float query against ``quantize_embeddings(…, "int8")`` (its
  retrieve-and-rescore recipe), ``semantic_search_faiss(corpus_precision="ubinary", rescore_multiplier=4)``
  (which rescores against the unpacked bits), and the float query against its int8 codes;
- Matryoshka: all-MiniLM-L6-v2 fine-tuned on SciFact train twice with the same settings and seed, once
  plainly and once with ``matryoshka = [384, 192, 96, 48]`` (``--mrl-weights``, default 1,1,2,2), each
  encoding the whole corpus and cut with ``--dim`` to 192 / 96 / 48 (``--sub-corpus N``: search only N
  documents, every judged test document plus random others, where encoding the corpus does not fit the time);
- ME-BERT: the default model fine-tuned with ``train --multivector m`` (``--multivector``, default 4,8), each
  document's m token vectors in one flat index: what m vectors per document cost in memory and buy;
- the peer comparison query by query (``peer_gap`` in the JSON): ours binary + int8 rescoring against
  sentence-transformers' recipe on every set of vectors here (the zero-shot model's and each fine-tuned
  single-vector model's), paired bootstrap over the test queries, and for the zero-shot vectors also over the
  809 train queries (which the zero-shot model never saw either; ``train_q_ndcg@10`` for every zero-shot and
  peer row).

Metrics: SciFact test NDCG@10 and R@100 (top-100 runs); ram_bytes_per_doc: the FAISS index file (what a
search process holds in memory) / documents; disk_bytes_per_doc: vectors.npy + faiss.index (+ calibration) /
documents (binary rows keep their rescoring vectors there, memory-mapped); p50_ms: batch-1 vector search
(top 10; query encoding excluded), median over the test queries. FAISS runs on one OpenMP thread throughout
(as a serving process between requests; on 2 shared cores, two spinning OpenMP threads made the same
batch-1 flat search vary from 0.3 to 280 ms).

    python benchmarks/compression_scifact.py [--work .cache/compression] [--epochs 2] [--mv-epochs 2] [--lr 1e-4]
        [--mrl-weights 1,1,2,2] [--multivector 4,8] [--max-length 128] [--sub-corpus 0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import DATA, RESULTS, cached_row, load_average, write_results  # noqa: E402
from _compression_plot import plot  # noqa: E402
from _compression_measure import K, gap_note, metrics_of, overlap10, p50, peer_gap, st_rows  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402

MRL_DIMS = [384, 192, 96, 48]


def store_row(work: Path, name: str, docs, doc_ids, titles, texts, qrels, qids, qv, spec, ref=None, *,
              other=None, offsets=None, multivector=None, **search) -> dict:
    """One index built and searched. ``other``: (qrels, query ids, query vectors) of a second query set
    (SciFact's train queries for the zero-shot model, which never saw them): its NDCG@10 as ``train_q_ndcg@10``.
    ``offsets`` / ``multivector``: ME-BERT documents (``docs`` holds every document's token vectors)."""
    from twotower.retrieval.store import IndexStore, NewDocs

    out = work / "indexes" / name.replace(" ", "_")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    store = IndexStore.build(out, NewDocs(doc_ids, titles, texts, docs, offsets), model={"name": "cached vectors"},
                             spec=spec, multivector=multivector, show_progress=False)
    build_s = time.perf_counter() - t0
    scores, rows = store.search(qv, K, **search)
    n = len(doc_ids)
    files = ["vectors.npy", "faiss.index", "calibration.npy", "offsets.npy"]
    disk = sum((store.dir / f).stat().st_size for f in files if (store.dir / f).is_file())
    extra = {}
    if other is not None:
        o_qrels, o_qids, o_qv = other
        o_scores, o_rows = store.search(o_qv, K, **search)
        extra["train_q_ndcg@10"] = metrics_of(o_qrels, o_qids, doc_ids, o_scores, o_rows)["ndcg@10"]
    row = {**metrics_of(qrels, qids, doc_ids, scores, rows), **extra, **overlap10(rows, ref),
           "ram_bytes_per_doc": (store.dir / "faiss.index").stat().st_size / n, "disk_bytes_per_doc": disk / n,
           "p50_ms": p50(lambda q: store.search(q, 10, **search), qv), "build_s": build_s,
           "factory": store.manifest["factory"], "dim": store.dim}
    store.close()
    shutil.rmtree(out, ignore_errors=True)
    return row


def train(work: Path, name: str, args, matryoshka, weights=None, multivector=None,
          epochs: float | None = None) -> tuple[Path, float]:
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    out = work / "train" / name
    model = out / "model"
    meta = out / "bench.json"
    settings = {"epochs": epochs or (args.epochs if multivector is None else args.mv_epochs), "lr": args.lr,
                "batch_size": args.batch_size, "matryoshka": matryoshka, "matryoshka_weights": weights,
                "multivector": multivector, "max_length": args.max_length}
    if model.is_dir() and meta.is_file() and json.loads(meta.read_text())["settings"] == settings:
        return model, json.loads(meta.read_text())["wall_s"]
    shutil.rmtree(out, ignore_errors=True)
    stage = StageConfig(data=str(DATA / "scifact"), epochs=settings["epochs"], batch_size=args.batch_size,
                        lr=args.lr, warmup=0.1, temperature=0.05)
    cfg = TrainConfig(out=str(out), precision="auto", doc_max_length=args.max_length, query_max_length=64, seed=0,
                      checkpoint_every=10_000, attention_dropout=0.0, stages=[stage], matryoshka=matryoshka,
                      matryoshka_weights=weights, multivector=multivector)
    t0 = time.perf_counter()
    Trainer(cfg).train()
    wall = time.perf_counter() - t0
    meta.write_text(json.dumps({"settings": settings, "wall_s": wall}))
    return model, wall


def sub_corpus(doc_ids: list[str], qrels, n: int) -> list[str]:
    """Every document judged for a test query, then documents drawn at random (seed 0), ``n`` in all, in corpus
    order: the fine-tuned models encode only these (on 2 shared cores the whole corpus took ~20 min a model)."""
    judged = {d for q in qrels.values() for d in q}
    others = [d for d in doc_ids if d not in judged]
    rng = np.random.default_rng(0)
    keep = judged | set(rng.choice(others, size=max(0, n - len(judged)), replace=False).tolist())
    return [d for d in doc_ids if d in keep]


def encode(model: Path, corpus, doc_ids, queries, qids, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    cache = model.parent / f"vectors-{len(doc_ids)}.npz"
    if cache.is_file():
        z = np.load(cache)
        return z["docs"], z["queries"]
    enc = DualEncoder.load(str(model), doc_max_length=max_length, query_max_length=64)
    # fp32 pinned: auto would quantize a corpus to int8 on a CPU with VNNI, and these rows compare vector formats
    docs = enc.encode_documents([corpus[d].full_text for d in doc_ids], EncodeOptions(precision="fp32"))
    qv = enc.encode_queries([queries[q] for q in qids], EncodeOptions(precision="fp32", show_progress=False))
    np.savez(cache, docs=docs, queries=qv)
    return docs, qv


def encode_multivector_docs(model: Path, corpus, doc_ids, queries, qids, max_length: int):
    """ME-BERT: every document's first m token vectors from the trained model (the m it was trained with),
    ``(vectors, offsets, query vectors)``, cached beside the model."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.retrieval.multivector import encode_multivector

    cache = model.parent / f"mv-vectors-{len(doc_ids)}.npz"
    if cache.is_file():
        z = np.load(cache)
        return z["docs"], z["offsets"], z["queries"]
    enc = DualEncoder.load(str(model), doc_max_length=max_length, query_max_length=64)
    docs, offsets = encode_multivector(enc.doc_tower, [corpus[d].full_text for d in doc_ids], enc.multivector,
                                       max_length=max_length)
    qv = enc.encode_queries([queries[q] for q in qids], EncodeOptions(show_progress=False))
    np.savez(cache, docs=docs, offsets=offsets, queries=qv)
    return docs, offsets, qv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(Path(__file__).resolve().parents[1] / ".cache" / "compression"))
    ap.add_argument("--epochs", type=float, default=2.0, help="Fine-tuning epochs of the plain and MRL models.")
    ap.add_argument("--mv-epochs", type=float, default=2.0, help="Fine-tuning epochs of the ME-BERT models.")
    ap.add_argument("--mrl-weights", default="1,1,2,2",
                    help=f"Matryoshka weights for the prefixes {MRL_DIMS} (the 96-d target and below count double).")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=128,
                    help="Document tokens when fine-tuning and encoding with the fine-tuned models (queries: 64).")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--factor", type=int, default=4, help="Rescore factor of the binary rows.")
    ap.add_argument("--skip-training", action="store_true", help="Only the zero-shot rows.")
    ap.add_argument("--mrl-also", default="",
                    help="Other Matryoshka weights to train and report beside, ';'-separated (e.g. '1,1,1,1').")
    ap.add_argument("--epochs-also", default="",
                    help="Train the plain and the Matryoshka model again for these epochs (comma-separated), beside.")
    ap.add_argument("--multivector", default="4,8", help="ME-BERT m values fine-tuned on SciFact train ('' for none).")
    ap.add_argument("--sub-corpus", type=int, default=0,
                    help="The fine-tuned models' rows search this many documents: every judged test document plus "
                    "random others (0: the whole corpus).")
    args = ap.parse_args()

    from twotower.data.beir import BeirDataset, load_corpus
    from twotower.retrieval.store import IndexSpec

    import faiss

    faiss.omp_set_num_threads(1)
    work = Path(args.work)
    ds = BeirDataset.load(DATA / "scifact", "test")
    qrels = ds.qrels
    corpus = load_corpus(DATA / "scifact" / "corpus.jsonl")
    doc_ids, docs, all_qids, all_qv = scifact_vectors()
    pos = {q: i for i, q in enumerate(all_qids)}
    qids = [q for q in all_qids if q in qrels]
    qv = np.ascontiguousarray(all_qv[[pos[q] for q in qids]])
    titles, texts = [corpus[d].title for d in doc_ids], [corpus[d].text for d in doc_ids]
    f = args.factor
    mrl_weights = [float(x) for x in args.mrl_weights.split(",")]
    rows: list[dict] = []
    train_ds = BeirDataset.load(DATA / "scifact", "train")  # the zero-shot model never saw these queries either
    train_qids = [q for q in all_qids if q in train_ds.qrels]
    other = (train_ds.qrels, train_qids, np.ascontiguousarray(all_qv[[pos[q] for q in train_qids]]))

    def add(name: str, group: str, settings: dict, compute) -> dict:
        row = cached_row(work, name, {**settings, "group": group}, compute)
        row = {"system": name, "group": group, **{k: v for k, v in row.items() if k != "system"}}
        rows.append(row)
        return row

    def ours(name, group, vecs, queries, spec, settings, ref=None, **search):
        return add(name, group, settings, lambda: store_row(work, name, vecs, doc_ids, titles, texts, qrels, qids,
                                                            queries, spec, ref, other=other, **search))

    ref = np.argsort(-(qv @ docs.T), axis=1)[:, :10]  # the exact fp32 top 10 of each test query
    pq_settings = {"model": "all-MiniLM-L6-v2", "faiss_threads": 1}
    zs = {**pq_settings, "overlap": 1, "train_queries": len(train_qids)}
    ours("fp32", "zero-shot", docs, qv, IndexSpec(), zs, ref)
    ours("fp16", "zero-shot", docs, qv, IndexSpec(vectors="fp16"), zs, ref)
    ours("int8", "zero-shot", docs, qv, IndexSpec(vectors="int8"), zs, ref)
    ours(f"binary + int8 rescoring x{f}", "zero-shot", docs, qv, IndexSpec(vectors="binary", rescore_factor=f), zs,
         ref)
    ours(f"binary + fp32 rescoring x{f}", "zero-shot", docs, qv,
         IndexSpec(vectors="binary", rescore="fp32", rescore_factor=f), zs, ref)
    ours("binary + int8 rescoring x10", "zero-shot", docs, qv, IndexSpec(vectors="binary", rescore_factor=10), zs,
         ref)
    ours("binary, no rescoring", "zero-shot", docs, qv, IndexSpec(vectors="binary", rescore="none"), zs, ref)
    nlist = int(IndexSpec(kind="ivfpq").factory(384, len(doc_ids)).split(",")[0][3:])
    for m in (48,):  # PQ96 left out: PQ48's build took 343 s here (FAISS k-means, one thread, shared cores)
        ours(f"ivfpq PQ{m} (all {nlist} lists probed)", "zero-shot", docs, qv, IndexSpec(kind="ivfpq", pq_m=m),
             pq_settings, nprobe=nlist)
    for d in (192, 96, 48):
        ours(f"fp32 cut to {d}", "zero-shot", docs, qv, IndexSpec(dim=d), zs, ref)
    peer = st_rows(docs, doc_ids, qrels, qids, qv, f, ref, other)
    gap = {"zero-shot": peer_gap(work, docs, doc_ids, titles, texts, {"test": (qrels, qids, qv), "train": other}, f)}
    for name, row in peer.items():
        add(name, "peer", {**zs, "factor": f}, lambda row=row: row)

    train_walls = {}
    sub = sub_corpus(doc_ids, qrels, args.sub_corpus) if args.sub_corpus else doc_ids
    n_sub = len(sub)
    tag = f" ({n_sub} docs)" if args.sub_corpus else ""
    if not args.skip_training:
        all_queries = ds.queries
        at = {d: i for i, d in enumerate(doc_ids)}
        sub_docs = docs[[at[d] for d in sub]]
        sub_store = {"titles": [corpus[d].title for d in sub], "texts": [corpus[d].text for d in sub]}

        def ours_sub(name, group, vecs, queries, spec, settings, **kw):
            return add(name, group, settings, lambda: store_row(work, name, vecs, sub, sub_store["titles"],
                                                                sub_store["texts"], qrels, qids, queries, spec, **kw))

        if args.sub_corpus:  # the zero-shot model on the same sub-corpus, for comparison
            sub_settings = {**zs, "sub_corpus": n_sub}
            for d in (384, 96):
                ours_sub(f"zero-shot fp32{f' cut to {d}' if d < 384 else ''}{tag}", "zero-shot sub-corpus",
                         sub_docs, qv, IndexSpec(dim=d if d < 384 else None), sub_settings)
        variants = [("plain fine-tuned", None, None, "plain", None),
                    ("matryoshka fine-tuned", MRL_DIMS, mrl_weights, "mrl", None)]
        for text in filter(None, args.mrl_also.split(";")):  # the same training with other weights, reported beside
            w = [float(x) for x in text.split(",")]
            variants.append((f"matryoshka fine-tuned, weights {text}", MRL_DIMS, w, f"mrl-w{text.replace(',', '-')}",
                             None))
        for e in filter(None, args.epochs_also.split(",")):  # both models again, trained for e epochs
            variants += [(f"plain fine-tuned, {e} epochs", None, None, f"plain-e{e}", float(e)),
                         (f"matryoshka fine-tuned, {e} epochs", MRL_DIMS, mrl_weights, f"mrl-e{e}", float(e))]
        for label, mrl, weights, run_name, epochs in variants:
            model, wall = train(work, run_name, args, mrl, weights, epochs=epochs)
            train_walls[label] = round(wall, 1)
            dv, tq = encode(model, corpus, sub, all_queries, qids, args.max_length)
            settings = {"epochs": epochs or args.epochs, "lr": args.lr, "batch_size": args.batch_size, "mrl": mrl,
                        "mrl_weights": weights, "max_length": args.max_length, "faiss_threads": 1,
                        "sub_corpus": n_sub}
            for d in (384, 192, 96, 48):
                spec = IndexSpec(dim=d if d < dv.shape[1] else None)
                name = f"{label} fp32" + (f" cut to {d}" if d < dv.shape[1] else "") + tag
                ours_sub(name, label, dv, tq, spec, settings)
            gap[label] = peer_gap(work, dv, sub, sub_store["titles"], sub_store["texts"],
                                  {"test": (qrels, qids, tq)}, f)
            if weights == mrl_weights:  # the 96-d MRL vectors in int8 and binary: both compressions at once
                for name, spec in ((f"{label} int8 cut to 96", IndexSpec(dim=96, vectors="int8")),
                                   (f"{label} binary + int8 rescoring x{f} cut to 96",
                                    IndexSpec(dim=96, vectors="binary", rescore_factor=f))):
                    ours_sub(name + tag, label, dv, tq, spec, settings)
        for m in [int(x) for x in args.multivector.split(",") if x.strip()]:
            label = f"ME-BERT m={m} fine-tuned"
            model, wall = train(work, f"mebert{m}-e{args.mv_epochs:g}", args, None, multivector=m)
            train_walls[label] = round(wall, 1)
            mv, offsets, tq = encode_multivector_docs(model, corpus, sub, all_queries, qids, args.max_length)
            settings = {"epochs": args.mv_epochs, "lr": args.lr, "batch_size": args.batch_size, "multivector": m,
                        "max_length": args.max_length, "faiss_threads": 1, "sub_corpus": n_sub}
            ours_sub(f"{label} fp32{tag}", label, mv, tq, IndexSpec(), settings, offsets=offsets, multivector=m)

    fp32 = rows[0]
    for r in rows:  # the full-corpus rows only: the sub-corpus rows compare among themselves
        if "docs)" not in r["system"]:
            r["ram_vs_fp32"] = r["ram_bytes_per_doc"] / fp32["ram_bytes_per_doc"]
        if r["group"] in ("zero-shot", "peer"):
            r["ndcg_vs_fp32"] = r["ndcg@10"] / fp32["ndcg@10"]
    for label in dict.fromkeys(r["group"] for r in rows if "fine-tuned" in r["group"] and "ME-BERT" not in r["group"]):
        full = next((r for r in rows if r["system"] == f"{label} fp32{tag}"), None)
        for r in rows:
            if full is not None and r["group"] == label:
                r["ndcg_vs_own_full"] = r["ndcg@10"] / full["ndcg@10"]
    png = RESULTS / "compression_scifact.png"
    plot(rows, png)
    notes = (
        f"SciFact test ({len(qids)} queries, {len(doc_ids)} documents), all-MiniLM-L6-v2 vectors cached by "
        "benchmarks/_vectors.py. ram_bytes_per_doc = faiss.index bytes / documents (for binary rows the rescoring "
        "vectors stay on disk, memory-mapped: disk_bytes_per_doc); the fp32 flat index is 1,536 B/doc + header. "
        f"Rescore factor {f} unless the name says otherwise (k = 100 here, so {100 * f} candidates are rescored, "
        "for ours and for the peer alike); p50_ms is batch-1 top-10 vector search, query "
        "encoding excluded; build_s is IndexStore.build from vectors (no encoding). PQ rows probe every IVF list. "
        "ndcg_vs_fp32: against the zero-shot fp32 row; ram_vs_fp32: bytes in RAM against it; fp32_top10_overlap: "
        "the share of the exact fp32 top 10 a row's top 10 keeps (how faithfully it approximates fp32 search; "
        "PQ row not re-run for it); ndcg_vs_own_full: against the same model's full 384-d vectors. "
        f"train_q_ndcg@10: the same index searched with SciFact's {len(train_qids)} train queries, which the "
        "zero-shot model never saw either (a second, larger query set for the zero-shot and peer rows; not for the "
        "fine-tuned rows, which trained on them). Why the peer's int8 rescoring scores a little differently: "
        "sentence-transformers multiplies the float query by the raw int8 codes "
        "(code = (x - min) / step - 128), which ranks like the query against documents whose dimension j is "
        "divided by its corpus range (max - min): an implicit per-dimension reweighting, not the model's cosine "
        "(fp32_top10_overlap 0.95 against ours 0.99); ours decodes the codes back to the model's values (FAISS SQ8, "
        "the same min/max calibration and rounding) and so reproduces fp32's ranking up to rounding. "
        + gap_note(gap, f) +
        f"Fine-tuning: SciFact train (all {len(train_qids)} judged train queries), lr {args.lr}, batch "
        f"{args.batch_size}, warmup 10%, temperature 0.05, max length {args.max_length} (documents, also when the "
        "fine-tuned models encode the corpus; queries 64), seed 0, attention dropout 0. Plain and matryoshka: "
        f"{args.epochs:g} epoch(s) each, identical but for the loss: matryoshka {MRL_DIMS} with weights "
        f"{mrl_weights} (the prefixes of the 96-d target and below count double, set before any run) vs the "
        "full vector only" + (f"; also reported, the same training with weights {args.mrl_also} (run after the "
                              "main pair, to see what the weights did)" if args.mrl_also else "")
        + (f"; and both again for {args.epochs_also} epochs (twotower fit's default 4, chosen on SciFact dev; run "
           "after the main pair)" if args.epochs_also else "") + ". "
        f"ME-BERT: {args.mv_epochs:g} epoch(s), twotower train --multivector m (max score "
        "over the first m token vectors), each document's m vectors in one flat index (ram_bytes_per_doc = all "
        "entries' fp32 vectors / documents). Training wall s (2 cores; the 2-epoch runs shared them with other "
        "jobs, niced): "
        f"{train_walls}. "
        + (f"The fine-tuned rows search a {n_sub}-document sub-corpus (every judged test document plus random "
           "others, seed 0) and compare only among themselves. " if args.sub_corpus else
           "Every row searches the whole corpus. ")
        + f"Load average at the end: {load_average():.1f}. Plot: {png.name}."
    )
    write_results("compression_scifact", rows, notes=notes, extra={"peer_gap": gap})


if __name__ == "__main__":
    main()
