"""mContriever without labels on XQuAD-R's ``pool`` (issues #23 item 4 and #72 part 2): each label-free step's
contribution to pool mAP, from multilingual-e5-small.

No question–answer pair and no qrel is used to train anything. What each step uses:

- ``+ centering``: the pool sentences' vectors; each sentence's and each question's language *detected*
  (``data.language.detect_language``, one text at a time); every vector minus its language's mean sentence vector.
- ``+ LIR``: ``twotower models align-languages`` (300 sentences per detected language; directions of the language
  means projected out), computed here on the cached vectors.
- ``+ crop/MoCo``: ``twotower pretrain --augment crop --negatives moco`` on the 13,014 pool sentences (Contriever's
  recipe: two crops of one sentence are positives, a queue of past keys the negatives); ``+ crop/MoCo + LIR``: LIR
  on its vectors (does the damage sit in a few language directions?).
- ``+ translation map``: translation pairs *mined* from the pool's sentences (XQuAD-R's paragraphs are
  translations of each other; within a paragraph, a sentence and an English sentence that are each other's nearest
  neighbour by the zero-shot model's cosine form a pair, English as pivot; clusters of one English sentence and its
  partners), then a linear map fitted with the translation-ranking loss (``encoders.translation_align``).
  ``held-out pairs``: a question is scored with the map fitted on the *other* fold's paragraphs (its answer and the
  answer's translations never were a pair); ``pool pairs``: with the map fitted on all 240 paragraphs (the
  documents' own text, as pre-training on the corpus is).
- ``+ PRF``: dense pseudo-relevance feedback (``--prf-depth/--prf-weight``).

Settings (the map's ``reg``; PRF depth and weight) are chosen by mAP on one fold's questions (paragraphs 0–119 or
120–239, as ``multilingual_train.py``'s folds) and applied to the other fold's questions, both ways: every
question's score comes from settings chosen without it. All rows: every one of the 13,090 questions against the
full 13,014-sentence pool; mAP over the full ranking (LAReQA's measure).

    python benchmarks/multilingual_pretrain.py [--regs 0.1,1] [--steps 300]
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
from multilingual import E5, LANGS, LAREQA_BEST, _load, _save_npy, full_ranking_ap, vectors  # noqa: E402
from multilingual_train import (FOLDS, center, fold_questions, lang_means, log, paragraph_of_doc,  # noqa: E402
                                scores_of, tune_prf, with_prf)

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "multilingual_pretrain"
# --no-moco: the crop/MoCo row as measured before (results/multilingual_pretrain.* at commit 0147c0d, AMD EPYC 2 cores,
# the same pretrain command), for the table's completeness
EARLIER_MOCO = {"system": f"{E5} + crop/MoCo (earlier run, 0147c0d)", "map": 0.0885, "ndcg@10": 0.1899,
                "to-en ndcg@10": 0.7333, "mono ndcg@10": 0.8281}
KEYS = ("map", "ndcg@10", "same_language@10", "to-en ndcg@10", "mono ndcg@10")


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.replace(E5, "e5")).strip("-")


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True).clip(1e-12)).astype(np.float32)


# ---------------------------------------------------------------- the steps


def crop_moco(args, doc_ids, doc_texts, q_texts) -> tuple[np.ndarray, np.ndarray, list[str], float, list | None]:
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    run = WORK / f"crop-moco-s{args.moco_steps}-b32-lr{args.moco_lr}"
    settings = ["--augment", "crop", "--negatives", "moco", "--queue-size", "4096", "--momentum", "0.999",
                "--chunk-tokens", "64", "--steps", str(args.moco_steps), "--batch-size", "32",
                "--lr", str(args.moco_lr),
                "--freeze-embeddings"]
    if not (run / "model" / "twotower.json").is_file():
        cmd = [sys.executable, "-m", "twotower.cli", "pretrain", "--model", E5, "--corpus",
               str(DATA / "xquad-r" / "pool"), "--out", str(run), "--no-progress", *settings]
        log("$ " + " ".join(cmd))
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        (run / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    if not (run / "queries.npy").is_file():
        model = DualEncoder.load(str(run / "model"))
        opts = EncodeOptions(show_progress=False)
        _save_npy(run / "docs.npy", model.encode_documents(doc_texts, opts))
        _save_npy(run / "queries.npy", model.encode_queries(q_texts, opts))
    log_path = run / "train_log.json"
    return (np.load(run / "docs.npy"), np.load(run / "queries.npy"), settings, float((run / "wall_s.txt").read_text()),
            json.loads(log_path.read_text()) if log_path.is_file() else None)


def lir_projection(dv: np.ndarray, doc_texts: list[str], per_language: int) -> tuple[np.ndarray, dict]:
    """The projection ``twotower models align-languages --per-language N`` stores, from cached vectors."""
    from twotower.encoders.language_bias import language_directions, sample_by_language

    found = language_directions(dv, sample_by_language(doc_texts, per_language=per_language))
    return np.eye(dv.shape[1], dtype=np.float32) - found.basis.T @ found.basis, found.to_json()


def mine_clusters(dv: np.ndarray, doc_ids: list[str], paragraphs) -> list[list[int]]:
    """Per paragraph: each English sentence with the sentences of other languages that are its mutual nearest
    neighbour (zero-shot cosine) among that paragraph's sentences; clusters of at least two."""
    from twotower.encoders.translation_align import mutual_nearest_pairs

    langs = np.array([d.split("-")[0] for d in doc_ids])
    para = np.array([paragraph_of_doc(d) for d in doc_ids])
    out = []
    for p in paragraphs:
        en = np.flatnonzero((langs == "en") & (para == p))
        members = {int(e): [int(e)] for e in en}
        for lang in LANGS:
            if lang != "en":
                rows = np.flatnonzero((langs == lang) & (para == p))
                for i, j in mutual_nearest_pairs(dv[rows], dv[en]):
                    members[int(en[j])].append(int(rows[i]))
        out += [m for m in members.values() if len(m) > 1]
    return out


