"""Multilingual retrieval on XQuAD-R (issue #23): BM25 with each language's analyzer, multilingual-e5-small
(dense, exact search) and their hybrid (λ·dense + (1−λ)·BM25, λ 0.5 as ``twotower eval --retriever hybrid``) on
the 11 monolingual sets, LAReQA's ``pool`` (mAP) and the cross-lingual ``to-en`` set, with all-MiniLM-L6-v2
(English-only) as the reference; ``pool`` and ``to-en`` also per query language.

    python benchmarks/multilingual.py               # everything (vectors cached in .cache/vectors/xquad-r/)
    python benchmarks/multilingual.py --limit 20    # smoke: 20 questions per language -> results/multilingual_smoke.*

Every text is encoded once per model: ``pool`` holds all 13,014 sentences and 13,090 questions of the 11 languages
(ids ``<lang>-…``), and the monolingual sets and ``to-en`` are slices of it. The script checks that (same ids, same
texts) before slicing, and stops if a set differs.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, load_average, write_results  # noqa: E402

LANGS = ("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh")
E5, MINILM = "multilingual-e5-small", "all-MiniLM-L6-v2"
METRICS = ("ndcg@10", "recall@100", "map@1000")
DEPTH = 1000  # every run's depth; hybrid fuses both sides' top 1000, as eval does (fusion_depth(1000, 100))
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "vectors" / "xquad-r"
LAREQA_BEST = 0.66  # LAReQA's best mBERT baseline on XQuAD-R (trained on translated pairs), mAP


# ---------------------------------------------------------------- data: the pool, and every set as a slice of it


def _load(limit: int):
    """``(doc_ids, doc_texts, qids, q_texts, qrels)``: the pool's texts (the first ``limit`` questions per
    language, and the sentences they need plus the first ``limit`` per language, when ``limit``) and the
    qrels of every set, keyed by pool ids."""
    from twotower.data.beir import load_corpus, load_qrels, load_queries
    from twotower.errors import TwoTowerError

    root = DATA / "xquad-r"
    if not (root / "pool" / "corpus.jsonl").is_file():
        raise TwoTowerError(f"{root / 'pool'}: XQuAD-R not found (set TWOTOWER_DATA to the folder holding xquad-r/)")
    corpus, queries = load_corpus(root / "pool" / "corpus.jsonl"), load_queries(root / "pool" / "queries.jsonl")
    qrels = {"pool": load_qrels(root / "pool" / "qrels" / "test.tsv"),
             "to-en": load_qrels(root / "to-en" / "qrels" / "test.tsv")}
    for lang in LANGS:  # the monolingual set: the pool's `lang-` sentences and questions (query ids without prefix)
        c, q = load_corpus(root / lang / "corpus.jsonl"), load_queries(root / lang / "queries.jsonl")
        pool_docs = [d for d in corpus if d.startswith(f"{lang}-")]
        if sorted(c) != sorted(pool_docs) or any(corpus[d].full_text != c[d].full_text for d in c):
            raise TwoTowerError(f"{root / lang / 'corpus.jsonl'}: not the pool's '{lang}-' sentences; cannot slice")
        if any(queries.get(f"{lang}-{k}") != v for k, v in q.items()) or len(q) != sum(
                x.startswith(f"{lang}-") for x in queries):
            raise TwoTowerError(f"{root / lang / 'queries.jsonl'}: not the pool's '{lang}-' questions; cannot slice")
        qrels[lang] = {f"{lang}-{k}": v for k, v in load_qrels(root / lang / "qrels" / "test.tsv").items()}
    to_en_c, to_en_q = load_corpus(root / "to-en" / "corpus.jsonl"), load_queries(root / "to-en" / "queries.jsonl")
    if sorted(to_en_c) != sorted(d for d in corpus if d.startswith("en-")) or to_en_q != queries or any(
            corpus[d].full_text != to_en_c[d].full_text for d in to_en_c):
        raise TwoTowerError(f"{root / 'to-en'}: not the pool's questions against its English sentences; cannot slice")

    qids = list(queries)
    if limit:
        qids = [q for lang in LANGS for q in [x for x in qids if x.startswith(f"{lang}-")][:limit]]
        need = {d for q in qids for s in ("pool", "to-en", q.split("-")[0]) for d in qrels[s].get(q, {})}
        keep = {d for lang in LANGS for d in [x for x in corpus if x.startswith(f"{lang}-")][:limit]} | need
        doc_ids = [d for d in corpus if d in keep]
        kept = set(qids)
        qrels = {s: {q: r for q, r in rel.items() if q in kept} for s, rel in qrels.items()}
    else:
        doc_ids = list(corpus)
    return doc_ids, [corpus[d].full_text for d in doc_ids], qids, [queries[q] for q in qids], qrels


# ---------------------------------------------------------------- vectors, encoded once per model and cached


def _save_npy(path: Path, arr: np.ndarray) -> None:
    from twotower.io import atomic_write_bytes

    buf = io.BytesIO()
    np.save(buf, arr)
    atomic_write_bytes(path, buf.getvalue())


def vectors(model_name: str, doc_ids, doc_texts, qids, q_texts, precision: str, batch_size: int | None):
    """``(doc_vecs, query_vecs, meta)`` of ``model_name``, from ``.cache/vectors/xquad-r/`` when the ids,
    precision and twotower version match; else encoded (documents behind the model's document prefix, queries
    behind its query prefix) and cached. ``meta`` holds the encoding seconds."""
    import torch

    import twotower
    from twotower.encoders.inference import resolve_precision
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.io import atomic_write_json

    resolved = resolve_precision(precision, torch.device("cpu"))
    key = {"model": model_name, "precision": resolved, "twotower": twotower.__version__,
           "doc_ids": doc_ids, "query_ids": qids}
    full = len(doc_ids) == 13014 and len(qids) == 13090
    folder = CACHE / (f"{model_name}-{resolved}" if full else f"{model_name}-{resolved}-{len(doc_ids)}d-{len(qids)}q")
    if (folder / "meta.json").is_file():
        meta = json.loads((folder / "meta.json").read_text())
        if all(meta.get(k) == v for k, v in key.items()) and (folder / "docs.npy").is_file():
            print(f"{model_name}: vectors from {folder} (encoded in {meta['doc_s'] + meta['query_s']:.0f} s)", flush=True)
            return np.load(folder / "docs.npy"), np.load(folder / "queries.npy"), meta
    t0 = time.perf_counter()
    model = DualEncoder.load(model_name if model_name != MINILM else None)
    load_s = time.perf_counter() - t0
    opts = EncodeOptions(precision=precision, batch_size=batch_size, show_progress=True)
    print(f"{model_name}: encoding {len(doc_texts)} sentences and {len(q_texts)} questions ({resolved}), "
          f"prompts {model.prompts}", flush=True)
    load0 = load_average()
    t0 = time.perf_counter()
    docs = model.encode_documents(doc_texts, opts)
    doc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    qv = model.encode_queries(q_texts, opts)
    query_s = time.perf_counter() - t0
    meta = {**key, "load_s": load_s, "doc_s": doc_s, "query_s": query_s, "prompts": model.prompts,
            "load_average": [load0, load_average()]}
    folder.mkdir(parents=True, exist_ok=True)
    _save_npy(folder / "docs.npy", docs)
    _save_npy(folder / "queries.npy", qv)
    atomic_write_json(folder / "meta.json", meta)
    print(f"{model_name}: {len(doc_texts) / doc_s:.1f} sentences/s, {len(q_texts) / query_s:.1f} questions/s", flush=True)
    return docs, qv, meta


# ---------------------------------------------------------------- metrics


def full_ranking_ap(q_vecs: np.ndarray, d_vecs: np.ndarray, rel_idx: list[list[int]], chunk: int = 128) -> np.ndarray:
    """Average precision of each query over the *full* ranking of ``d_vecs`` by inner product (rank of a
    relevant document = 1 + the documents scoring strictly higher), without a cutoff: a check on pytrec_eval's
    ``map_cut.1000`` and LAReQA's definition (all candidates ranked)."""
    out = np.zeros(len(q_vecs))
    for s in range(0, len(q_vecs), chunk):
        scores = q_vecs[s : s + chunk] @ d_vecs.T
        for i, rel in enumerate(rel_idx[s : s + chunk]):
            if not rel:
                continue
            row = scores[i]
            ranks = np.sort(np.array([1 + int((row > row[j]).sum()) for j in rel]))
            out[s + i] = float(np.mean(np.arange(1, len(ranks) + 1) / ranks))
    return out


