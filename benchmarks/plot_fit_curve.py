"""The learning curve of `twotower fit` on SciFact as a picture: test NDCG@10 of `fit` and of the best zero-shot
retriever against the number of judged training queries, from results/fit_learning_curve.json (N of SciFact's train
queries, ``benchmarks/fit_collections.py --collection scifact --train-queries N --name fit_learning_curve``) and, for
all 809, results/fit_scifact.json (``benchmarks/fit_scifact.py``). Writes results/fit_learning_curve.png.

    python benchmarks/plot_fit_curve.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS

LABEL = {"zeroshot": "zero-shot", "finetune": "fine-tuned", "retrain": "retrained", "refine": "third round"}  # the model fit chose


def points() -> list[tuple[int, float, float, str]]:
    """(training queries, fit, best zero-shot, what fit chose) per size, smallest first."""
    curve = json.loads((RESULTS / "fit_learning_curve.json").read_text())["rows"]
    out = [(r["train_queries"], r["fit"], r["best zero-shot"], r["fit chose"].split()[0])
           for r in curve if r["collection"] == "scifact"]
    full = RESULTS / "fit_scifact.json"
    if full.is_file():
        d = json.loads(full.read_text())
        rows = {r["system"]: r["ndcg@10"] for r in d["rows"]}
        zero = max(rows["bm25"], rows["zero-shot dense"], rows["zero-shot hybrid λ 0.5"])
        out.append((809, rows["twotower fit"], zero, d["fit"]["choices"]["model"]))
    return sorted(out)


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points()
    n = [p[0] for p in pts]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(n, [p[2] for p in pts], "o--", color="grey", label="best zero-shot (BM25, dense, hybrid λ 0.5; oracle)")
    ax.plot(n, [p[1] for p in pts], "o-", color="tab:blue", label="twotower fit")
    for x, y, _, chose in pts:
        ax.annotate(LABEL.get(chose, chose), (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    ax.margins(y=0.15)  # room for the labels above the points
    ax.set_xscale("log")
    ax.set_xticks(n, [str(x) for x in n])
    ax.minorticks_off()
    ax.set_xlabel("judged training queries (SciFact train)")
    ax.set_ylabel("NDCG@10 on the 300 test queries")
    ax.set_title("fit's learning curve: all-MiniLM-L6-v2, 2 CPU cores", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(RESULTS / "fit_learning_curve.png")
    print(RESULTS / "fit_learning_curve.png", pts)


if __name__ == "__main__":
    main()