def geometry(d: np.ndarray, clusters: list[list[int]], langs: np.ndarray, seed: int = 0) -> dict:
    """Mean cosine of mined translation pairs, of random sentence pairs in one language and in two: how far a
    sentence's translations sit against its own language's other sentences."""
    rng = np.random.default_rng(seed)
    tr = np.array([(c[0], j) for c in clusters for j in c[1:]])
    a, b = rng.integers(0, len(d), 20000), rng.integers(0, len(d), 20000)
    same, cross = (langs[a] == langs[b]) & (a != b), langs[a] != langs[b]
    cos = np.sum(d[a] * d[b], axis=1)
    return {"translation": round(float(np.sum(d[tr[:, 0]] * d[tr[:, 1]], axis=1).mean()), 4),
            "same_language_random": round(float(cos[same].mean()), 4),
            "cross_language_random": round(float(cos[cross].mean()), 4)}


def fit_map(name: str, vecs: np.ndarray, clusters: list[list[int]], args, reg: float) -> tuple[np.ndarray, dict]:
    """Every pair within each cluster (its group: the cluster), the map fitted on ``vecs`` (cached in WORK)."""
    import torch

    from twotower.encoders.translation_align import MapConfig, fit_translation_map

    path = WORK / "maps" / f"{name}-reg{reg}-s{args.steps}.npy"
    if path.is_file():
        return np.load(path), json.loads(path.with_suffix(".json").read_text())
    x, y, g = cluster_pairs(clusters)
    cfg = MapConfig(steps=args.steps, batch_size=512, lr=1e-3, temperature=0.05, reg=reg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 threads on 2 busy cores were 9× slower (spinning)
    t0 = time.perf_counter()
    try:
        w, losses = fit_translation_map(vecs[x], vecs[y], g, cfg)
    finally:
        torch.set_num_threads(threads)
    info = {"pairs": len(x), "clusters": len(clusters), "fit_s": round(time.perf_counter() - t0, 1),
            "loss_first": losses[0], "loss_last": losses[-1]}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, w)
    path.with_suffix(".json").write_text(json.dumps(info))
    log(f"map {name} reg {reg}: {info}")
    return w, info


