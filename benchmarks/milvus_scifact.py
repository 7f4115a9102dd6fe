"""The index on Milvus (issue #32) against the local FAISS store on SciFact test: quality, agreement, latency, ingestion.

Every row is a real index directory searched through twotower's own ``Searcher.run`` (the code path of ``search``,
``eval --index`` and ``serve``), with the cached SciFact vectors of all-MiniLM-L6-v2 (``_vectors.py``; the query
side is looked up, not re-encoded, so latency is the store's search + BM25 analysis + fusion, not the encoder):

- ``faiss``: ``IndexStore.build`` (flat / hnsw M=32 efConstruction=200, efSearch 128 at search) with its bm25s BM25;
- ``milvus``: ``MilvusStore.build`` (``retrieval/milvus/store.py``) into Milvus Lite (``.db`` file, embedded): FLAT / HNSW (same M,
  efConstruction, ef 128) with metric IP, BM25 as twotower's weights in a sparse vector (``milvus/lexical.py``);
- ``milvus-builtin``: Milvus' own BM25 function (``standard`` tokenizer, lowercase, bm25s' English stopwords, the
  English stemmer filter; k1 1.5, b 0.75) on a collection of the same texts, for the choice between the two.

Rows: ``system`` = "<store> <retriever> <kind>"; ndcg@10 / recall@100 from each query's top 100 (hybrid: λ 0.5,
min-max, each side's 100 best; rrf k 60); p50_ms / p99_ms / queries_per_s: batch-1 searches (top 10) one after the
other, over every test query after 10 warm-up ones; ingest_docs_per_s: the documents written per second of the
build (vectors given; BM25 analysis, FAISS/Milvus insert, flush and index build included); top10_same: share of
queries whose top-10 ids equal the local flat index's (same retriever), max_score_diff: largest score difference
among those hits.

    python benchmarks/milvus_scifact.py [--work .cache/milvus_scifact]
    python benchmarks/milvus_scifact.py --scale 1000000 --scale-efc 64 [--scale-stores faiss milvus] [--more-ef 512 2048]
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

from _common import DATA, RESULTS, write_results  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402

K_EVAL = 100
EF = 128
NOTES = """\
Reading the table:

- Milvus FLAT reproduces the local flat index: dense top-10 ids equal for every query, scores within 1e-6; BM25 as
  twotower's weights in sparse vectors gives the same NDCG@10 and R@100, the one top-10 that differs is an order of
  tied scores; hybrid and RRF (twotower's fusion over Milvus' two lists) equal the local store's.
- milvus-builtin: Milvus' own BM25 function ranks differently (Milvus Lite's analyzers are not twotower's: no Snowball
  stemming, and its scores come back negated, so that row is scored by Milvus' rank order): lower NDCG@10 and R@100,
  and its top 10 equals twotower's for almost no query. twotower therefore keeps its own BM25 weights on Milvus.
- Latency and ingestion are Milvus *Lite*'s (3.2: a Python engine over FAISS, served over gRPC inside the benchmark's
  process, on the same 2 shared cores): a Milvus server on its own machines would answer in its own time, so these
  figures say what the embedded edition costs, not what a cluster does. FLAT search there is slower than HNSW.
- Scale (rows with ``distractors``; notes below): at 1,000,000 distractors (``--scale 1000000 --scale-efc 64``)
  Milvus Lite's HNSW finds more than the local FAISS HNSW with the same settings (NDCG@10 0.597 vs 0.439 at ef 128;
  the exact answer, ``compression_1m``'s fp32 flat row, is 0.610) because it is not one graph: Milvus Lite cuts the
  collection into segments of ~85,000 rows (one per 128 MB flushed) and builds and searches an HNSW graph per
  segment, 12 graphs each searched with ef 128, where FAISS searches one graph over 1,005,183 vectors. FAISS
  reaches 0.584 with ef 2048 at 10 ms p50; Milvus Lite answers in ~1 s per query (its Python engine searching 12
  segments on these shared cores) and took 30 minutes to ingest and index what FAISS built in 6-8 minutes. Its
  memory: 5.8 GiB peak and 4.2 GiB after the searches for 1.44 GiB of vectors (the FAISS store: 3.6 GiB peak,
  2.1 GiB; both processes first hold the 1.9 GiB of input). Milvus Lite is the embedded edition for development and tests;
  a Milvus server builds and searches segments in its own (C++) engine on its own machines, not measured here.
