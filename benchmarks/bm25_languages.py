"""BM25 on XQuAD-R in every language: the English analysis (what twotower did before ``--language``)
against each set's own language and against ``multi``; NDCG@10 and Recall@100, the same evaluation as
``twotower eval --data <set> --retriever bm25 --language <language>``.

    python benchmarks/bm25_languages.py
"""

from __future__ import annotations

import time

from _common import DATA, write_results
from twotower.evaluation.pipeline import EvalConfig, run_eval

SETS = ("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh", "pool", "to-en")
METRICS = ("ndcg@10", "recall@100")


def _eval(name: str, language: str) -> dict[str, float]:
    return run_eval(EvalConfig(data=DATA / "xquad-r" / name, language=language, metrics=METRICS,
                               show_progress=False)).metrics


def main() -> None:
    rows = []
    english = None
    for name in SETS:
        t0 = time.perf_counter()
        language = "multi" if name in ("pool", "to-en") else name
        before, after = _eval(name, "en"), _eval(name, language)
        multi = after if language == "multi" else _eval(name, "multi")
        english = english or (after["ndcg@10"] if name == "en" else _eval("en", "en")["ndcg@10"])
        rows.append({
            "system": f"bm25 {name}", "language": language,
            "ndcg@10 en (before)": before["ndcg@10"], "recall@100 en (before)": before["recall@100"],
            "ndcg@10": after["ndcg@10"], "recall@100": after["recall@100"],
            "ndcg@10 multi": multi["ndcg@10"], "recall@100 multi": multi["recall@100"],
            "ndcg@10 / en set": after["ndcg@10"] / english, "wall_s": time.perf_counter() - t0,
        })
        print(rows[-1], flush=True)
    write_results("bm25_languages", rows, notes=(
        "XQuAD-R (LAReQA): 1190 questions per language against that language's answer sentences; `pool`: "
        "13,090 questions against all 13,014 sentences of the 11 languages (11 relevant each, one per "
        "language: a monolingual lexical match finds at most the one in the question's language, so NDCG@10 "
        "stays low); `to-en`: the same questions against the English sentences. `language`: the analyzer of "
        "the *after* columns (`multi` for the mixed sets). `ndcg@10 / en set`: against English's own "
        "NDCG@10 with `--language en`."))


if __name__ == "__main__":
    main()