def _per_query(qrels, run) -> dict[str, dict[str, float]]:
    from twotower.evaluation.metrics import per_query

    return per_query(qrels, run, METRICS)


def _mean(values: dict[str, dict[str, float]], qids) -> dict[str, float]:
    return {m: float(np.mean([values[m][q] for q in qids])) for m in METRICS}


# ---------------------------------------------------------------- the benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="smoke: the first N questions per language (0 = all)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lam", type=float, default=None, help="hybrid λ (default: eval's DEFAULT_LAMBDA, 0.5)")
    ap.add_argument("--minilm-sets", default="en,to-en",
                    help="sets all-MiniLM-L6-v2 runs on, comma-separated, or 'all' (its sentences of the other sets "
                         "are encoded only then)")
    args = ap.parse_args()

    from twotower.errors import TwoTowerError
    from twotower.retrieval.bm25 import BM25, BM25Params
    from twotower.retrieval.dense import exact_search, to_run
    from twotower.retrieval.hybrid import interpolate
    from twotower.retrieval.searcher import DEFAULT_LAMBDA

    lam = DEFAULT_LAMBDA if args.lam is None else args.lam
    t_start = time.perf_counter()
    try:
        doc_ids, doc_texts, qids, q_texts, qrels = _load(args.limit)
    except TwoTowerError as exc:
        sys.exit(f"error: {exc}")
    print(f"pool: {len(doc_ids)} sentences, {len(qids)} questions (sets verified as slices of it)", flush=True)

    sets = {lang: ([d for d in doc_ids if d.startswith(f"{lang}-")], "lang", lang) for lang in LANGS}
    sets["pool"] = (doc_ids, "multi", None)
    sets["to-en"] = ([d for d in doc_ids if d.startswith("en-")], "multi", None)
    minilm_sets = list(sets) if args.minilm_sets == "all" else args.minilm_sets.split(",")
    if unknown := [x for x in minilm_sets if x not in sets]:
        sys.exit(f"error: --minilm-sets: unknown set(s) {', '.join(unknown)}; use {', '.join(sets)} or 'all'")
    model_sets = {E5: list(sets), MINILM: minilm_sets}

    vecs, enc = {}, {}
    d_pos = {d: i for i, d in enumerate(doc_ids)}
    q_pos = {q: i for i, q in enumerate(qids)}
    for name in (E5, MINILM):  # each model encodes the sentences of its sets (all of them for e5) and every question
        needed = {d for s in model_sets[name] for d in sets[s][0]}
        sub = [d for d in doc_ids if d in needed]
        d, q, meta = vectors(name, sub, [doc_texts[d_pos[x]] for x in sub], qids, q_texts, args.precision,
                             args.batch_size)
        full = np.zeros((len(doc_ids), d.shape[1]), dtype=d.dtype)  # rows of sentences not encoded stay unused
        full[[d_pos[x] for x in sub]] = d
        vecs[name] = (full, q)
        enc[name] = {k: meta[k] for k in ("precision", "load_s", "doc_s", "query_s", "prompts", "load_average")}
        enc[name].update(sentences=len(sub), sentences_per_s=len(sub) / meta["doc_s"],
                         questions=len(qids), questions_per_s=len(qids) / meta["query_s"])

    rows, by_lang, timing = [], {"pool": {}, "to-en": {}}, defaultdict(float)
    for set_name, (s_docs, analyzer, only) in sets.items():
        language = only if analyzer == "lang" else "multi"
        t0 = time.perf_counter()
        bm25 = BM25(BM25Params(language=language)).index(s_docs, [doc_texts[d_pos[d]] for d in s_docs],
                                                        show_progress=False)
        timing["bm25_index_s"] += time.perf_counter() - t0
        d_idx = np.array([d_pos[d] for d in s_docs])
        blocks = [only] if only else list(LANGS)  # pool / to-en: one block of queries per query language
        systems = ("bm25", E5, "hybrid", *([MINILM] if set_name in minilm_sets else []))
        values = {s: {m: {} for m in (*METRICS, "map_full", "same_language@10")} for s in systems}
        for qlang in blocks:
            b_qids = [q for q in qids if q.startswith(f"{qlang}-") and q in qrels[set_name]]
            b_idx = np.array([q_pos[q] for q in b_qids])
            rel = qrels[set_name]
            t0 = time.perf_counter()
            s, i = bm25.search([q_texts[j] for j in b_idx], DEPTH, show_progress=False)
            runs = {"bm25": to_run(b_qids, s_docs, s, i)}
            timing["bm25_search_s"] += time.perf_counter() - t0
            s_pos = {d: k for k, d in enumerate(s_docs)}
            rel_idx = [[s_pos[d] for d, r in rel[q].items() if r > 0 and d in s_pos] for q in b_qids]
            for name in (E5, MINILM) if MINILM in systems else (E5,):
                dv, qv = vecs[name][0][d_idx], vecs[name][1][b_idx]
                t0 = time.perf_counter()
                s, i = exact_search(qv, dv, DEPTH)
                runs[name] = to_run(b_qids, s_docs, s, i)
                timing["dense_search_s"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                ap_full = full_ranking_ap(qv, dv, rel_idx)
                timing["full_map_s"] += time.perf_counter() - t0
                values[name]["map_full"].update(zip(b_qids, ap_full))
            t0 = time.perf_counter()
            runs["hybrid"] = interpolate(runs[E5], runs["bm25"], lam, n_best=DEPTH, top_k=DEPTH)
            timing["hybrid_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            for name, run in runs.items():
                pq = _per_query({q: rel[q] for q in b_qids}, run)
                for m in METRICS:
                    values[name][m].update(pq[m])
                if set_name == "pool":  # language bias: share of the top 10 in the question's own language
                    values[name]["same_language@10"].update(
                        (q, float(np.mean([d.startswith(f"{qlang}-") for d, _ in
                                           sorted(docs.items(), key=lambda kv: -kv[1])[:10]])))
                        for q, docs in run.items())
            timing["metrics_s"] += time.perf_counter() - t0
            if not only:
                for name in systems:
                    per = _mean(values[name], b_qids)
                    if name in (E5, MINILM):
                        per["map_full"] = float(np.mean([values[name]["map_full"][q] for q in b_qids]))
                    by_lang[set_name].setdefault(name, {})[qlang] = {_key(k): v for k, v in per.items()}
        judged = [q for q in qids if q in qrels[set_name]]
        for name in systems:
            row = {"system": f"{name} {set_name}", **{_key(k): v for k, v in _mean(values[name], judged).items()}}
            row["map_full"] = (float(np.mean([values[name]["map_full"][q] for q in judged]))
                               if name in (E5, MINILM) else None)
            if set_name == "pool":
                row["same_language@10"] = float(np.mean([values[name]["same_language@10"][q] for q in judged]))
            row.update(queries=len(judged), docs=len(s_docs), bm25_language=language if name in ("bm25", "hybrid") else "")
            rows.append(row)
        print(f"{set_name}: " + ", ".join(f"{r['system'].split()[0]} ndcg@10 {r['ndcg@10']:.4f} map {r['map']:.4f}"
                                          for r in rows[-len(systems):]), flush=True)

    extra = {"by_query_language": by_lang, "encoding": enc, "timings_s": {**dict(timing),
             "total_s": time.perf_counter() - t_start}, "hybrid_lambda": lam, "depth": DEPTH,
             "done_when": _done_when(rows, by_lang), "limit": args.limit,
             "minilm_sets": minilm_sets}
    name = "multilingual_smoke" if args.limit else "multilingual"
    rows_out = [{k: v for k, v in r.items() if v is not None} for r in rows]
    path = write_results(name, rows_out, notes=_notes(extra, len(doc_ids), len(qids)), extra=extra)
    _plot(rows, by_lang, path.with_suffix(".png"))
    print(json.dumps(extra["done_when"], indent=2))
    print(f"wrote {path} and {path.with_suffix('.md').name}, {path.with_suffix('.png').name}")


def _key(metric: str) -> str:
    return "map" if metric == "map@1000" else metric


def _done_when(rows, by_lang) -> dict:
    """The issue's done-when checks, from the rows."""
    get = {r["system"]: r for r in rows}
    best = max(("bm25", E5, "hybrid"), key=lambda s: get[f"{s} pool"]["map"])
    to_en = by_lang["to-en"]
    beats = {lang: {"dense_ndcg@10": to_en[E5][lang]["ndcg@10"], "bm25_ndcg@10": to_en["bm25"][lang]["ndcg@10"],
                    "dense_recall@100": to_en[E5][lang]["recall@100"], "bm25_recall@100": to_en["bm25"][lang]["recall@100"]}
             for lang in LANGS if lang != "en"}
    return {
        "pool_best_multilingual": best, "pool_best_map": get[f"{best} pool"]["map"], "lareqa_best_map": LAREQA_BEST,
        "pool_beats_lareqa": get[f"{best} pool"]["map"] > LAREQA_BEST,
        "to_en_languages_reported": sorted(to_en[E5]),
        "to_en_dense_beats_bm25_every_non_english": all(v["dense_ndcg@10"] > v["bm25_ndcg@10"] for v in beats.values()),
        "to_en_dense_recall@100_at_least_bm25_every_non_english": all(
            v["dense_recall@100"] >= v["bm25_recall@100"] for v in beats.values()),
        "to_en_non_english": beats,
    }


def _table(by_lang: dict, metric: str, systems) -> list[str]:
    lines = ["| system | " + " | ".join(LANGS) + " |", "|---|" + "---|" * len(LANGS)]
    for s in (s for s in systems if s in by_lang):
        lines.append(f"| {s} | " + " | ".join(f"{by_lang[s][lang][metric]:.4f}" if lang in by_lang[s] else ""
                                               for lang in LANGS) + " |")
    return lines


def _notes(extra: dict, n_docs: int, n_q: int) -> str:
    enc, t, dw = extra["encoding"], extra["timings_s"], extra["done_when"]
    systems = ("bm25", E5, "hybrid", MINILM)
    lines = [
        f"XQuAD-R (LAReQA), {n_q} questions and {n_docs} sentences in 11 languages"
        + (f" (smoke: first {extra['limit']} questions per language)" if extra["limit"] else "") + ". "
        "`<lang>`: that language's questions against its sentences (BM25 with the language's analyzer); `pool`: "
        "every question against every sentence, 11 relevant each (the answer and its 10 translations; BM25 "
        "`multi`); `to-en`: every question against the English sentences (BM25 `multi`). Dense: exact inner "
        f"product over the top {DEPTH}, multilingual-e5-small with its `query: ` / `passage: ` prefixes. "
        f"Hybrid: multilingual-e5-small + BM25, per-query min-max normalised, λ = {extra['hybrid_lambda']} "
        f"(eval's default, untuned: XQuAD-R has no training split), both sides' top {DEPTH} fused, as "
        "`twotower eval --retriever hybrid`. `map`: pytrec_eval `map_cut.1000` (a relevant sentence below rank "
        "1000 adds 0); `map_full`: average precision over the full ranking of all candidates (LAReQA's "
        "definition), computed directly from the scores, for the dense rows. `same_language@10` (`pool`): the "
        "share of the top 10 in the question's own language (1 of the 11 answers is; of all sentences, 1/11). "
        "all-MiniLM-L6-v2 is English-only: "
        f"the reference, run on {', '.join(extra['minilm_sets'])}.",
        "",
        f"Done when: best multilingual retriever on `pool`: {dw['pool_best_multilingual']}, mAP "
        f"{dw['pool_best_map']:.4f} vs LAReQA's best baseline {LAREQA_BEST} -> "
        f"{'holds' if dw['pool_beats_lareqa'] else 'does NOT hold'}; `to-en` reports all "
        f"{len(dw['to_en_languages_reported'])} query languages; multilingual-e5-small beats BM25 on NDCG@10 on every "
        f"non-English one: {'holds' if dw['to_en_dense_beats_bm25_every_non_english'] else 'does NOT hold'} "
        f"(Recall@100 at least BM25's on every one: "
        f"{'yes' if dw['to_en_dense_recall@100_at_least_bm25_every_non_english'] else 'no'}).",
        "",
        "Encoding (CPU, every text once per model; " + "; ".join(
            f"{m}: {v['precision']}, sentences {v['doc_s']:.0f} s ({v['sentences_per_s']:.1f}/s), questions "
            f"{v['query_s']:.0f} s ({v['questions_per_s']:.1f}/s), load average {v['load_average'][0]:.1f}"
            for m, v in enc.items()) + "). Other work: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()) + ".",
        "",
        "`to-en` per query language, NDCG@10:", "", *_table(extra["by_query_language"]["to-en"], "ndcg@10", systems),
        "", "`to-en` per query language, Recall@100:", "",
        *_table(extra["by_query_language"]["to-en"], "recall@100", systems),
        "", "`pool` per query language, mAP (map_cut.1000):", "",
        *_table(extra["by_query_language"]["pool"], "map", systems),
    ]
    return "\n".join(lines)


def _plot(rows, by_lang, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    get = {r["system"]: r for r in rows}
    systems = ("bm25", E5, "hybrid", MINILM)
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    x = np.arange(len(LANGS))
    width = 0.2
    panels = (("monolingual sets, NDCG@10", lambda s, lang: get[f"{s} {lang}"]["ndcg@10"]),
              ("to-en by query language, NDCG@10", lambda s, lang: by_lang["to-en"][s][lang]["ndcg@10"]),
              ("pool by query language, mAP", lambda s, lang: by_lang["pool"][s][lang]["map"]))
    for ax, (title, value) in zip(axes, panels):
        for k, s in enumerate(systems):
            heights = []
            for lang in LANGS:  # all-MiniLM-L6-v2 has bars only where it ran (--minilm-sets)
                try:
                    heights.append(value(s, lang))
                except KeyError:
                    heights.append(np.nan)
            if not np.all(np.isnan(heights)):
                ax.bar(x + (k - 1.5) * width, heights, width, label=s)
        ax.set_xticks(x, LANGS)
        ax.set_ylim(0, 1.25)
        ax.set_yticks(np.arange(0, 1.01, 0.2))
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[2].axhline(LAREQA_BEST, color="k", ls="--", lw=1, label=f"LAReQA best (mAP {LAREQA_BEST})")
    for ax in axes:
        ax.legend(fontsize=8, loc="upper center", ncol=3)
    fig.suptitle("XQuAD-R: BM25 (language analyzers / multi), multilingual-e5-small, hybrid λ 0.5, all-MiniLM-L6-v2")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
