"""Cross-lingual training and language-mean centering on XQuAD-R's ``pool`` (issue #23, item 4), measured on
held-out articles.

XQuAD-R has no training split, so the 240 paragraphs are cross-fitted: fold A = paragraphs 0–119, fold B =
120–239 (contiguous blocks of XQuAD's paragraph order, so at most one article straddles the cut). A model
trained on fold A's questions is scored only on fold B's questions (and the reverse), always against the FULL
pool corpus (13,014 sentences of both folds), beside the zero-shot multilingual-e5-small on exactly the same
questions. Metrics: mAP over the full ranking (LAReQA's definition; ``multilingual.full_ranking_ap``), NDCG@10,
and the share of the top 10 in the question's own language; plus ``to-en`` and the monolingual sets on the
held-out questions.

Also: language-mean centering (Libovický et al. 2020): subtract each language's mean vector and renormalise,
documents by their language's document mean, queries by their language's query mean (``center=q``) or document
mean (``center=d``); the language comes from the id prefix (oracle language), no labels are used.

    python benchmarks/multilingual_train.py --folds A --steps 16     # train A, test B
    python benchmarks/multilingual_train.py --folds A,B --steps 16    # both: the cross-fitted whole too
    python benchmarks/multilingual_train.py --folds A,B --steps 96 --hard-negatives 1 --name multilingual_train_hn1

``--hard-negatives N``: each pair also carries N same-language hard negatives (other sentences of the answer's
paragraph in the question's language). Rows ``+prf``: dense pseudo-relevance feedback (``twotower.retrieval.prf``),
its depth and weight tuned on the training fold's questions (``--no-prf`` leaves them out).

Vectors and trained models are cached under ``.cache/multilingual_train/`` (and the zero-shot ones where
``benchmarks/multilingual.py`` keeps them), so a re-run with the same settings skips finished work.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from multilingual import E5, LANGS, LAREQA_BEST, _load, _save_npy, full_ranking_ap, vectors  # noqa: E402

WORK = Path(__file__).resolve().parents[1] / ".cache" / "multilingual_train"
N_PARAGRAPHS, CUT = 240, 120
FOLDS = {"A": range(0, CUT), "B": range(CUT, N_PARAGRAPHS)}


def _sha(obj) -> str:
    import hashlib

    return hashlib.sha1(json.dumps(obj, ensure_ascii=False).encode()).hexdigest()[:16]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- folds


def paragraph_of_doc(doc_id: str) -> int:
    return int(doc_id.split("-")[1])


def paragraph_of_query(qrels_pool: dict, qid: str) -> int:
    """The paragraph of a question: that of its relevant sentences (all 11 are translations of one sentence)."""
    paragraphs = {paragraph_of_doc(d) for d, r in qrels_pool[qid].items() if r > 0}
    if len(paragraphs) != 1:
        raise ValueError(f"question {qid}: relevant sentences in paragraphs {sorted(paragraphs)}, expected one")
    return paragraphs.pop()


def fold_questions(qids, qrels_pool) -> dict[str, list[str]]:
    return {f: [q for q in qids if paragraph_of_query(qrels_pool, q) in r] for f, r in FOLDS.items()}


# ---------------------------------------------------------------- centering


def center(vecs: np.ndarray, langs: np.ndarray, means: dict[str, np.ndarray]) -> np.ndarray:
    """Each row minus its language's mean, renormalised to unit length."""
    out = vecs.astype(np.float32).copy()
    for lang, mu in means.items():
        out[langs == lang] -= mu
    return out / np.linalg.norm(out, axis=1, keepdims=True).clip(1e-12)


def lang_means(vecs: np.ndarray, langs: np.ndarray) -> dict[str, np.ndarray]:
    return {lang: vecs[langs == lang].mean(0) for lang in LANGS if (langs == lang).any()}