# ---------------------------------------------------------------- the benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regs", default="0.1,1", help="the map's reg values to choose from (on the other fold)")
    ap.add_argument("--steps", type=int, default=300, help="map fitting steps (batches of 512 pairs)")
    ap.add_argument("--per-language", type=int, default=300, help="LIR: sentences per detected language")
    ap.add_argument("--moco-steps", type=int, default=100)
    ap.add_argument("--moco-lr", type=float, default=1e-5)
    ap.add_argument("--moco", action=argparse.BooleanOptionalAction, default=True,
                    help="run crop/MoCo (--no-moco: its row as measured before, EARLIER_MOCO)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    from twotower.data.language import detect_language

    doc_ids, doc_texts, qids, q_texts, qrels = _load(0)
    d_langs = np.array([d.split("-")[0] for d in doc_ids])  # evaluation only: sets, same-language share
    folds = fold_questions(qids, qrels["pool"])
    q_pos, d_pos = {q: i for i, q in enumerate(qids)}, {d: i for i, d in enumerate(doc_ids)}
    zd, zq, _ = vectors(E5, doc_ids, doc_texts, qids, q_texts, "auto", None)
    det_d = np.array([detect_language([t]) for t in doc_texts])  # label-free: what centering uses
    det_q = np.array([detect_language([t]) for t in q_texts])
    detected = {"sentences": round(float((det_d == d_langs).mean()), 4),
                "questions": round(float((det_q == np.array([q.split("-")[0] for q in qids])).mean()), 4)}
    P, lir_report = lir_projection(zd, doc_texts, args.per_language)

    def centered(d, q):
        means = lang_means(d, det_d)
        return center(d, det_d, means), center(q, det_q, means)

    def lir(d, q):
        return _unit(d @ P.T), _unit(q @ P.T)

    def quick_map(d, q, fold):  # tuning: every third question of the fold
        sub = folds[fold][::3]
        rel = [[d_pos[x] for x, r in qrels["pool"][s].items() if r > 0] for s in sub]
        return float(full_ranking_ap(q[[q_pos[s] for s in sub]], d, rel).mean())

    # variants: name -> {fold: (docs, all queries)}; settings chosen on one fold are used for the other
    variants, info = {}, {"detected_share": detected, "lir": lir_report}
    same = {"A": None, "B": None}
    variants[E5] = {f: (zd, zq) for f in same}
    variants[f"{E5} + centering"] = {f: centered(zd, zq) for f in same}
    ld, lq = lir(zd, zq)
    variants[f"{E5} + LIR"] = {f: (ld, lq) for f in same}
    moco_settings, moco_s, moco_log = [], None, None
    if args.moco:
        md, mq, moco_settings, moco_s, moco_log = crop_moco(args, doc_ids, doc_texts, q_texts)
        variants[f"{E5} + crop/MoCo"] = {f: (md, mq) for f in same}
        Pm, info["lir_after_moco"] = lir_projection(md, doc_texts, args.per_language)
        variants[f"{E5} + crop/MoCo + LIR"] = {f: (_unit(md @ Pm.T), _unit(mq @ Pm.T)) for f in same}

    clusters = {f: mine_clusters(zd, doc_ids, FOLDS[f]) for f in FOLDS}
    clusters["pool"] = clusters["A"] + clusters["B"]
    info["mined"] = {f: {"clusters": len(c), "sentences": int(sum(map(len, c)))} for f, c in clusters.items()}
    write_pairs(WORK / "pairs-pool.tsv", clusters["pool"], doc_texts)
    other = {"A": "B", "B": "A"}
    regs = [float(r) for r in args.regs.split(",")]
    chosen, maps = {}, {}
    for base_name, (bd, bq) in ((E5, (zd, zq)), (f"{E5} + LIR", (ld, lq))):
        for route in ("held-out pairs", "pool pairs"):
            name = f"{base_name} + translation map ({route})"
            if base_name == E5 and route == "pool pairs":
                continue  # the two routes are compared on top of LIR; the plain map once, held out
            tag = ("lir-" if base_name != E5 else "") + ("heldout" if route.startswith("held") else "pool")
            # the map a fold's questions are scored with: fitted on the other fold's pairs, or on all of them
            fits = {reg: {f: fit_map(f"{tag}-{other[f] if route.startswith('held') else 'pool'}", bd,
                                     clusters[other[f] if route.startswith("held") else "pool"], args, reg)
                          for f in FOLDS} for reg in regs}
            maps[name] = {str(reg): {f: fits[reg][f][1] for f in FOLDS} for reg in regs}
            per_fold = {}
            for test in FOLDS:
                tune = other[test]
                grid = {reg: quick_map(_unit(bd @ fits[reg][tune][0].T), _unit(bq @ fits[reg][tune][0].T), tune)
                        for reg in regs}
                reg = max(grid, key=grid.get)
                chosen[f"{name}, tested on {test}"] = {"reg": reg, "grid_on_" + tune: {str(k): round(v, 4)
                                                                                       for k, v in grid.items()}}
                w = fits[reg][test][0]
                per_fold[test] = (_unit(bd @ w.T), _unit(bq @ w.T))
            variants[name] = per_fold
    for name in (f"{E5} + LIR", f"{E5} + LIR + translation map (held-out pairs)",
                 f"{E5} + LIR + translation map (pool pairs)"):
        per_fold = {}
        for test in FOLDS:
            tune = other[test]
            td, tq = variants[name][tune]
            sub = folds[tune]
            cache = WORK / "prf" / f"{_slug(name)}-{tune}-{args.regs}-s{args.steps}.json"
            if not cache.is_file():
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(tune_prf(tq[[q_pos[s] for s in sub]], td, sub, doc_ids, qrels["pool"])))
            (depth, weight), grid = json.loads(cache.read_text())
            chosen[f"{name} + PRF, tested on {test}"] = {"depth": depth, "weight": weight}
            d, q = variants[name][test]
            rows = [q_pos[s] for s in folds[test]]
            q = q.copy()
            if depth:
                q[rows] = with_prf(q[rows], d, depth, weight)
            per_fold[test] = (d, q)
        variants[f"{name} + PRF"] = per_fold

    info["geometry"] = {name: geometry(per_fold["A"][0], clusters["pool"], d_langs) for name, per_fold in
                        variants.items() if "PRF" not in name and "pairs" not in name}
    rows = []
    for name, per_fold in variants.items():
        t0 = time.perf_counter()
        m = {f: scores_of(per_fold[f][0], per_fold[f][1][[q_pos[x] for x in folds[f]]], doc_ids, folds[f], qrels,
                          None, d_langs) for f in FOLDS}
        n = {f: len(folds[f]) for f in FOLDS}
        row = {"system": name}
        for k in KEYS:
            row[k] = round(sum(m[f][k] * n[f] for f in FOLDS) / sum(n.values()), 4)
            if k == "map":
                row.update({f"map {f}": round(m[f]["map"], 4) for f in FOLDS})
        rows.append(row)
        log(f"{row} ({time.perf_counter() - t0:.0f} s)")
    info.update({"settings": vars(args), "chosen": chosen, "maps": maps, "crop_moco_settings": moco_settings,
                 "crop_moco_train_s": moco_s, "crop_moco_train_log": moco_log, "lareqa_best_map": LAREQA_BEST,
                 "folds": {f: len(v) for f, v in folds.items()}, "total_s": round(time.perf_counter() - t_start)})
    if not args.moco:
        rows.insert(3, dict(EARLIER_MOCO))
    write_results("multilingual_pretrain", rows, notes=notes(rows, info, args), extra=info)


