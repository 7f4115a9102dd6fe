"""Language-bias removal (``twotower models align-languages``, LIR) on XQuAD-R, zero-shot multilingual-e5-small:
``pool`` mAP, ``to-en`` and the 11 monolingual sets, before and after (issue #23).

1. runs ``twotower models align-languages --model multilingual-e5-small --data xquad-r/pool --out WORK/aligned``
   as a command: it detects each sentence's language (no labels, no id prefixes), encodes ``--per-language`` of
   each, and writes the model with the directions spanned by the language means projected out;
2. checks the aligned model against the plain one: its encodings of 200 sentences and 200 questions must equal
   normalise(P·v) of the plain model's cached vectors v, P the aligned model's stored projection (cosine ≥ 0.999);
3. scores both on every set from the full vectors (the plain model's cached ones, as ``benchmarks/multilingual.py``
   keeps them, and P applied to them): mAP over the full ranking (LAReQA's measure) and NDCG@10 / R@100.

    python benchmarks/multilingual_align.py [--per-language 300] [--directions N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402
from multilingual import E5, LANGS, LAREQA_BEST, _load, full_ranking_ap, vectors  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "multilingual_align"


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def score_sets(variants: dict, doc_ids: list[str], qids: list[str], qrels: dict) -> tuple[list[dict], dict]:
    """Rows ``"<name> <set>"`` (NDCG@10, R@100, mAP over the full ranking) for each ``name: (doc vectors, query
    vectors)`` on the 11 monolingual sets, ``to-en`` and ``pool``; and mAP per query language on ``pool``/``to-en``."""
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import exact_search, to_run

    row_of = {d: i for i, d in enumerate(doc_ids)}
    sets = {lang: [d for d in doc_ids if d.startswith(f"{lang}-")] for lang in LANGS}
    sets["to-en"], sets["pool"] = sets["en"], doc_ids
    rows, by_lang = [], {}
    for name, (D, Q) in variants.items():
        for set_name, docs in sets.items():
            q_idx = [i for i, q in enumerate(qids) if q in qrels[set_name]]
            cols = np.array([row_of[d] for d in docs])
            local = {d: j for j, d in enumerate(docs)}
            rel = [[local[d] for d, r in qrels[set_name][qids[i]].items() if r > 0] for i in q_idx]
            ap_q = full_ranking_ap(Q[q_idx], D[cols], rel)
            scores, idx = exact_search(Q[q_idx], D[cols], 100)
            m = evaluate(qrels[set_name], to_run([qids[i] for i in q_idx], docs, scores, idx), ("ndcg@10", "recall@100"))
            rows.append({"system": f"{name} {set_name}", "ndcg@10": round(m["ndcg@10"], 4),
                         "recall@100": round(m["recall@100"], 4), "map": round(float(ap_q.mean()), 4),
                         "queries": len(q_idx)})
            if set_name in ("pool", "to-en"):
                langs = np.array([qids[i].split("-")[0] for i in q_idx])
                by_lang.setdefault(set_name, {})[name] = {lang: round(float(ap_q[langs == lang].mean()), 4)
                                                          for lang in LANGS}
            print(rows[-1], flush=True)
    return rows, by_lang


def prf_crossfitted(D: np.ndarray, Q: np.ndarray, doc_ids: list[str], qids: list[str], qrels: dict) -> tuple[dict, dict]:
    """``pool`` with dense pseudo-relevance feedback (``--prf-depth/--prf-weight``): its (depth, weight) tuned by
    mAP on one fold's questions (``multilingual_train``'s paragraph folds) and applied to the other fold's, both
    ways; a row over all questions (each scored with the setting tuned on the other fold) and the settings chosen."""
    from multilingual_train import fold_questions, tune_prf, with_prf

    folds = fold_questions(qids, qrels["pool"])
    pos, row_of = {q: i for i, q in enumerate(qids)}, {d: i for i, d in enumerate(doc_ids)}
    aps, chosen = [], {}
    for tune, test in (("A", "B"), ("B", "A")):
        (depth, weight), _ = tune_prf(Q[[pos[q] for q in folds[tune]]], D, folds[tune], doc_ids, qrels["pool"])
        chosen[f"tested on {test}"] = [depth, weight]
        q = Q[[pos[x] for x in folds[test]]]
        rel = [[row_of[d] for d, r in qrels["pool"][x].items() if r > 0] for x in folds[test]]
        aps.append(full_ranking_ap(with_prf(q, D, depth, weight) if depth else q, D, rel))
    ap = np.concatenate(aps)
    return {"map": round(float(ap.mean()), 4), "queries": len(ap)}, chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-language", type=int, default=300)
    ap.add_argument("--directions", type=int, default=None)
    args = ap.parse_args()
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    doc_ids, doc_texts, qids, q_texts, qrels = _load(0)
    dv, qv, _ = vectors(E5, doc_ids, doc_texts, qids, q_texts, "auto", None)
    out = WORK / f"aligned-{args.per_language}-{args.directions or 'auto'}"
    if not (out / "language_directions.json").is_file():
        cmd = [sys.executable, "-m", "twotower.cli", "models", "align-languages", "--model", E5, "--data",
               str(DATA / "xquad-r" / "pool"), "--out", str(out), "--no-progress",
               "--per-language", str(args.per_language)] + (["--directions", str(args.directions)] if args.directions else [])
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        (out / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    report = json.loads((out / "language_directions.json").read_text())
    wall_s = float((out / "wall_s.txt").read_text()) if (out / "wall_s.txt").is_file() else None

    model = DualEncoder.load(str(out))
    proj = model.doc_tower.projection.linear.weight.detach().double().numpy()
    rng = np.random.default_rng(0)
    di, qi = rng.choice(len(doc_ids), 200, replace=False), rng.choice(len(qids), 200, replace=False)
    opts = EncodeOptions(show_progress=False)
    got_d = model.encode_documents([doc_texts[i] for i in di], opts)
    got_q = model.encode_queries([q_texts[i] for i in qi], opts)
    check = {"docs": float(np.min(np.sum(got_d * _unit(dv[di] @ proj.T), axis=1))),
             "queries": float(np.min(np.sum(got_q * _unit(qv[qi] @ proj.T), axis=1)))}
    print(f"aligned model vs P·(cached plain vectors): min cosine {check}", flush=True)
    if min(check.values()) < 0.999:
        sys.exit("error: the aligned model's encodings differ from the stored projection applied to the plain ones")

    from twotower.retrieval.analyzers import detect_language

    detected = {lang: round(float(np.mean([detect_language([t]) == lang for d, t in zip(doc_ids, doc_texts)
                                            if d.startswith(f"{lang}-")])), 3) for lang in LANGS}
    print(f"per-sentence language detection, share right: {detected}", flush=True)
    variants = {E5: (dv, qv), f"{E5} aligned": (_unit(dv @ proj.T).astype(np.float32),
                                                 _unit(qv @ proj.T).astype(np.float32))}
    rows, by_lang = score_sets(variants, doc_ids, qids, qrels)
    prf_row, prf_chosen = prf_crossfitted(*variants[f"{E5} aligned"], doc_ids, qids, qrels)
    rows.append({"system": f"{E5} aligned +prf pool", **prf_row})
    print(rows[-1], prf_chosen, flush=True)
    pool = {r["system"]: r["map"] for r in rows if r["system"].endswith(" pool")}
    notes = (
        f"XQuAD-R, zero-shot {E5} (4-bit weights, dequantized). `aligned`: the model written by `twotower models "
        f"align-languages --per-language {args.per_language}` ({wall_s} s): it detected the languages "
        f"{report['languages']} (sentences encoded per language; `multi` and rare detections left out) and removed "
        f"{report['directions']} directions (singular values of the language-mean matrix: {report['singular_values']}). "
        f"Its encodings equal the stored projection applied to the plain model's vectors (min cosine {check}), so the "
        f"metrics use the plain vectors (cached by `benchmarks/multilingual.py`) times that projection. map: over the "
        f"full ranking of the set's sentences (LAReQA's measure; its best mBERT baseline on `pool`: {LAREQA_BEST}). "
        f"pool mAP: {pool}. Per query language: `map_by_language` in the JSON. Share of each language's sentences "
        f"whose detected language (one sentence at a time) is right: {detected}. `aligned +prf pool`: the aligned "
        f"model with dense pseudo-relevance feedback (`--prf-depth D --prf-weight W`), D and W chosen by mAP on one "
        f"half of the questions (paragraphs 0-119 or 120-239, as `multilingual_train.py`'s folds) and applied to "
        f"the other half, both ways; chosen (depth, weight): {prf_chosen}.")
    write_results("multilingual_align", rows, notes=notes,
                  extra={"map_by_language": by_lang, "directions": report, "check_min_cosine": check,
                         "detected_share": detected, "prf_chosen": prf_chosen})


if __name__ == "__main__":
    main()
