"""The fidelity analysis' notes and plots, from the result dict of
:func:`twotower.analysis.fidelity.run_fidelity`: Figure 2 (k* against (ε²/2 − ε³/3)⁻¹), Figure 3a (margins by
document length) and recall@r by k and length."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def fidelity_notes(fits: dict, by_len: list, *, k_max: int, margin_ranks: tuple[int, ...],
                   bound_slope: float) -> list[str]:
    """The result's notes: each projection's empirical k* against the bound (k* beyond ``k_max`` censored), and
    the r-th smallest margins (r in ``margin_ranks``) by truncation length (shrinking with length, or not)."""
    notes = []
    for kind, f in fits.items():
        under = f["max_kstar_over_bound"] <= 1.0
        notes.append(
            f"{kind}: empirical k* ≈ {f['slope_through_origin']:.2f}·x (R² {f['r2']:.3f} over {f['bins_used']} bins, "
            f"{f['bins_censored']} bins beyond k={k_max}); bound slope {bound_slope:.2f}; "
            f"largest k*/bound {f['max_kstar_over_bound']:.3f} — {'under' if under else 'ABOVE'} the bound."
        )
    for r in margin_ranks:
        key = f"margin_{r}th_median"
        seq = [(row["doc_length"], row[key]) for row in by_len if row.get(key) is not None]
        if len(seq) >= 2:
            vals = [v for _, v in seq]
            mono = all(a >= b for a, b in zip(vals, vals[1:]))
            notes.append(
                f"{r}th smallest margin (median over queries) by truncation length: "
                + ", ".join(f"L={n}: {v:.4f}" for n, v in seq)
                + (" — shrinking with length." if mono else " — not monotone in length.")
            )
    return notes


# ----------------------------------------------------------------------------- plots


def plot_fidelity(result: dict, out_dir: str | Path) -> list[Path]:
    """Figure 2 (k* vs. (ε²/2 − ε³/3)⁻¹), Figure 3a (margins by length), recall@r by k and length."""
    from twotower.analysis._common import pyplot, save_figure

    plt = pyplot()
    out_dir = Path(out_dir)
    paths = []
    cfg = result["config"]
    kinds = cfg["projections"]
    bins = result["kstar_bins"]
    styles = {"gaussian": ("tab:blue", "o"), "rademacher": ("tab:orange", "s")}

    fig, ax = plt.subplots(figsize=(7, 5))
    if bins:
        xs = np.array([b["x_median"] for b in bins])
        x_line = np.geomspace(xs.min() * 0.8, xs.max() * 1.25, 100)
        ax.plot(x_line, result["bound_slope"] * x_line, "k--",
                label=f"bound 2·x·ln(4/β), β={result['beta']:.2f}")
        for kind in kinds:
            color, marker = styles.get(kind, ("tab:green", "^"))
            pts = [(b["x_median"], b[f"kstar_{kind}"]) for b in bins if b[f"kstar_{kind}"] is not None]
            cens = [b["x_median"] for b in bins if b[f"kstar_{kind}"] is None]
            if pts:
                px, py = zip(*pts)
                ax.plot(px, py, marker=marker, color=color, linestyle="-", label=f"empirical k*, {kind}")
            if cens:
                ax.scatter(cens, [cfg["k_max"]] * len(cens), marker="^", facecolors="none", edgecolors=color,
                           label=f"{kind}: k* > {cfg['k_max']} (off grid)")
            fit = result["kstar_fit"].get(kind)
            if fit:
                ax.plot(x_line, fit["slope_through_origin"] * x_line, color=color, linestyle=":", linewidth=1,
                        label=f"fit k* = {fit['slope_through_origin']:.2f}·x ({kind})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(cfg["k_max"], color="grey", linewidth=0.5)
    ax.set_xlabel("x = (ε²/2 − ε³/3)⁻¹   (ε: normalized margin, median of bin)")
    ax.set_ylabel(f"k* (smallest k with ≥{cfg['target_accuracy']:.0%} pairwise accuracy)")
    ax.set_title(f"Random projections of BM25: dimension needed vs. margin\n"
                 f"{result['dataset']}/{result['split']}, {result['num_pairs']} pairs (top-1 vs ranks 2–"
                 f"{cfg['pairs_per_query'] + 1}), {cfg['draws']} draws")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    paths.append(save_figure(fig, out_dir / "fidelity_kstar.png"))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    from matplotlib.ticker import ScalarFormatter
    by_len = result["margins_by_doc_length"]
    xlab = [r["doc_length"] for r in by_len]
    xpos = np.arange(len(by_len))
    for r in cfg["margin_ranks"]:
        med = [row.get(f"margin_{r}th_median") for row in by_len]
        lo = [row.get(f"margin_{r}th_q25") for row in by_len]
        hi = [row.get(f"margin_{r}th_q75") for row in by_len]
        ok = [i for i, v in enumerate(med) if v is not None]
        if not ok:
            continue
        line = ax1.plot([xpos[i] for i in ok], [med[i] for i in ok], marker="o", label=f"{r}th smallest")[0]
        ax1.fill_between([xpos[i] for i in ok], [lo[i] for i in ok], [hi[i] for i in ok],
                         color=line.get_color(), alpha=0.15)
    ax1.set_xticks(xpos, [f"{x}\n({row['mean_doc_tokens']:.0f})" for x, row in zip(xlab, by_len)])
    ax1.set_yscale("log")
    _label_margin_axis(ax1, "truncation length L in analysed tokens\n(in brackets: mean tokens per document)",
                       "normalized margin ε (median over queries; band: IQR)", "(a) documents truncated to L tokens")
    by_top1 = result["margins_by_top1_length"]
    for r in cfg["margin_ranks"]:
        pts = [(row["top1_tokens_median"], row[f"margin_{r}th_median"]) for row in by_top1
               if row.get(f"margin_{r}th_median") is not None]
        if pts:
            ax2.plot(*zip(*pts), marker="o", label=f"{r}th smallest")
    _label_margin_axis(ax2, "length of BM25's top-1 document in analysed tokens\n"
                            "(median of a quantile bin of queries)", "normalized margin ε (median over queries)",
                       "(b) untruncated, by the top-1 document's own length")
    ax1.yaxis.set_major_formatter(ScalarFormatter())
    ax1.yaxis.set_minor_formatter(ScalarFormatter())
    ax1.tick_params(axis="y", which="minor", labelsize=7)
    fig.suptitle(f"r-th smallest normalized margin between BM25's top-1 and the other documents"
                 f" — {result['dataset']}/{result['split']}")
    paths.append(save_figure(fig, out_dir / "fidelity_margins.png"))

    recall = result["recall"]
    fig, axes = plt.subplots(len(kinds), len(cfg["recall_at"]), figsize=(4.2 * len(cfg["recall_at"]), 3.6 * len(kinds)),
                             squeeze=False, sharex=True, sharey=True)
    lengths = [row["doc_length"] for row in by_len]
    cmap = plt.get_cmap("viridis")
    for i, kind in enumerate(kinds):
        for j, r in enumerate(cfg["recall_at"]):
            ax = axes[i][j]
            for li, L in enumerate(lengths):
                rows = [row for row in recall if row["projection"] == kind and row["doc_length"] == L]
                ax.plot([row["k"] for row in rows], [row[f"recall@{r}"] for row in rows], marker=".",
                        color=cmap(li / max(1, len(lengths) - 1)), label=f"L={L}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kind}: recall@{r}")
            ax.set_ylim(0, 1.02)
            ax.grid(True, alpha=0.3)
            if i == len(kinds) - 1:
                ax.set_xlabel("projection dimension k")
            if j == 0:
                ax.set_ylabel("BM25 top-1 found in projected top-r")
    axes[0][-1].legend(title="doc length (tokens)", fontsize=8, loc="lower right")
    fig.suptitle(f"Recall of BM25's top-1 after random projection — {result['dataset']}/{result['split']}")
    fig.tight_layout()
    paths.append(save_figure(fig, out_dir / "fidelity_recall.png"))
    return paths


def _label_margin_axis(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, title, a legend of the margin ranks drawn (if any) and the grid of one margins panel."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="margin rank r")
    ax.grid(True, which="both", alpha=0.3)
