"""Random-projection fidelity of BM25 (Luan et al., "Sparse, Dense, and Attentional Representations
for Text Retrieval", §2): how many random dimensions keep BM25's ranking?

BM25 as an inner product. With the Lucene variant that ``twotower.retrieval.bm25.BM25`` (bm25s)
uses, score(q, d) = Σ_t c_t(q) · idf_t · tf_{t,d} / (tf_{t,d} + k1·(1 − b + b·|d|/avgdl)), with
c_t(q) the count of analysed token t in the query and idf_t = ln(1 + (N − df_t + 0.5)/(df_t + 0.5)).
So score(q, d) = ⟨q, d⟩ with

- the query vector q_t = idf_t · c_t(q) (an idf-weighted indicator; repeated query tokens count
  as often as bm25s counts them; terms absent from the collection are dropped, as bm25s drops them);
- the document vector d_t = tf_{t,d} / (tf_{t,d} + k1·(1 − b + b·|d|/avgdl)) (the BM25 term weight).

Both are built here with scipy from the *same tokenization* as our BM25 (bm25s ``Tokenizer``,
English stopwords, Snowball stemmer; |d| counts analysed tokens), so ⟨q, d⟩ reproduces
``BM25.search`` scores (a unit test checks this). Document length L truncates every document to its
first L analysed tokens and recomputes df, idf, |d| and avgdl on the truncated collection.

The normalized margin is μ(q, d1, d2) = ⟨q, d1 − d2⟩ / (‖q‖·‖d1 − d2‖). A random projection
A ∈ R^{k×v} (Gaussian N(0, 1/k) or Rademacher ±1/√k entries) keeps the order of d1 over d2 with
probability ≥ 1 − β once k ≥ 2·(ε²/2 − ε³/3)⁻¹·ln(4/β) (ε = μ); ``bound_k`` computes that bound.

Three measurements:

1. Pairwise accuracy (paper's Figure 2). Pairs (q, d1, d2): d1 = BM25's top-1 document for q,
   d2 = each of BM25's ranks 2 … 1+``pairs_per_query``; full-length documents. Pairs are binned by
   x = (ε²/2 − ε³/3)⁻¹ (log-spaced bins); for each bin the empirical k* is the smallest k on the
   grid (``k_step``, 2·``k_step`` … ``k_max``) from which the fraction of pairs ordered correctly,
   pooled over ``draws`` independent projections, stays ≥ ``target_accuracy`` for every larger k on
   the grid. It is plotted against the bound with β = 1 − ``target_accuracy``.
2. Margins by document length (Figure 3a): for each query, μ(q, d1, d) for every other document d in
   the collection; the r-th smallest (r = 10, 100, 1000) bounds what recall@r can survive. Shown
   against the truncation length L, and (untruncated) against the length of the top-1 document.
3. Recall@r of BM25's top-1 document among all documents after projection, by k and L.

Costs: the projection is never materialised as a k×v matrix. The k dimensions are streamed in
chunks of ``k_chunk``; each chunk draws a v×chunk block once, projects every (truncated) collection
with a sparse @ dense product, and accumulates the projected inner products, whose partial sums at
every grid k give the k-dimensional projection exactly: ⟨A_k q, A_k d⟩ = (1/k)·Σ_{i<k} (g_i·q)(g_i·d).
Collections larger than ``max_docs`` are replaced by a random sample of ``max_docs`` documents.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from twotower.progress import progress_bar

from twotower.analysis.fidelity_report import fidelity_notes, plot_fidelity
from twotower.analysis.fidelity_vectors import (
    PROJECTIONS,
    BM25Vectors,
    bm25_vectors,
    bound_k,
    margin_x,
    margins_to_all,
    normalized_margin,
    projection_block,
    projection_matrix,
)
from twotower.errors import TwoTowerError

# the analysis' names, the formulas' (fidelity_vectors) and the plots' (fidelity_report) included, as before the split
__all__ = ["PROJECTIONS", "BM25Vectors", "FidelityConfig", "bm25_vectors", "bound_k", "margin_x", "margins_to_all",
           "normalized_margin", "plot_fidelity", "projection_block", "projection_matrix", "run_fidelity",
           "write_fidelity"]

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- the experiment


@dataclass
class FidelityConfig:
    """Settings of :func:`twotower.analyze_fidelity` (``twotower analyze fidelity``): the BEIR folder, how many
    queries and documents to sample, the grid of projection sizes k (``k_step`` up to ``k_max``), the projection
    kinds and draws, the document truncation lengths and the pairwise accuracy that defines k* (Luan et al. §2).

    Example::

        cfg = tt.FidelityConfig(data="my-beir-dir", max_queries=100, k_max=1024, recall_ks=(256, 1024))
        result = tt.analyze_fidelity(cfg, out="analysis")
    """

    data: Path
    split: str = "test"
    max_queries: int | None = 500
    max_docs: int = 20000
    pairs_per_query: int = 100
    k_step: int = 32
    k_max: int = 9472
    k_chunk: int = 512
    recall_ks: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 9472)
    recall_at: tuple[int, ...] = (1, 10, 100)
    margin_ranks: tuple[int, ...] = (10, 100, 1000)
    doc_lengths: tuple[int | None, ...] = (16, 32, 64, 128, 256, None)  # None: untruncated
    projections: tuple[str, ...] = PROJECTIONS
    draws: int = 3
    target_accuracy: float = 0.95
    n_bins: int = 16
    min_pairs_per_bin: int = 50
    k1: float = 1.5
    b: float = 0.75
    seed: int = 0
    show_progress: bool = True

    def validate(self) -> None:
        if self.k_step <= 0 or self.k_max % self.k_step:
            from twotower.checks import flag

            raise TwoTowerError(f"{flag('k_max')} ({self.k_max}) must be a positive multiple of {flag('k_step')} "
                                f"({self.k_step})")
        if self.k_chunk % self.k_step:
            raise TwoTowerError(f"k_chunk ({self.k_chunk}) must be a multiple of k_step ({self.k_step})")
        bad = [k for k in self.recall_ks if k % self.k_step or k > self.k_max or k <= 0]
        if bad:
            raise TwoTowerError(f"recall k values {bad} must be multiples of k_step ({self.k_step}) up to k_max")
        for p in self.projections:
            if p not in PROJECTIONS:
                raise TwoTowerError(f"unknown projection '{p}': choose from {', '.join(PROJECTIONS)}")
        if not 0.5 < self.target_accuracy < 1.0:
            raise TwoTowerError(f"target accuracy must be in (0.5, 1), got {self.target_accuracy}")
        if self.draws < 1:
            raise TwoTowerError("draws must be ≥ 1")


def _length_name(length: int | None) -> str:
    return "full" if length is None else str(length)


def _kstar(acc: np.ndarray, grid: np.ndarray, target: float) -> int | None:
    """Smallest grid k from which ``acc`` stays ≥ target (None when it never does up to k_max)."""
    ok = acc >= target
    if not ok[-1]:
        return None
    bad = np.flatnonzero(~ok)
    return int(grid[0] if len(bad) == 0 else grid[bad[-1] + 1])


def run_fidelity(cfg: FidelityConfig) -> dict:
    """Run the three measurements; returns the JSON-ready result (see :func:`write_fidelity`)."""
    from twotower.data.beir import BeirDataset
    from twotower.retrieval.bm25 import BM25, BM25Params

    cfg.validate()
    t_start = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    ds = BeirDataset.load(cfg.data, cfg.split)
    qids = list(ds.queries)
    if cfg.max_queries is not None and len(qids) > cfg.max_queries:
        qids = [qids[i] for i in sorted(rng.choice(len(qids), cfg.max_queries, replace=False))]
    doc_ids = list(ds.corpus)
    sampled_docs = len(doc_ids) > cfg.max_docs
    if sampled_docs:
        doc_ids = [doc_ids[i] for i in sorted(rng.choice(len(doc_ids), cfg.max_docs, replace=False))]
        log.warning("collection sampled: %d of %d documents", cfg.max_docs, len(ds.corpus))

    bm = BM25(BM25Params(k1=cfg.k1, b=cfg.b))
    doc_tokens = bm.tokenizer.tokenize([ds.corpus[d].full_text for d in doc_ids], update_vocab=True,
                                       return_as="ids", show_progress=cfg.show_progress)
    query_tokens = bm.tokenizer.tokenize([ds.queries[q] for q in qids], update_vocab=False,
                                         return_as="ids", show_progress=False)
    vocab_size = len(bm.tokenizer.get_vocab_dict())
    lengths = list(dict.fromkeys(cfg.doc_lengths))
    if None not in lengths:
        lengths.append(None)

    # --- BM25 per document length: top-1, margins to all documents, valid queries
    per_len: dict[str | None, dict] = {}
    for L in progress_bar(lengths, desc="BM25 vectors by length", disable=not cfg.show_progress):
        vecs = bm25_vectors(doc_tokens, query_tokens, vocab_size, k1=cfg.k1, b=cfg.b, max_doc_tokens=L)
        scores = (vecs.queries @ vecs.docs.T).toarray()
        top1 = scores.argmax(axis=1)
        valid = scores[np.arange(len(qids)), top1] > 0
        mu = margins_to_all(vecs, top1, scores)
        per_len[L] = {"vecs": vecs, "scores": scores, "top1": top1, "valid": valid, "mu": mu}

    full = per_len[None]
    valid_q = np.flatnonzero(full["valid"])

    # --- pairs for Figure 2: d1 = top-1, d2 = BM25 ranks 2 … 1+P (full-length documents)
    P = min(cfg.pairs_per_query, len(doc_ids) - 1)
    order = np.argsort(-full["scores"][valid_q], axis=1, kind="stable")[:, : P + 1]
    pair_q = np.repeat(valid_q, P)
    pair_d1 = np.repeat(full["top1"][valid_q], P)
    pair_d2 = order[:, 1:].reshape(-1)
    pair_mu = full["mu"][pair_q, pair_d2]
    # the argmax may differ from the stable sort's first entry only on ties (margin 0): drop those
    keep = np.isfinite(pair_mu) & (pair_mu > 0) & (pair_d2 != pair_d1)
    pair_q, pair_d1, pair_d2, pair_mu = pair_q[keep], pair_d1[keep], pair_d2[keep], pair_mu[keep]
    pair_x = margin_x(pair_mu)

    grid = np.arange(cfg.k_step, cfg.k_max + 1, cfg.k_step)
    n_blocks = len(grid)
    correct = {kind: np.zeros((len(pair_q), n_blocks), dtype=np.int32) for kind in cfg.projections}
    recall_hits = {kind: {_length_name(L): np.zeros((len(cfg.recall_at), len(cfg.recall_ks)), dtype=np.int64)
                          for L in lengths} for kind in cfg.projections}

    bounds = sorted(set(range(cfg.k_chunk, cfg.k_max, cfg.k_chunk)) | set(cfg.recall_ks) | {cfg.k_max})
    starts = [0, *bounds[:-1]]
    at = np.asarray(cfg.recall_at)
    n_valid_by_len = {L: int(per_len[L]["valid"].sum()) for L in lengths}

    t_proj = time.perf_counter()
    total_steps = len(cfg.projections) * cfg.draws * len(bounds)
    bar = progress_bar(total=total_steps, desc="random projections", unit="chunk", disable=not cfg.show_progress)
    try:
        for kind in cfg.projections:
            for draw in range(cfg.draws):
                draw_rng = np.random.default_rng([cfg.seed, PROJECTIONS.index(kind), draw])
                acc_scores = {L: np.zeros(per_len[L]["scores"].shape, dtype=np.float32) for L in lengths}
                running = np.zeros(len(pair_q), dtype=np.float64)
                for a, b_ in zip(starts, bounds):
                    G = projection_block(kind, vocab_size, b_ - a, draw_rng)
                    for L in lengths:
                        st = per_len[L]
                        pq = np.asarray(st["vecs"].queries @ G, dtype=np.float32)
                        pd = np.asarray(st["vecs"].docs @ G, dtype=np.float32)
                        acc_scores[L] += pq @ pd.T
                        if L is None:
                            # pair sums at every k_step inside the chunk
                            prod = pq[pair_q] * (pd[pair_d1] - pd[pair_d2])
                            block = prod.reshape(len(pair_q), -1, cfg.k_step).sum(axis=2, dtype=np.float64)
                            cum = running[:, None] + np.cumsum(block, axis=1)
                            running = cum[:, -1].copy()
                            first = a // cfg.k_step
                            correct[kind][:, first : first + block.shape[1]] += cum > 0
                        if b_ in cfg.recall_ks:
                            ki = cfg.recall_ks.index(b_)
                            s = acc_scores[L]
                            ok = np.flatnonzero(st["valid"])
                            s1 = s[ok, st["top1"][ok]]
                            rank = (s[ok] > s1[:, None]).sum(axis=1) + 1
                            recall_hits[kind][_length_name(L)][:, ki] += (rank[:, None] <= at[None, :]).sum(axis=0)
                    bar.update(1)
    finally:
        bar.close()
    proj_s = time.perf_counter() - t_proj

    # --- Figure 2: bins of x, accuracy by k, empirical k*
    beta = 1.0 - cfg.target_accuracy
    bins: list[dict] = []
    if len(pair_x):
        edges = np.geomspace(pair_x.min(), pair_x.max() * (1 + 1e-9), cfg.n_bins + 1)
        which = np.clip(np.searchsorted(edges, pair_x, side="right") - 1, 0, cfg.n_bins - 1)
        for i in range(cfg.n_bins):
            members = np.flatnonzero(which == i)
            if len(members) < cfg.min_pairs_per_bin:
                continue
            x_med = float(np.median(pair_x[members]))
            row = {
                "x_lo": float(edges[i]), "x_hi": float(edges[i + 1]), "x_median": x_med,
                "eps_median": float(np.median(pair_mu[members])), "pairs": int(len(members)),
                "bound_k": float(2.0 * x_med * math.log(4.0 / beta)),
            }
            for kind in cfg.projections:
                acc = correct[kind][members].sum(axis=0) / (len(members) * cfg.draws)
                row[f"kstar_{kind}"] = _kstar(acc, grid, cfg.target_accuracy)
                row[f"acc_at_kmax_{kind}"] = float(acc[-1])
            bins.append(row)

    fits = {}
    for kind in cfg.projections:
        pts = [(r["x_median"], r[f"kstar_{kind}"]) for r in bins if r[f"kstar_{kind}"] is not None]
        if len(pts) >= 2:
            x, y = np.array(pts, dtype=np.float64).T
            slope = float((x @ y) / (x @ x))
            ss_res = float(((y - slope * x) ** 2).sum())
            ss_tot = float(((y - y.mean()) ** 2).sum())
            fits[kind] = {
                "slope_through_origin": slope,
                "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
                "pearson_r": float(np.corrcoef(x, y)[0, 1]),
                "bins_used": len(pts),
                "bins_censored": sum(1 for r in bins if r[f"kstar_{kind}"] is None),
                "max_kstar_over_bound": float(max(yy / (2 * xx * math.log(4 / beta)) for xx, yy in pts)),
            }
    bound_slope = 2.0 * math.log(4.0 / beta)

    # --- Figure 3a: r-th smallest margins by truncation length and by top-1 length
    def rth_smallest(mu: np.ndarray, rows: np.ndarray) -> dict[str, list]:
        out: dict[str, list] = {}
        for r in cfg.margin_ranks:
            vals = []
            for i in rows:
                m = mu[i][np.isfinite(mu[i])]
                vals.append(float(np.partition(m, r - 1)[r - 1]) if len(m) >= r else float("nan"))
            out[str(r)] = vals
        return out

    margins_by_len = []
    for L in lengths:
        st = per_len[L]
        rows_ok = np.flatnonzero(st["valid"])
        per_r = rth_smallest(st["mu"], rows_ok)
        row: dict = {"doc_length": _length_name(L), "queries": int(len(rows_ok)),
                     "mean_doc_tokens": float(st["vecs"].doc_lengths.mean())}
        for r, vals in per_r.items():
            v = np.asarray(vals)
            v = v[np.isfinite(v)]
            row[f"margin_{r}th_median"] = float(np.median(v)) if len(v) else None
            row[f"margin_{r}th_q25"] = float(np.quantile(v, 0.25)) if len(v) else None
            row[f"margin_{r}th_q75"] = float(np.quantile(v, 0.75)) if len(v) else None
        margins_by_len.append(row)

    top1_len = full["vecs"].doc_lengths[full["top1"][valid_q]]
    per_r_full = rth_smallest(full["mu"], valid_q)
    n_lbins = min(5, max(1, len(valid_q) // 20))
    qedges = np.unique(np.quantile(top1_len, np.linspace(0, 1, n_lbins + 1))) if len(valid_q) else np.array([])
    margins_by_top1_len = []
    if len(qedges) >= 2:
        lb = np.clip(np.searchsorted(qedges, top1_len, side="right") - 1, 0, len(qedges) - 2)
        for i in range(len(qedges) - 1):
            sel = np.flatnonzero(lb == i)
            if not len(sel):
                continue
            row = {"top1_tokens_lo": int(qedges[i]), "top1_tokens_hi": int(qedges[i + 1]),
                   "top1_tokens_median": float(np.median(top1_len[sel])), "queries": int(len(sel))}
            for r, vals in per_r_full.items():
                v = np.asarray(vals)[sel]
                v = v[np.isfinite(v)]
                row[f"margin_{r}th_median"] = float(np.median(v)) if len(v) else None
            margins_by_top1_len.append(row)

    # --- recall@r of BM25's top-1 after projection
    recall_rows = []
    for kind in cfg.projections:
        for L in lengths:
            n = n_valid_by_len[L] * cfg.draws
            hits = recall_hits[kind][_length_name(L)]
            for ki, k in enumerate(cfg.recall_ks):
                row = {"projection": kind, "doc_length": _length_name(L), "k": k}
                for ri, r in enumerate(cfg.recall_at):
                    row[f"recall@{r}"] = float(hits[ri, ki] / n) if n else None
                recall_rows.append(row)

    cfg_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    summary_rows = [
        {"projection": kind, "kstar_slope": f["slope_through_origin"], "bound_slope": bound_slope,
         "r2": f["r2"], "bins_used": f["bins_used"], "bins_censored": f["bins_censored"],
         "max_kstar_over_bound": f["max_kstar_over_bound"]}
        for kind, f in fits.items()
    ]
    return {
        "analysis": "fidelity",
        "title": "Random-projection fidelity of BM25 (Luan et al. §2)",
        "dataset": Path(cfg.data).name,
        "split": cfg.split,
        "config": cfg_json,
        "num_queries": len(qids),
        "num_queries_with_match": int(len(valid_q)),
        "num_docs": len(doc_ids),
        "docs_sampled": sampled_docs,
        "vocab_size": vocab_size,
        "num_pairs": int(len(pair_q)),
        "pair_eps_quantiles": {str(q): float(np.quantile(pair_mu, q)) for q in (0.0, 0.1, 0.5, 0.9, 1.0)}
        if len(pair_mu) else {},
        "bm25_vectors": "scipy, from bm25s tokenization (stopwords en, Snowball english); Lucene BM25: "
                        "q_t = idf_t·count_t(q), d_t = tf/(tf + k1(1 − b + b|d|/avgdl)); ⟨q, d⟩ = bm25s score",
        "beta": beta,
        "bound_slope": bound_slope,
        "kstar_bins": bins,
        "kstar_fit": fits,
        "margins_by_doc_length": margins_by_len,
        "margins_by_top1_length": margins_by_top1_len,
        "recall": recall_rows,
        "rows": summary_rows,
        "tables": {
            "k* by margin bin (x = (ε²/2 − ε³/3)⁻¹; k* None: beyond k_max)": "kstar_bins",
            "r-th smallest margin by truncation length L": "margins_by_doc_length",
            "r-th smallest margin by the top-1 document's length (untruncated)": "margins_by_top1_length",
            "recall of BM25's top-1 after projection": "recall",
        },
        "timings": {"projection_s": round(proj_s, 2), "total_s": round(time.perf_counter() - t_start, 2)},
        "notes": fidelity_notes(fits, margins_by_len, k_max=cfg.k_max, margin_ranks=cfg.margin_ranks,
                                bound_slope=bound_slope),
    }


def write_fidelity(result: dict, out_dir: str | Path) -> list[Path]:
    """Write ``fidelity.json`` and the three PNGs into ``out_dir``; returns their paths."""
    from twotower.analysis._common import write_json

    out_dir = Path(out_dir)
    plots = plot_fidelity(result, out_dir)
    result["plots"] = [p.name for p in plots]
    return [write_json(out_dir / "fidelity.json", result), *plots]
