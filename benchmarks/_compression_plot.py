"""compression_scifact's figure: NDCG@10 against bytes per document in RAM, in two panels.

Left, one set of vectors (zero-shot all-MiniLM-L6-v2) stored each way (uncut; the cuts are in the table), beside sentence-transformers' rows on the
same vectors. Right, the fine-tuned models: each model's vectors cut to 384 / 192 / 96 / 48 dimensions as one line
(Matryoshka against plain), the Matryoshka model's 96-d vectors also in int8 and binary, and ME-BERT's m vectors."""

from __future__ import annotations

import math
import re
from pathlib import Path

CUT = re.compile(r"^(?P<model>.+?) fp32(?: cut to (?P<dim>\d+))?$")


def _labels(ax, points: list[tuple[float, float, str]], step: float) -> None:
    """Annotate points; points at the same x whose scores lie within ``step`` (data units) of each other are
    labelled as a column ``step`` apart around their mean, with a line to each point, so that they do not
    overprint."""
    by_x: dict[float, list[tuple[float, float, str]]] = {}
    for x, y, text in points:
        by_x.setdefault(round(math.log2(x), 1), []).append((x, y, text))
    for items in by_x.values():
        x = items[0][0]
        items = [(y, text) for _, y, text in items]
        items.sort(reverse=True)
        clusters: list[list[tuple[float, str]]] = []
        for y, text in items:
            if clusters and clusters[-1][-1][0] - y < step:
                clusters[-1].append((y, text))
            else:
                clusters.append([(y, text)])
        for cluster in clusters:
            mid = sum(y for y, _ in cluster) / len(cluster)
            for i, (y, text) in enumerate(cluster):
                ty = mid + step * ((len(cluster) - 1) / 2 - i)
                ax.annotate(text, (x, y), xytext=(x * 1.12, ty), fontsize=7, va="center",
                            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5} if len(cluster) > 1 else None)


def _storage_panel(ax, rows: list[dict]) -> None:
    points = []
    for r in rows:
        if r["group"] not in ("zero-shot", "peer") or " cut to " in r["system"]:
            continue
        peer = r["group"] == "peer"
        ax.scatter(r["ram_bytes_per_doc"], r["ndcg@10"], marker="s" if peer else "o",
                   color="tab:red" if peer else "tab:blue", zorder=3)
        points.append((r["ram_bytes_per_doc"], r["ndcg@10"],
                       r["system"].replace("sentence-transformers", "ST").replace(" rescoring", "")
                       .replace("float query x int8 codes", "query x codes")))
    ax.set_ylim(0.56, 0.66)
    ax.set_xlim(32, 4096)
    _labels(ax, points, 0.0045)
    ax.scatter([], [], marker="o", color="tab:blue", label="twotower (--vectors, --kind ivfpq)")
    ax.scatter([], [], marker="s", color="tab:red", label="sentence-transformers, same vectors")
    ax.set_title("Zero-shot all-MiniLM-L6-v2: one set of vectors, stored each way", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")


def _finetuned_panel(ax, rows: list[dict]) -> None:
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        m = CUT.match(r["system"])
        if m and "fine-tuned" in r["group"] and "ME-BERT" not in r["group"] and "docs)" not in r["system"]:
            lines.setdefault(m["model"], []).append((r["ram_bytes_per_doc"], r["ndcg@10"]))
    for model, pts in lines.items():
        pts.sort()
        mrl = model.startswith("matryoshka")
        style = "-" if "4 epochs" in model else ("--" if "weights" not in model else ":")
        ax.plot(*zip(*pts), style, marker="^" if mrl else "D", markersize=5,
                color=("darkgreen" if "4 epochs" in model else "tab:olive" if "weights" in model else "tab:green")
                if mrl else ("black" if "4 epochs" in model else "tab:gray"), label=f"{model} (fp32, cut)")
    for r in rows:
        mebert = r["group"].startswith("ME-BERT")
        if "fine-tuned" in r["group"] and (mebert or not CUT.match(r["system"])) and "docs)" not in r["system"]:
            ax.scatter(r["ram_bytes_per_doc"], r["ndcg@10"], marker="P" if mebert else "*", s=70 if mebert else 90,
                       color="tab:purple" if mebert else "darkgreen", zorder=3)
            label = (r["system"].replace("matryoshka fine-tuned", "MRL").replace(", 4 epochs", " 4 ep")
                     .replace(" fine-tuned", "").replace(" rescoring", "").replace(" cut to ", ", "))
            ax.annotate(label + (" d" if not mebert else ""), (r["ram_bytes_per_doc"], r["ndcg@10"]), fontsize=7,
                        textcoords="offset points", xytext=(-4, 6), ha="right" if mebert else "left")
    ax.set_title("Fine-tuned on SciFact train: Matryoshka vs plain, cut with --dim", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 6.5))
    _storage_panel(axes[0], rows)
    _finetuned_panel(axes[1], rows)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per document held in RAM (FAISS index)")
        ax.set_ylabel("SciFact test NDCG@10")
        ax.grid(alpha=0.3)
    fig.suptitle("Compressed vectors: quality against memory (SciFact test, 300 queries, whole corpus)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
