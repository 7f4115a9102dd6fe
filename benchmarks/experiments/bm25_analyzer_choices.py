"""The choices behind ``twotower.retrieval.analyzers``, measured on XQuAD-R (NDCG@10, Recall@100):
Chinese and Thai splitting (character n-grams vs a word segmenter), stemming on/off per language, and
``multi``'s script stemmers on the mixed pool. The segmenters are not dependencies of twotower: their rows
appear when jieba / pythainlp are importable (``pip install jieba pythainlp``).

    python benchmarks/experiments/bm25_analyzer_choices.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import bm25s
from bm25s.tokenization import Tokenizer

from twotower.data.beir import BeirDataset
from twotower.evaluation.metrics import evaluate
from twotower.retrieval import analyzers as A
from twotower.retrieval.dense import to_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common.py
from _common import DATA, write_results  # noqa: E402

METRICS = ("ndcg@10", "recall@100")
_HAN = A.regex.compile(r"\p{Han}")


def split_run(ds: BeirDataset, split: Callable[[str], list[str]]) -> dict:
    """BM25 (k1 1.5, b 0.75, Lucene) with ``split`` as the whole analysis (no stopwords): its run."""
    tok = Tokenizer(lower=False, splitter=split, stopwords=[], stemmer=None)
    ids, qids = list(ds.corpus), list(ds.queries)
    bm = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    bm.index(tok.tokenize([ds.corpus[d].full_text for d in ids], return_as="tuple", show_progress=False),
             show_progress=False)
    q = tok.tokenize([ds.queries[x] for x in qids], update_vocab=False, return_as="ids", show_progress=False)
    idx, scores = bm.retrieve(q, k=min(1000, len(ids)), show_progress=False)
    return to_run(qids, ids, scores, idx)


def evaluate_split(ds: BeirDataset, split: Callable[[str], list[str]]) -> dict[str, float]:
    return evaluate(ds.qrels, split_run(ds, split), METRICS)


def paired_p(ds: BeirDataset, run_a: dict, run_b: dict, trials: int = 20000) -> float:
    """Two-sided paired randomization test of the mean per-query NDCG@10 difference (seed 0)."""
    import numpy as np
    import pytrec_eval

    qrels = {q: {d: int(v) for d, v in r.items()} for q, r in ds.qrels.items()}
    per = [pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(r) for r in (run_a, run_b)]
    diff = np.array([per[1][q]["ndcg_cut_10"] - per[0][q]["ndcg_cut_10"] for q in sorted(per[0])])
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=(trials, len(diff)))
    return float((np.abs((signs * diff).mean(1)) >= abs(diff.mean()) - 1e-12).mean())


def evaluate_language(ds: BeirDataset, language: str, **overrides) -> dict[str, float]:
    from twotower.retrieval.bm25 import BM25, BM25Params

    ids, qids = list(ds.corpus), list(ds.queries)
    bm = BM25(BM25Params(language=language, **overrides)).index(ids, [ds.corpus[d].full_text for d in ids],
                                                                 show_progress=False)
    scores, idx = bm.search([ds.queries[x] for x in qids], 1000, show_progress=False)
    return evaluate(ds.qrels, to_run(qids, ids, scores, idx), METRICS)


def runs(chars: Callable[[str], list[str]], unigrams: bool, bigrams: bool) -> Callable[[str], list[str]]:
    """Spaceless runs cut into ``chars`` (code points or grapheme clusters), as uni- and/or bigrams."""
    def split(text: str) -> list[str]:
        out = []
        for m in A._RUNS.finditer(A.normalize(text)):
            run = m["cjk"] or m["sea"]
            if not run:
                out.append(m["word"])
                continue
            c = chars(run)
            grams = (c if unigrams else []) + ([a + b for a, b in zip(c, c[1:])] if bigrams else [])
            out += grams or c
        return out
    return split


def segmenters() -> dict[str, Callable[[str], list[str]]]:
    found = {}
    try:
        import jieba

        jieba.setLogLevel(60)

        def jieba_words(text: str, with_chars: bool = False) -> list[str]:
            out = []
            for token in jieba.lcut(A.normalize(text)):
                if _HAN.search(token):
                    out += [token, *(token if with_chars and len(token) > 1 else [])]
                else:
                    out += A.split_runs(token)
            return out
        found["zh: jieba words"] = jieba_words
        found["zh: jieba words + their characters"] = lambda t: jieba_words(t, True)
    except ImportError:
        pass
    try:
        from pythainlp.tokenize import word_tokenize

        found["th: pythainlp newmm words"] = lambda t: [
            w for w in word_tokenize(A.normalize(t), engine="newmm", keep_whitespace=False) if A.WORD.search(w)]
    except ImportError:
        pass
    return found


def main() -> None:
    rows = []
    data = {name: BeirDataset.load(DATA / "xquad-r" / name, "test") for name in
            ("ar", "de", "el", "es", "hi", "ru", "th", "tr", "zh", "pool")}

    def add(system: str, name: str, fn) -> None:
        t0 = time.perf_counter()
        rows.append({"system": system, "set": name, **fn(), "wall_s": time.perf_counter() - t0})
        print(rows[-1], flush=True)

    code_points, graphemes = list, A._GRAPHEME.findall
    add("zh: character uni+bi-grams (twotower zh)", "zh", lambda: evaluate_language(data["zh"], "zh"))
    add("zh: character unigrams", "zh", lambda: evaluate_split(data["zh"], runs(code_points, True, False)))
    add("zh: character bigrams", "zh", lambda: evaluate_split(data["zh"], runs(code_points, False, True)))
    add("th: grapheme bigrams (twotower th)", "th", lambda: evaluate_language(data["th"], "th"))
    add("th: grapheme uni+bi-grams", "th", lambda: evaluate_split(data["th"], runs(graphemes, True, True)))
    add("th: code-point bigrams", "th", lambda: evaluate_split(data["th"], runs(code_points, False, True)))
    add("th: code-point unigrams", "th", lambda: evaluate_split(data["th"], runs(code_points, True, False)))
    found = segmenters()
    for system, split in found.items():
        name = system[:2]
        add(system, name, lambda: evaluate_split(data[name], split))
    p_value = None
    if "zh: jieba words + their characters" in found:
        p_value = paired_p(data["zh"], split_run(data["zh"], runs(code_points, True, True)),
                           split_run(data["zh"], found["zh: jieba words + their characters"]))
        print("zh: jieba words + their characters vs character uni+bi-grams, paired p =", p_value)
    for name in ("ar", "de", "el", "es", "hi", "ru", "tr"):
        add(f"{name}: Snowball stemmer (twotower {name})", name, lambda: evaluate_language(data[name], name))
        add(f"{name}: no stemmer", name, lambda: evaluate_language(data[name], name, stemmer=""))
    add("pool: multi, stemmed by script (twotower multi)", "pool", lambda: evaluate_language(data["pool"], "multi"))
    add("pool: multi, no stemmer", "pool", lambda: evaluate_language(data["pool"], "multi", stemmer=""))
    add("pool: en (before --language)", "pool", lambda: evaluate_language(data["pool"], "en"))
    notes = ("XQuAD-R test questions (1190 per language; pool: 13,090). Rows without \"twotower\" are "
             "alternatives measured and not taken; the segmenter rows need jieba / pythainlp, not twotower "
             "dependencies.")
    if p_value is not None:
        notes += (f" zh, jieba words + their characters against character uni+bi-grams: paired randomization "
                  f"test over per-query NDCG@10 (20,000 sign flips), p = {p_value:.2f}.")
    write_results("bm25_analyzer_choices", rows, notes=notes, extra={"zh_jieba_vs_ngrams_p": p_value})


if __name__ == "__main__":
    main()
