"""How SciFact ranks with passages, on its 809 *train* queries as well as its 300 test queries: truncation
(``passages=False``) against passages of the encoder's window (256 tokens, MaxP: the default), FirstP
(``passage_score="first"``) and passages of 128 tokens (``passage_window=128``), dense and hybrid (λ 0.5, min-max and
z-score), each through ``Index.run`` as users search. Each setting's difference from truncation comes with a paired
bootstrap 95% interval over queries (10,000 resamples), so a test-split change can be told from noise.

Indexes are built once into ``--cache`` (default ``.cache/passage-windows/``, ignored by git) and re-used.

    python benchmarks/passage_windows.py [--settings truncation,max256,first256,max128] [--cache DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402

SETTINGS = {  # name: Index.build options
    "truncation": {"passages": False},
    "max256": {},
    "first256": {"passage_score": "first"},
    "max128": {"passage_window": 128},
}
SYSTEMS = (("dense", {"mode": "dense"}), ("hybrid λ0.5 minmax", {"mode": "hybrid", "lam": 0.5, "norm": "minmax"}),
           ("hybrid λ0.5 zscore", {"mode": "hybrid", "lam": 0.5, "norm": "zscore"}))


def bootstrap(diff, n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A paired bootstrap 95% interval of the mean of per-query differences ``diff``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    means = rng.choice(diff, size=(n, len(diff)), replace=True).mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def paired_delta(scores: dict, base: dict) -> str:
    """The mean per-query difference ``scores − base`` (over ``base``'s queries) with its :func:`bootstrap` interval."""
    import numpy as np

    diff = np.array([scores[q] - base[q] for q in base])
    lo, hi = bootstrap(diff)
    return f"{diff.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--cache", type=Path, default=Path(__file__).resolve().parents[1] / ".cache" / "passage-windows")
    args = parser.parse_args()
    import numpy as np

    import twotower as tt
    from twotower.evaluation.metrics import per_query

    settings = args.settings.split(",")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown or settings[0] != "truncation":
        sys.exit(f"--settings: the first must be truncation (the baseline); known: {', '.join(SETTINGS)}")
    splits = {s: tt.load_beir(DATA / "scifact", split=s) for s in ("train", "test")}
    per: dict = {}
    rows = []
    for name in settings:
        path = args.cache / name
        built, t0 = not path.is_dir(), time.perf_counter()
        index = tt.Index.build(path, splits["test"], bm25=True, show_progress=True, **SETTINGS[name]) if built \
            else tt.Index.open(path)
        build_s = round(time.perf_counter() - t0, 1) if built else None
        info = index.info()
        for system, options in SYSTEMS:
            row = {"setting": name, "system": system, "vectors": info["num_vectors"]}
            for split, data in splits.items():
                queries = {q: data.queries[q] for q in data.qrels}
                scores = per_query(data.qrels, index.run(queries, k=100, **options), ("ndcg@10",))["ndcg@10"]
                per[(name, system, split)] = scores
                row[f"ndcg@10 {split}"] = round(float(np.mean(list(scores.values()))), 4)
                if name != "truncation":
                    row[f"Δ {split} [95% CI]"] = paired_delta(scores, per[("truncation", system, split)])
            row["build_s (this run)"] = build_s
            rows.append(row)
            print(row, flush=True)
    write_results("passage_windows", rows, notes=(
        "SciFact (BEIR, CC BY 4.0): the 5,183 documents indexed once per setting with `tt.Index.build` defaults "
        "(all-MiniLM-L6-v2, flat, BM25, runtime auto) but the setting's option; NDCG@10 on the 809 judged train "
        "queries and on the 300 test queries, each through `Index.run(queries, k=100, mode=..., lam=0.5, norm=...)`. "
        "Δ: the mean per-query difference from truncation with its paired bootstrap 95% interval (10,000 resamples "
        "of the queries). truncation: `passages=False`; max256: passages of the encoder's 256-token window (the "
        "default, MaxP); first256: the same passages, a document scored by its first (`passage_score=\"first\"`); "
        "max128: `passage_window=128`. vectors: rows in the index (truncation: one per document)."))


if __name__ == "__main__":
    main()