"""
SCALE_NOTES = """
Rows with ``distractors``: the 5,183 SciFact documents hidden among that many distractor vectors (``distractors()``:
drawn from a Gaussian with the SciFact document vectors' mean and covariance, L2-normalised as the model's vectors
are; seed 0, so every store and ``compression_1m.py`` see the same ones), searched with the SciFact test queries;
dense only. Both stores get the same HNSW settings (``hnsw_m``, ``ef_construction``; ef 128 at search) and each is
built, searched and measured in a process of its own (``--scale-store``): ``build_s`` from the first write to a
searchable, fully indexed store (Milvus Lite builds its per-segment HNSW graphs in a background thread after
``flush``; the benchmark waits for that worker, ``drain_milvus_lite``), with ``build_threads`` FAISS OpenMP threads
(searches on one); ``input_rss_mb``: the process' resident memory holding the input vectors before the build;
``peak_rss_mb``: its peak resident memory (build and search); ``serve_rss_mb``: resident after the searches;
``disk_mb``: the index folder (+ the Milvus Lite data folder). Rows with another ``ef_search`` search the same built
graph with a larger ef (``--more-ef``). With the distractors, even the exact top 10 holds fewer relevant documents
(NDCG@10 0.610 at 1M, ``compression_1m.md``, against 0.645 without): they share the corpus vectors' distribution.
Commands: ``--scale 50000`` (M 16, efConstruction 100), ``--scale 1000000 --scale-efc 64`` (both stores), then
``--scale 1000000 --scale-efc 64 --scale-stores faiss --more-ef 512 2048`` (FAISS again, with the larger ef rows;
its ef-128 row gave the same NDCG@10 as the first run, 0.4386). The cached SciFact vectors of these rows were encoded
in bf16 (``.cache/vectors/scifact-minilm/meta.json``). They were measured before the Milvus store's refactor (the
Store protocol, compact ids, lexicon deltas) and are kept as measured: a run without ``--scale`` re-measures the rows
without distractors and keeps these.
"""


def cached_searcher(store, query_vecs: dict):
    """A Searcher over ``store`` whose query vectors come from the cache (text -> vector)."""
    from twotower.retrieval.searcher import Searcher

    class Cached(Searcher):
        def encode_queries(self, queries):
            return np.stack([query_vecs[q] for q in queries])

    return Cached(store)


def build_local(root: Path, new, kind: str, bm25: bool = True, m: int = 32, ef_construction: int = 200):
    from twotower.retrieval.bm25 import BM25Params
    from twotower.retrieval.store import IndexSpec, IndexStore

    spec = IndexSpec(kind=kind, bm25=bm25, bm25_params=BM25Params(), hnsw_m=m, ef_construction=ef_construction)
    t0 = time.perf_counter()
    store = IndexStore.build(root, new, model={"name": "all-MiniLM-L6-v2"}, spec=spec, show_progress=False)
    return store, time.perf_counter() - t0


def build_milvus(root: Path, new, kind: str, uri: str, bm25: bool = True, m: int = 32, ef_construction: int = 200):
    from twotower.retrieval.bm25 import BM25Params
    from twotower.retrieval.milvus.store import MilvusStore
    from twotower.retrieval.store import IndexSpec

    spec = IndexSpec(kind=kind, bm25=bm25, bm25_params=BM25Params(), hnsw_m=m, ef_construction=ef_construction)
    t0 = time.perf_counter()
    store = MilvusStore.build(root, new, model={"name": "all-MiniLM-L6-v2"}, spec=spec, uri=uri,
                              collection=f"scifact_{kind}", show_progress=False)
    return store, time.perf_counter() - t0


def builtin_bm25(uri: str, new, queries: dict[str, str]) -> tuple[dict, float]:
    """Milvus' own BM25 function over the same texts: the run of each query's top 100, and the build seconds."""
    from bm25s.stopwords import STOPWORDS_EN
    from pymilvus import DataType, Function, FunctionType

    from twotower.retrieval.milvus.store import client_for

    client = client_for(uri, "--uri")
    name = "scifact_builtin_bm25"
    if client.has_collection(name):
        client.drop_collection(name)
    analyzer = {"tokenizer": "standard", "filter": ["lowercase", {"type": "stop", "stop_words": list(STOPWORDS_EN)},
                                                    {"type": "stemmer", "language": "english"}]}
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=1024)
    schema.add_field("text", DataType.VARCHAR, max_length=65535, enable_analyzer=True, analyzer_params=analyzer)
    schema.add_field("bm25", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_function(Function(name="bm25", function_type=FunctionType.BM25, input_field_names=["text"],
                                 output_field_names=["bm25"]))
    params = client.prepare_index_params()
    params.add_index("bm25", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25",
                     params={"bm25_k1": 1.5, "bm25_b": 0.75})
    t0 = time.perf_counter()
    client.create_collection(name, schema=schema, index_params=params, consistency_level="Strong")
    rows = [{"id": d, "text": f"{t} {x}".strip() if t else x} for d, t, x in zip(new.ids, new.titles, new.texts)]
    for i in range(0, len(rows), 256):
        client.insert(name, rows[i:i + 256])
    client.flush(name)
    client.load_collection(name)
    build_s = time.perf_counter() - t0
    qids = list(queries)
    run = {}
    for i in range(0, len(qids), 64):
        chunk = qids[i:i + 64]
        hits = client.search(name, data=[queries[q] for q in chunk], anns_field="bm25", limit=K_EVAL,
                             search_params={"metric_type": "BM25"}, output_fields=["id"])
        for q, found in zip(chunk, hits):
            # Milvus Lite returns BM25 "distances" negated (best first, most negative): scored by rank instead
            run[q] = {h["id"]: 1.0 / (1 + rank) for rank, h in enumerate(found)}
    return run, build_s


def latency(fn, texts: list[str]) -> dict:
    for t in texts[:10]:
        fn(t)
    times = []
    for t in texts:
        t0 = time.perf_counter()
        fn(t)
        times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
            "queries_per_s": 1000.0 / float(np.mean(times))}


def agreement(run: dict, reference: dict) -> dict:
    same, diff = 0, 0.0
    for q, ref in reference.items():
        top = sorted(ref.items(), key=lambda kv: -kv[1])[:10]
        got = sorted(run.get(q, {}).items(), key=lambda kv: -kv[1])[:10]
        same += [d for d, _ in top] == [d for d, _ in got]
        diff = max([diff] + [abs(run[q][d] - s) for d, s in top if d in run.get(q, {})])
    return {"top10_same": same / max(1, len(reference)), "max_score_diff": diff}


def distractors(doc_vecs: np.ndarray, n: int, seed: int = 0, chunk: int = 100_000):
    """``n`` vectors drawn from a Gaussian with the corpus vectors' mean and covariance, L2-normalised as the model's
    are (yielded in chunks)."""
    mean = doc_vecs.mean(axis=0)
    cov = np.cov(doc_vecs, rowvar=False)
    vals, vecs = np.linalg.eigh(cov)
    root = vecs * np.sqrt(np.clip(vals, 0, None))
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        x = (rng.standard_normal((min(chunk, n - start), len(mean))) @ root.T + mean).astype(np.float32)
        yield x / np.linalg.norm(x, axis=1, keepdims=True)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _status_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def drain_milvus_lite(uri: str, collection: str) -> int:
    """Wait until Milvus Lite's background worker has compacted and indexed every flushed segment (it builds the
    per-segment HNSW graphs after ``flush`` returns; searching before that scans unindexed segments exactly).
    Returns the segments still without an index afterwards (built here, synchronously)."""
    import os

    from milvus_lite import server_manager_instance

    _, db, _ = server_manager_instance._servers[os.path.abspath(uri)]
    col = db.get_collection(collection)
    col._wait_for_bg()
    return col._ensure_loaded_segments_indexed()


def scale_store_rows(args, new, query_vecs: dict, queries: dict, qrels: dict) -> list[dict]:
    """One store (``args.scale_store``) over the SciFact documents among ``args.scale`` distractors, in a process
    of its own so that its memory is its own: build, search, measure."""
    import faiss

    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.store import NewDocs

    n = args.scale
    vecs = np.concatenate([new.vectors, *distractors(new.vectors, n)])
    ids = new.ids + [f"x{i}" for i in range(n)]
    big = NewDocs(ids, new.titles + [""] * n, new.texts + ["x"] * n, vecs)
    del vecs
    input_rss = _status_mb("VmRSS")
    store_name = args.scale_store
    path = args.work / f"scale-{store_name}"
    uri = str((args.work / "scale.db").resolve())
    faiss.omp_set_num_threads(args.build_threads)
    t0 = time.perf_counter()
    if store_name == "faiss":
        store, _ = build_local(path, big, "hnsw", bm25=False, m=args.scale_m, ef_construction=args.scale_efc)
        pending = 0
    else:
        store, _ = build_milvus(path, big, "hnsw", uri, bm25=False, m=args.scale_m, ef_construction=args.scale_efc)
        pending = drain_milvus_lite(uri, store.manifest["milvus"]["collection"])
    build_s = time.perf_counter() - t0
    del big
    faiss.omp_set_num_threads(1)
    searcher = cached_searcher(store, query_vecs)
    run = searcher.run(queries, K_EVAL, mode="dense", ef_search=EF)
    m = evaluate(qrels, run, ("ndcg@10", "recall@100"))
    lat = latency(lambda t: searcher.run({"q": t}, 10, mode="dense", ef_search=EF), list(queries.values()))
    disk = folder_bytes(path) + (folder_bytes(args.work / "scale.db") if store_name == "milvus" else 0)
    serve_rss = _status_mb("VmRSS")
    rows = [{"system": f"{store_name} dense hnsw", "distractors": n, "ndcg@10": m["ndcg@10"],
             "recall@100": m["recall@100"], **lat, "ingest_docs_per_s": len(ids) / build_s, "build_s": build_s,
             "disk_mb": disk / 2**20, "peak_rss_mb": _status_mb("VmHWM"), "input_rss_mb": input_rss,
             "serve_rss_mb": serve_rss, "hnsw_m": args.scale_m, "ef_construction": args.scale_efc, "ef_search": EF,
             "build_threads": args.build_threads, **({"segments_indexed_after_drain": pending}
                                                     if store_name == "milvus" else {})}]
    for ef in args.more_ef:  # the same index searched with a larger ef: recall bought with latency
        run = searcher.run(queries, K_EVAL, mode="dense", ef_search=ef)
        m = evaluate(qrels, run, ("ndcg@10", "recall@100"))
        lat = latency(lambda t: searcher.run({"q": t}, 10, mode="dense", ef_search=ef), list(queries.values()))
        rows.append({**rows[0], "ndcg@10": m["ndcg@10"], "recall@100": m["recall@100"], **lat, "ef_search": ef,
                     "peak_rss_mb": _status_mb("VmHWM"), "serve_rss_mb": _status_mb("VmRSS")})
    return rows


def scale_rows(args) -> list[dict]:
    """The SciFact documents among ``args.scale`` distractors: local FAISS HNSW vs Milvus Lite HNSW (dense), each
    store measured in a child process (``--scale-store``) so that peak RSS is that store's alone."""
    import subprocess

    rows = []
    for store_name in args.scale_stores:
        out = args.work / f"row-{store_name}.json"
        cmd = [sys.executable, __file__, "--scale", str(args.scale), "--scale-store", store_name, "--work",
               str(args.work), "--scale-m", str(args.scale_m), "--scale-efc", str(args.scale_efc),
               "--build-threads", str(args.build_threads), "--more-ef", *map(str, args.more_ef)]
        subprocess.run(cmd, check=True)
        for row in json.loads(out.read_text()):
            print(row, flush=True)
            rows.append(row)
        shutil.rmtree(args.work / f"scale-{store_name}", ignore_errors=True)
        shutil.rmtree(args.work / "scale.db", ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path(".cache/milvus_scifact"))
    parser.add_argument("--scale", type=int, default=0, help="Only the scale part: the SciFact documents among this "
                        "many distractors (local HNSW vs Milvus HNSW), added to the results' rows.")
    parser.add_argument("--scale-m", type=int, default=16, help="HNSW M of both stores in the scale part")
    parser.add_argument("--scale-efc", type=int, default=100, help="HNSW efConstruction of both in the scale part")
    parser.add_argument("--build-threads", type=int, default=2, help="FAISS OpenMP threads while building (the "
                        "scale part; searches run on one)")
    parser.add_argument("--scale-stores", nargs="+", choices=("faiss", "milvus"), default=["faiss", "milvus"],
                        help="The stores the scale part measures (default both)")
    parser.add_argument("--more-ef", type=int, nargs="*", default=[], help="Scale part: also search each built "
                        "index with these HNSW ef values (extra rows)")
    parser.add_argument("--scale-store", choices=("faiss", "milvus"), help=argparse.SUPPRESS)
    parser.add_argument("--rewrite-notes", action="store_true", help="Only rewrite the results' markdown notes")
    args = parser.parse_args()

    import faiss

    from twotower.data.beir import load_corpus, load_qrels, load_queries
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.store import NewDocs

    faiss.omp_set_num_threads(1)
    root = DATA / "scifact"
    corpus = load_corpus(root / "corpus.jsonl")
    qrels = load_qrels(root / "qrels" / "test.tsv")
    all_queries = load_queries(root / "queries.jsonl")
    queries = {q: all_queries[q] for q in qrels if q in all_queries}
    doc_ids, doc_vecs, qids_all, q_vecs = scifact_vectors()
    by_id = dict(zip(qids_all, q_vecs))
    query_vecs = {all_queries[q]: by_id[q] for q in queries}
    new = NewDocs(doc_ids, [corpus[d].title for d in doc_ids], [corpus[d].text for d in doc_ids],
                  np.ascontiguousarray(doc_vecs, dtype=np.float32))

    if args.scale_store:  # a child of scale_rows: one store, its row to row-<store>.json
        rows = scale_store_rows(args, new, query_vecs, queries, qrels)
        (args.work / f"row-{args.scale_store}.json").write_text(json.dumps(rows, indent=1))
        return
    if args.scale or args.rewrite_notes:
        saved = json.loads((RESULTS / "milvus_scifact.json").read_text())
        rows = saved["rows"]
        commands = saved.get("commands") or [saved["command"]]
        if not args.scale:  # the results keep the command that measured them
            sys.argv = saved["command"].split()[1:]
        if args.scale:
            args.work = args.work.with_name(args.work.name + "-scale")
            if args.work.exists():
                shutil.rmtree(args.work)
            args.work.mkdir(parents=True)
            fresh = scale_rows(args)
            # a new row replaces the one of the same system, scale and ef; rows measured before the per-store
            # processes (without build_threads) go
            same = {(r["system"], r["distractors"], r["ef_search"]) for r in fresh}
            rows = [r for r in rows if "distractors" not in r or (
                "build_threads" in r and (r["system"], r["distractors"], r["ef_search"]) not in same)] + fresh
            commands.append(" ".join(["python", *sys.argv]))
        rows.sort(key=lambda r: (r.get("distractors", 0), "distractors" in r and r["system"],
                                 r.get("ef_search", 0) if "distractors" in r else 0))
        write_results("milvus_scifact", rows, notes=__doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0] + "\n\n" +
                      NOTES + SCALE_NOTES, extra={
                          "queries": len(queries), "documents": len(doc_ids), "ef_search": EF,
                          "milvus_uri": "Milvus Lite (embedded)", "commands": commands,
                          # the load average of the run that measured the rows without distractors
                          **({"load_average_1m": saved["load_average_1m"]} if "load_average_1m" in saved else {})})
        return
    from _common import load_average

    load_start = load_average()
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    uri = str((args.work / "milvus.db").resolve())
    rows, reference = [], {}
    texts = list(queries.values())
    for store_name in ("faiss", "milvus"):
        for kind in ("flat", "hnsw"):
            path = args.work / f"{store_name}-{kind}"
            store, build_s = (build_local(path, new, kind) if store_name == "faiss"
                              else build_milvus(path, new, kind, uri))
            searcher = cached_searcher(store, query_vecs)
            ef = EF if kind == "hnsw" else None
            print(f"{store_name} {kind}: built in {build_s:.1f} s", flush=True)
            for mode in ("dense", "bm25", "hybrid", "rrf"):
                extra = {"ef_search": ef} if mode != "bm25" else {}
                run = searcher.run(queries, K_EVAL, mode=mode, **extra)
                m = evaluate(qrels, run, ("ndcg@10", "recall@100"))
                row = {"system": f"{store_name} {mode} {kind}", "ndcg@10": m["ndcg@10"],
                       "recall@100": m["recall@100"]}
                if store_name == "faiss" and kind == "flat":
                    reference[mode] = run
                else:
                    row.update(agreement(run, reference[mode]))
                row.update(latency(lambda t: searcher.run({"q": t}, 10, mode=mode, **extra), texts))
                row.update(ingest_docs_per_s=len(doc_ids) / build_s, build_s=build_s)
                print(row, flush=True)
                rows.append(row)
    run, build_s = builtin_bm25(uri, new, queries)
    m = evaluate(qrels, run, ("ndcg@10", "recall@100"))
    row = {"system": "milvus-builtin bm25 -", "ndcg@10": m["ndcg@10"], "recall@100": m["recall@100"],
           "top10_same": agreement(run, reference["bm25"])["top10_same"], "ingest_docs_per_s": len(doc_ids) / build_s, "build_s": build_s}
    print(row, flush=True)
    rows.append(row)
    # the scale rows (``--scale``, measured apart, up to an hour each) and their commands are kept
    saved = json.loads((RESULTS / "milvus_scifact.json").read_text()) if (RESULTS / "milvus_scifact.json").is_file() \
        else {}
    scale = [r for r in saved.get("rows", []) if "distractors" in r]
    commands = [" ".join(["python", *sys.argv])] + [c for c in saved.get("commands", []) if "--scale" in c]
    notes = (__doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0] + "\n\n" + NOTES + (SCALE_NOTES if scale else ""))
    write_results("milvus_scifact", rows + scale, notes=notes,
                  extra={"queries": len(queries), "documents": len(doc_ids), "milvus_uri": "Milvus Lite (embedded)",
                         "ef_search": EF, "commands": commands,
                         "load_average_1m": {"start": load_start, "end": load_average()}})
    print(json.dumps(rows[:2], indent=1))


if __name__ == "__main__":
    main()
