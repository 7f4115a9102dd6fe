"""Query vs. document tower spaces (Dong et al., "Exploring Dual Encoder Architectures", Fig. 2).

For each model: embed ``n`` questions with the query tower and ``n`` answers with the document
tower, draw a 2-d t-SNE (scikit-learn) of the 2n points coloured by tower, and measure how
separable the two clouds are with a linear probe: a logistic regression on the full embeddings
(standardised), its 5-fold stratified cross-validated accuracy (0.5 = the towers share one space,
1.0 = linearly separable clouds). The mean cosine of each question with its own answer and the
cosine between the two clouds' centroids are reported too.

Pairs come from every ``qrels/*.tsv`` of the data set (judgements with score > 0), sampled with
distinct questions and distinct answers; when there are fewer than ``n`` such pairs, random
queries and documents fill up the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from twotower.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class TowersConfig:
    """Settings of :func:`twotower.analyze_towers` (``twotower analyze towers``): the BEIR folder whose judged pairs
    give ``n`` questions and answers, the models compared, t-SNE ``perplexity`` and the linear probe's ``folds``.

    Example::

        cfg = tt.TowersConfig(data="my-beir-dir", models=["runs/ade/model", None], n=200)
        result = tt.analyze_towers(cfg, out="analysis")
    """

    data: Path
    models: Sequence[str | None] = field(default_factory=lambda: [None])  # None: the default model
    n: int = 400
    perplexity: float = 30.0
    folds: int = 5
    batch_size: int | None = None  # None: the device's default
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    show_progress: bool = True


def sample_pairs(root: str | Path, n: int, seed: int = 0) -> tuple[list[str], list[str], int]:
    """``n`` question texts and ``n`` answer texts (title + text); returns (queries, docs, judged pairs used)."""
    from twotower.data.beir import load_corpus, load_qrels, load_queries

    root = Path(root)
    qrel_files = sorted((root / "qrels").glob("*.tsv"))
    if not qrel_files:
        raise DataError(root / "qrels", "no qrels/*.tsv files", hint="pass a BEIR-format directory")
    corpus = load_corpus(root / "corpus.jsonl")
    queries = load_queries(root / "queries.jsonl")
    pairs = sorted({(q, d) for f in qrel_files for q, rels in load_qrels(f).items()
                    for d, s in rels.items() if s > 0 and q in queries and d in corpus})
    rng = np.random.default_rng(seed)
    chosen_q: list[str] = []
    chosen_d: list[str] = []
    seen_q: set[str] = set()
    seen_d: set[str] = set()
    for i in rng.permutation(len(pairs)):
        q, d = pairs[i]
        if q in seen_q or d in seen_d:
            continue
        chosen_q.append(q)
        chosen_d.append(d)
        seen_q.add(q)
        seen_d.add(d)
        if len(chosen_q) == n:
            break
    used = len(chosen_q)
    if used < n:
        extra_q = [q for q in queries if q not in seen_q]
        extra_d = [d for d in corpus if d not in seen_d]
        chosen_q += [extra_q[i] for i in rng.permutation(len(extra_q))[: n - used]]
        chosen_d += [extra_d[i] for i in rng.permutation(len(extra_d))[: n - used]]
    if len(chosen_q) < n or len(chosen_d) < n:
        log.warning("%s: only %d queries and %d documents available for n=%d", root, len(chosen_q), len(chosen_d), n)
    return [queries[q] for q in chosen_q], [corpus[d].full_text for d in chosen_d], used


def linear_probe(q_emb: np.ndarray, d_emb: np.ndarray, *, folds: int = 5, seed: int = 0) -> tuple[float, float]:
    """Cross-validated accuracy (mean, std) of a logistic regression telling query from document vectors."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.concatenate([q_emb, d_emb])
    y = np.concatenate([np.zeros(len(q_emb), dtype=int), np.ones(len(d_emb), dtype=int)])
    folds = max(2, min(folds, len(q_emb), len(d_emb)))
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    scores = cross_val_score(clf, X, y, cv=StratifiedKFold(folds, shuffle=True, random_state=seed))
    return float(scores.mean()), float(scores.std())