def centered_variants(dv, qv, d_langs, q_langs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"": raw, " center=d": queries by the docs' means, " center=q": queries by their own}``."""
    dm = lang_means(dv, d_langs)
    dc = center(dv, d_langs, dm)
    return {"": (dv, qv), " center=d": (dc, center(qv, q_langs, dm)),
            " center=q": (dc, center(qv, q_langs, lang_means(qv, q_langs)))}


# ---------------------------------------------------------------- metrics


def scores_of(dv, qv, doc_ids, qids, qrels, sets, d_langs) -> dict:
    """Pool mAP (full ranking), NDCG@10 and same-language@10, to-en NDCG@10 / R@100 and the monolingual sets'
    NDCG@10 (mean over the 11), for the questions ``qids`` (rows of ``qv``)."""
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import exact_search, to_run

    out = {}
    d_pos = {d: i for i, d in enumerate(doc_ids)}
    rel_idx = [[d_pos[d] for d, r in qrels["pool"][q].items() if r > 0] for q in qids]
    out["map"] = float(np.mean(full_ranking_ap(qv, dv, rel_idx)))
    s, i = exact_search(qv, dv, 10)
    out["ndcg@10"] = evaluate({q: qrels["pool"][q] for q in qids}, to_run(qids, doc_ids, s, i), ("ndcg@10",))["ndcg@10"]
    q_langs = np.array([q.split("-")[0] for q in qids])
    out["same_language@10"] = float((d_langs[i] == q_langs[:, None]).mean())
    en = np.flatnonzero(d_langs == "en")
    s, i = exact_search(qv, dv[en], 100)
    m = evaluate({q: qrels["to-en"][q] for q in qids}, to_run(qids, [doc_ids[j] for j in en], s, i),
                 ("ndcg@10", "recall@100"))
    out["to-en ndcg@10"], out["to-en recall@100"] = m["ndcg@10"], m["recall@100"]
    mono = []
    for lang in LANGS:
        rows = np.flatnonzero(q_langs == lang)
        cols = np.flatnonzero(d_langs == lang)
        lq = [qids[r] for r in rows]
        s, i = exact_search(qv[rows], dv[cols], 10)
        mono.append(evaluate({q: qrels[lang][q] for q in lq}, to_run(lq, [doc_ids[c] for c in cols], s, i),
                             ("ndcg@10",))["ndcg@10"])
    out["mono ndcg@10"] = float(np.mean(mono))
    return out


# ---------------------------------------------------------------- training


def same_language_negatives(doc_ids) -> dict[tuple[str, int], list[str]]:
    """``(language, paragraph) -> sentence ids``: where a question's same-language hard negatives come from."""
    out: dict[tuple[str, int], list[str]] = {}
    for d in doc_ids:
        out.setdefault((d.split("-")[0], paragraph_of_doc(d)), []).append(d)
    return out


def training_pairs(fold_qids, q_text, doc_text, qrels_pool, n: int, seed: int, same_share: float,
                   hard_negatives: int = 0, negatives_from: dict | None = None) -> list[dict]:
    """``n`` (question in X → its answer sentence in Y) pairs from one fold, X over all questions, Y ≠ X except a
    ``same_share`` of them. ``qid``/``pid`` drop the language, so in-batch translations of the same question or
    answer are masked as false negatives by the trainer. With ``hard_negatives`` > 0 and ``negatives_from``
    (:func:`same_language_negatives`), each pair also carries the other sentences of the answer's paragraph in
    the question's language X as hard negatives (questions whose paragraph has fewer are skipped): the same topic
    and language, not the answer; what a language-biased model ranks above the answer in Y."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        q = rng.choice(fold_qids)
        x = q.split("-")[0]
        answers = sorted(d for d, r in qrels_pool[q].items() if r > 0)
        other = [d for d in answers if not d.startswith(f"{x}-")]
        d = rng.choice([a for a in answers if a.startswith(f"{x}-")] if rng.random() < same_share else other)
        pair = {"query": q_text[q], "positive": doc_text[d], "qid": q.split("-", 1)[1], "pid": d.split("-", 1)[1]}
        if hard_negatives:
            wrong = [s for s in negatives_from[(x, paragraph_of_doc(d))] if s not in qrels_pool[q]]
            if len(wrong) < hard_negatives:  # a one-sentence paragraph: draw another question
                continue
            pair["negatives"] = [doc_text[s] for s in wrong]
            pair["negative_ids"] = [s.split("-", 1)[1] for s in wrong]
        out.append(pair)
    return out


def train_model(tag: str, start: str, pairs: list[dict], args) -> tuple[Path, dict]:
    """Fine-tune ``start`` on ``pairs`` with twotower's Trainer (cached in WORK/<tag>/)."""
    from twotower.io import atomic_write_json
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    run = WORK / tag
    settings = {"start": start, "pairs": len(pairs), "pairs_sha": _sha(pairs),
                "batch": args.batch_size, "lr": args.lr, "temperature": args.temperature,
                "freeze_embeddings": args.freeze_embeddings, "hard_negatives": args.hard_negatives}
    done = run / "done.json"
    if done.is_file() and json.loads(done.read_text())["settings"] == settings:
        log(f"{tag}: trained in an earlier run")
        return run / "train" / "model", json.loads(done.read_text())["info"]
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    with open(run / "pairs.jsonl", "w") as f:
        for p in pairs:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    cfg = TrainConfig(out=str(run / "train"), model=start, attention_dropout=0.0, checkpoint_every=0,
                      freeze_embeddings=args.freeze_embeddings, show_progress=False,
                      stages=[StageConfig(pairs=str(run / "pairs.jsonl"), epochs=1.0, batch_size=args.batch_size,
                                          lr=args.lr, temperature=args.temperature, warmup=0.1,
                                          hard_negatives=args.hard_negatives)])
    log(f"{tag}: training {len(pairs)} pairs from {start}")
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()
    wall = time.perf_counter() - t0
    h = trainer.history
    info = {"train_s": wall, "examples_per_s": h[-1]["examples_per_s"], "steps": len(h),
            "trainable_params": trainable, "loss_first": h[0]["loss"], "loss_last": h[-1]["loss"]}
    atomic_write_json(done, {"settings": settings, "info": info})
    log(f"{tag}: {info}")
    return run / "train" / "model", info


def encode(tag: str, model_dir: Path, doc_ids, doc_text, qids, q_text, args) -> tuple[np.ndarray, np.ndarray]:
    """Full-pool sentence vectors and the held-out questions' vectors of a trained model (cached)."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    folder = WORK / tag / "vectors"
    key = {"model": str(model_dir), "mtime": (model_dir / "twotower.json").stat().st_mtime, "docs": len(doc_ids),
           "qids_sha": _sha(qids)}
    if (folder / "key.json").is_file() and json.loads((folder / "key.json").read_text()) == key:
        return np.load(folder / "docs.npy"), np.load(folder / "queries.npy")
    model = DualEncoder.load(str(model_dir))
    opts = EncodeOptions(precision="auto", batch_size=args.encode_batch, show_progress=False)
    log(f"{tag}: encoding {len(doc_ids)} sentences and {len(qids)} questions")
    t0 = time.perf_counter()
    dv = model.encode_documents(doc_text, opts)
    t1 = time.perf_counter()
    qv = model.encode_queries(q_text, opts)
    log(f"{tag}: sentences {t1 - t0:.0f} s, questions {time.perf_counter() - t1:.0f} s")
    folder.mkdir(parents=True, exist_ok=True)
    _save_npy(folder / "docs.npy", dv)
    _save_npy(folder / "queries.npy", qv)
    (folder / "key.json").write_text(json.dumps(key))
    return dv, qv


# ---------------------------------------------------------------- pseudo-relevance feedback

PRF_DEPTHS, PRF_WEIGHTS = (2, 3, 5, 10), (0.5, 1.0, 2.0, 4.0)


def with_prf(qv, dv, depth: int, weight: float) -> np.ndarray:
    """The query vectors after Rocchio feedback from their ``depth`` best documents (twotower.retrieval.prf)."""
    from twotower.retrieval.prf import moved_queries

    return moved_queries(qv, dv, depth, weight)


def tune_prf(qv, dv, qids, doc_ids, qrels_pool) -> tuple[tuple[int, float], dict]:
    """(depth, weight) with the best full-ranking mAP on ``qids`` (every third, for time): the training fold's
    questions, never the tested ones."""
    d_pos = {d: i for i, d in enumerate(doc_ids)}
    sub = np.arange(0, len(qids), 3)
    rel = [[d_pos[d] for d, r in qrels_pool[qids[i]].items() if r > 0] for i in sub]
    grid = {(0, 0.0): float(full_ranking_ap(qv[sub], dv, rel).mean())}
    for depth in PRF_DEPTHS:
        for weight in PRF_WEIGHTS:
            grid[(depth, weight)] = float(full_ranking_ap(with_prf(qv[sub], dv, depth, weight), dv, rel).mean())
    best = max(grid, key=grid.get)
    return best, {f"{d},{w}": round(v, 4) for (d, w), v in grid.items()}


# ---------------------------------------------------------------- the benchmark

METRIC_KEYS = ("map", "ndcg@10", "same_language@10", "to-en ndcg@10", "to-en recall@100", "mono ndcg@10")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folds", default="A,B", help="folds to train on (each tested on the other): A, B or A,B")
    ap.add_argument("--steps", type=int, default=16, help="fine-tuning steps per fold (pairs = steps x batch)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--temperature", type=float, default=0.01, help="e5 was trained at 0.01")
    ap.add_argument("--same-share", type=float, default=0.1, help="share of pairs with answer in the question's language")
    ap.add_argument("--hard-negatives", type=int, default=0,
                    help="same-language hard negatives per pair: other sentences of the answer's paragraph in the "
                         "question's language (0: in-batch negatives only)")
    ap.add_argument("--prf", action=argparse.BooleanOptionalAction, default=True,
                    help="also rows with dense pseudo-relevance feedback (twotower's --prf-depth/--prf-weight), its "
                         "depth and weight tuned by mAP on the training fold's questions")
    ap.add_argument("--freeze-embeddings", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--encode-batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", default=E5, help="the model to fine-tune (default multilingual-e5-small; e.g. the "
                                                  "output of `twotower models align-languages`)")
    ap.add_argument("--name", default="multilingual_train", help="results/<name>.{json,md,png}")
    args = ap.parse_args()
    t_start = time.perf_counter()

    doc_ids, doc_text, qids, q_text, qrels = _load(0)
    d_langs = np.array([d.split("-")[0] for d in doc_ids])
    dt = dict(zip(doc_ids, doc_text))
    qt = dict(zip(qids, q_text))
    q_pos = {q: i for i, q in enumerate(qids)}
    folds = fold_questions(qids, qrels["pool"])
    log(f"pool: {len(doc_ids)} sentences; fold A {len(folds['A'])} questions, fold B {len(folds['B'])}")
    zd, zq, _ = vectors(E5, doc_ids, doc_text, qids, q_text, "auto", None)

    rows, info, prf = [], {}, {}

    def add(system: str, train: str, test: str, dv, qv, test_qids, variants: bool = True):
        q_langs = np.array([q.split("-")[0] for q in test_qids])
        for suffix, (d2, q2) in (centered_variants(dv, qv, d_langs, q_langs) if variants else {"": (dv, qv)}).items():
            t0 = time.perf_counter()
            m = scores_of(d2, q2, doc_ids, test_qids, qrels, None, d_langs)
            rows.append({"system": system + suffix, "trained_on": train, "tested_on": test,
                         "queries": len(test_qids), **m})
            log(f"{system + suffix} [{train} -> {test}] " + ", ".join(f"{k} {v:.4f}" for k, v in m.items())
                + f" ({time.perf_counter() - t0:.0f} s)")

    add(E5, "-", "all", zd, zq, qids)  # zero-shot on the whole pool: the reference, with centering
    for f in args.folds.split(","):
        test = "B" if f == "A" else "A"
        tq = folds[test]
        add(E5, "-", test, zd, zq[[q_pos[q] for q in tq]], tq)
        if args.prf:
            (depth, weight), prf[f"zero-shot, tuned on {f}"] = tune_prf(zq[[q_pos[q] for q in folds[f]]], zd, folds[f],
                                                                    doc_ids, qrels["pool"])
            log(f"zero-shot PRF tuned on fold {f}: depth {depth}, weight {weight}")
            add(f"{E5} +prf", f, test, zd, with_prf(zq[[q_pos[q] for q in tq]], zd, depth, weight) if depth
                else zq[[q_pos[q] for q in tq]], tq, variants=False)
        pairs = training_pairs(folds[f], qt, dt, qrels["pool"], args.steps * args.batch_size, args.seed + ord(f),
                               args.same_share, args.hard_negatives, same_language_negatives(doc_ids))
        tag = f"{args.name}-{f}"
        model, info[f"finetune_{f}"] = train_model(tag, args.start, pairs, args)
        both = tq + folds[f]  # the tested questions, then the trained-on ones (where PRF is tuned)
        dv, qv = encode(tag, model, doc_ids, doc_text, both, [qt[q] for q in both], args)
        qv, fq = qv[: len(tq)], qv[len(tq):]
        system = (f"{E5} +xling-ft" + (f" hn={args.hard_negatives}" if args.hard_negatives else "")
                  + ("" if args.start == E5 else f" from {Path(args.start).name}"))
        add(system, f, test, dv, qv, tq)
        if args.prf:
            (depth, weight), prf[f"fine-tuned on {f}, tuned on {f}"] = tune_prf(fq, dv, folds[f], doc_ids, qrels["pool"])
            log(f"{tag}: PRF tuned on fold {f}: depth {depth}, weight {weight}")
            add(f"{system} +prf", f, test, dv, with_prf(qv, dv, depth, weight) if depth else qv, tq, variants=False)
    rows += crossfitted(rows)

    extra = {"settings": vars(args), "training": info, "prf_grid": prf, "folds": {f: len(v) for f, v in folds.items()},
             "lareqa_best_map": LAREQA_BEST, "total_s": time.perf_counter() - t_start}
    path = write_results(args.name, rows, notes=notes(rows, extra), extra=extra)
    plot(rows, path.with_suffix(".png"))
    log(f"wrote {path}, .md, .png")


def crossfitted(rows: list[dict]) -> list[dict]:
    """Where a system was tested on both folds (trained on the other): the whole pool, each question scored by the
    model that never saw its article (every metric is a mean over questions, or over languages holding equal
    numbers of questions in each fold, so the whole is the question-weighted mean of the two folds)."""
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        parts = {r["tested_on"]: r for r in rows if r["system"] == system and r["tested_on"] in ("A", "B")}
        if set(parts) != {"A", "B"}:
            continue
        n = parts["A"]["queries"] + parts["B"]["queries"]
        row = {"system": system, "trained_on": "cross-fitted", "tested_on": "all", "queries": n}
        for k in METRIC_KEYS:
            row[k] = (parts["A"][k] * parts["A"]["queries"] + parts["B"][k] * parts["B"]["queries"]) / n
        out.append(row)
    return out


def notes(rows, extra) -> str:
    tr = extra["training"]
    s = extra["settings"]
    lines = [
        "XQuAD-R `pool` (13,090 questions, 13,014 sentences, 11 languages). No training split, so the 240 "
        "paragraphs are cross-fitted: fold A = paragraphs 0–119 "
        f"({extra['folds']['A']} questions), fold B = 120–239 ({extra['folds']['B']}); contiguous blocks of "
        "XQuAD's order, so at most one article straddles the cut (its paragraphs of one fold are trained on, of "
        "the other tested: the same article, never the same paragraph, question or sentence). A model trained on "
        "one fold is tested only on the other fold's questions, against the FULL pool corpus (both folds' sentences). "
        "`map`: average precision over the full ranking of all 13,014 sentences (LAReQA's measure; 11 relevant "
        "each); `same_language@10`: share of the top 10 in the question's language (1/11 of the relevant ones are); "
        "`to-en`: the held-out questions against the 1,180 English sentences; `mono ndcg@10`: mean over the 11 "
        "monolingual sets (held-out questions against their language's sentences). "
        f"LAReQA's best baseline: mAP {extra['lareqa_best_map']}.",
        "",
        "`+xling-ft`: twotower's Trainer (in-batch softmax, both directions) from multilingual-e5-small on "
        f"{s['steps']} x {s['batch_size']} pairs (question in language X -> its answer sentence in language Y, "
        f"X over the fold's questions of all 11 languages, Y != X except a {s['same_share']} share), lr {s['lr']}, "
        f"temperature {s['temperature']}, attention dropout 0, embeddings "
        f"{'frozen (--freeze-embeddings)' if s['freeze_embeddings'] else 'trained'}; the trainer puts `query: ` / "
        "`passage: ` in front as retrieval does. In-batch translations of the same question or answer are masked "
        "as false negatives (qid/pid without the language). "
        + (f"`hn={s['hard_negatives']}`: each pair also carries {s['hard_negatives']} same-language hard "
           "negative(s) per step, drawn from the other sentences of the answer's paragraph in the question's "
           "language (same topic and language, not the answer). " if s.get("hard_negatives") else "")
        + "Contriever crop + MoCo pre-training on the pool sentences is measured in `multilingual_pretrain.md`.",
        "",
        "`center=d` / `center=q`: language-mean centering (Libovický et al. 2020): every sentence vector minus the "
        "mean of its language's sentences, every question minus its language's sentence mean (`d`) or the mean of "
        "its language's test questions (`q`), renormalised. The language is read from the id prefix (oracle "
        "language); no relevance labels are used.",
        "",
        *(["`+prf`: dense pseudo-relevance feedback (`twotower eval|search --prf-depth D --prf-weight W`, "
            "`retrieval.prf`): each question vector moves toward the mean of its D best sentences' vectors, "
            "q' = (q + W·mean)/(1 + W), and searches again. D ∈ {2, 3, 5, 10} and W ∈ {0.5, 1, 2, 4} (or none) are "
            "chosen by mAP on every third question of the TRAINING fold (the fold the row's model was fine-tuned on; "
            "for zero-shot rows the same fold's questions), never on the tested fold. Chosen (depth, weight): "
            + "; ".join(f"{k}: {max(v, key=v.get)}" for k, v in extra["prf_grid"].items()) + ".", ""]
          if extra["prf_grid"] else []),
        "Training: " + "; ".join(f"{k}: {v['steps']} steps, {v['train_s']:.0f} s"
                                 + (f", {v['examples_per_s']:.2f} examples/s, {v['trainable_params']:,} trainable "
                                    f"parameters, loss {v['loss_first']:.3f} -> {v['loss_last']:.3f}"
                                    if "examples_per_s" in v else "") for k, v in tr.items())
        + f". Total wall time {extra['total_s']:.0f} s (CPU shared with other work).",
    ]
    return "\n".join(lines)


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["tested_on"] in ("B", "all")]
    labels = [f"{r['system'].replace(E5, 'e5-small')}\n[{r['trained_on']} -> {r['tested_on']}]" for r in shown]
    fig, axes = plt.subplots(1, 2, figsize=(16, 0.45 * len(shown) + 1.5))
    y = np.arange(len(shown))
    for ax, key in zip(axes, ("map", "same_language@10")):
        ax.barh(y, [r[key] for r in shown])
        ax.set_yticks(y, labels if ax is axes[0] else [""] * len(shown), fontsize=7)
        ax.set_title(f"pool {key}")
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[0].axvline(LAREQA_BEST, color="k", ls="--", lw=1, label=f"LAReQA best {LAREQA_BEST}")
    axes[0].legend(fontsize=8)
    axes[1].axvline(1 / 11, color="k", ls=":", lw=1, label="1/11 (no bias)")
    axes[1].legend(fontsize=8)
    fig.suptitle("XQuAD-R pool, held-out folds: multilingual-e5-small zero-shot, cross-lingual fine-tuning, "
                 "language-mean centering")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