def cluster_pairs(clusters: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """Every pair within each cluster, in a fixed order, and its group (the cluster)."""
    x, y, g = [], [], []
    for k, c in enumerate(clusters):
        for i in range(len(c)):
            for j in range(i + 1, len(c)):
                x.append(c[i]), y.append(c[j]), g.append(k)
    return x, y, g


def write_pairs(path: Path, clusters: list[list[int]], texts: list[str]) -> None:
    """The pairs the map is fitted on, in the same order, as ``twotower models align-translations --pairs`` reads
    them (its groups, from the texts the pairs share, are the clusters)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    x, y, _ = cluster_pairs(clusters)
    with path.open("w", encoding="utf-8", newline="") as fh:
        for i, j in zip(x, y):
            fh.write(f"{' '.join(texts[i].split())}\t{' '.join(texts[j].split())}\n")


def notes(rows: list[dict], info: dict, args) -> str:
    pool = {r["system"]: r["map"] for r in rows}
    best = max(pool, key=pool.get)
    held = max((k for k in pool if "held-out" in k), key=pool.get)
    moco = (f"`twotower pretrain --model {E5} --corpus xquad-r/pool {' '.join(info['crop_moco_settings'])}` "
            f"({info['crop_moco_train_s']} s)" if info["crop_moco_settings"] else
            "the earlier run's row (same command, `results/multilingual_pretrain.*` at commit 0147c0d, AMD EPYC 2 "
            "cores; not rerun here: `--no-moco`)")
    return (
        f"Machine: 2-core Intel Xeon (AMX, AVX512-BF16), shared with other jobs; no GPU. XQuAD-R `pool`: all 13,090 "
        f"questions against all 13,014 sentences (11 languages); `map`: full-ranking mAP (LAReQA's measure); `map A` / "
        f"`map B`: the questions of paragraphs 0–119 / 120–239; `ndcg@10`, `same_language@10` (share of the top 10 "
        f"in the question's language) on `pool`; `to-en ndcg@10`; `mono ndcg@10`: mean over the 11 monolingual sets."
        f"\n\n**No question and no qrel trained anything.** Data per step: `centering` and `LIR` use the pool "
        f"sentences' vectors and their *detected* languages (share detected right: {info['detected_share']}; "
        f"centering subtracts the detected language's mean sentence vector from sentences and questions alike); "
        f"crop/MoCo: {moco}, on the pool sentences; the translation map: pairs mined from the pool's sentences "
        f"(XQuAD-R's paragraphs are translations of each other, the paragraph number in each sentence id: within a "
        f"paragraph, mutual nearest neighbours by the zero-shot model's cosine, English as pivot; mined {info['mined']}), every pair within a cluster, fitted "
        f"with the translation-ranking loss (`encoders/translation_align.py`: temperature 0.05, {args.steps} Adam "
        f"steps of 512 pairs, lr 1e-3, from the identity, reg·‖W−I‖²/d). `held-out pairs`: each question is scored "
        f"with the map fitted on the other fold's paragraphs only (its answer and the answer's translations never "
        f"were a pair); `pool pairs`: on all 240 paragraphs — the pool's own text, as pre-training on the corpus is "
        f"(transductive, still no labels). `.cache/multilingual_pretrain/pairs-pool.tsv` holds those pairs as "
        f"`twotower models align-translations --pairs` takes them.\n\n**Settings chosen on the other fold**: the "
        f"map's reg from {args.regs} and PRF's (depth, weight) from multilingual_train's grid, by mAP on one fold's "
        f"questions (every third), applied to the other fold's questions, both ways: {info['chosen']}. Before this "
        f"script, the variants were explored on fold A's questions only (LIR beat a hard removal of the top "
        f"within-translation principal directions and a within-translation whitening; the map on top of LIR helped), "
        f"and once a fold-B score was looked at (the plain map fitted on fold A's pairs, 0.514).\n\nGeometry (mean "
        f"cosine: mined translation pairs vs random sentence pairs in one language and in two): {info['geometry']}."
        f"\n\nBest: {best}, pool mAP {pool[best]}; with pairs from held-out paragraphs only: {held}, {pool[held]} "
        f"(goal 0.66; LAReQA's best mBERT baseline, trained on translated QA pairs: {LAREQA_BEST}). "
        f"Total {info['total_s']} s.")


if __name__ == "__main__":
    main()