def tsne_2d(x: np.ndarray, *, perplexity: float = 30.0, seed: int = 0) -> np.ndarray:
    from sklearn.manifold import TSNE

    perplexity = min(perplexity, max(1.0, (len(x) - 1) / 3.0))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x)


def run_towers(cfg: TowersConfig) -> dict:
    from twotower.encoders.device import describe, resolve_device
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    q_texts, d_texts, used = sample_pairs(cfg.data, cfg.n, cfg.seed)
    opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress)
    models = []
    for name in cfg.models:
        model = DualEncoder.load(name, device=device)
        q = model.encode_queries(q_texts, opts)
        d = model.encode_documents(d_texts, opts)
        acc, std = linear_probe(q, d, folds=cfg.folds, seed=cfg.seed)
        xy = tsne_2d(np.concatenate([q, d]), perplexity=cfg.perplexity, seed=cfg.seed)
        qn = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        dn = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
        cq, cd = qn.mean(0), dn.mean(0)
        path = Path(str(name)) if name else None
        # a training run saves its model as RUN/model: name it by the run folder then
        label = (path.parent.name if path.name == "model" else path.name) if path else "all-MiniLM-L6-v2"
        models.append({
            "model": label,
            "path": str(name) if name else None,
            "shared_towers": bool(model.shared),
            "dim": int(q.shape[1]),
            "probe_accuracy": acc,
            "probe_accuracy_std": std,
            "pair_cosine_mean": float((qn[:used] * dn[:used]).sum(1).mean()) if used else None,
            "centroid_cosine": float(cq @ cd / max(np.linalg.norm(cq) * np.linalg.norm(cd), 1e-12)),
            "tsne": xy.round(3).tolist(),
        })
    cfg_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    cfg_json["models"] = [str(m) if m else None for m in cfg.models]
    rows = [{k: m[k] for k in ("model", "shared_towers", "dim", "probe_accuracy", "probe_accuracy_std",
                               "pair_cosine_mean", "centroid_cosine")} for m in models]
    return {
        "analysis": "towers",
        "title": "Query vs. document tower spaces (t-SNE + linear probe)",
        "dataset": Path(cfg.data).name,
        "device": describe(device),
        "config": cfg_json,
        "num_queries": len(q_texts),
        "num_docs": len(d_texts),
        "judged_pairs": used,
        "models": models,
        "rows": rows,
        "notes": [f"{len(q_texts)} questions (query tower) and {len(d_texts)} answers (document tower); {used} are judged "
                  f"question–answer pairs. Probe: logistic regression on standardised embeddings, "
                  f"{cfg.folds}-fold stratified CV accuracy (0.5 = one shared cloud, 1.0 = separable)."],
        "timings": {"total_s": round(time.perf_counter() - t0, 2)},
    }


def plot_towers(result: dict, out_dir: str | Path) -> list[Path]:
    from twotower.analysis._common import pyplot, save_figure

    plt = pyplot()
    models = result["models"]
    n = len(models)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 5.0 * rows), squeeze=False)
    nq = result["num_queries"]
    for ax, m in zip(axes.ravel(), models):
        xy = np.asarray(m["tsne"])
        ax.scatter(xy[:nq, 0], xy[:nq, 1], s=8, alpha=0.7, c="tab:blue", label=f"queries (query tower), n={nq}")
        ax.scatter(xy[nq:, 0], xy[nq:, 1], s=8, alpha=0.7, c="tab:red", marker="^",
                   label=f"answers (document tower), n={len(xy) - nq}")
        kind = "shared towers" if m["shared_towers"] else "separate towers"
        ax.set_title(f"{m['model']} ({kind})\nlinear probe accuracy {m['probe_accuracy']:.3f} ± "
                     f"{m['probe_accuracy_std']:.3f}", fontsize=10)
        ax.set_xlabel("t-SNE dimension 1")
        ax.set_ylabel("t-SNE dimension 2")
        ax.legend(fontsize=8, loc="best", markerscale=2)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    fig.suptitle(f"Query and document embeddings, t-SNE — {result['dataset']}")
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "towers_tsne.png")]


def write_towers(result: dict, out_dir: str | Path) -> list[Path]:
    from twotower.analysis._common import write_json

    plots = plot_towers(result, out_dir)
    result["plots"] = [p.name for p in plots]
    return [write_json(Path(out_dir) / "towers.json", result), *plots]
