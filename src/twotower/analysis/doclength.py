"""Length of the documents each retriever puts in its top 10 (GTR §6.4: dense retrievers lean
towards shorter documents than BM25).

For each system (BM25, and a dense retriever per model) the top-10 documents of every query of
the split are retrieved with ``twotower.evaluation.pipeline.run_eval``; the median length of all
retrieved (query, document) entries is reported, in words (whitespace split of title + text) and
in subword tokens of one tokenizer shared by all rows (the first dense model's, else the default
model's; no truncation). The corpus and the judged-relevant documents of the split give reference
medians.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense")


@dataclass
class DocLengthConfig:
    """Settings of :func:`twotower.analyze_doclength` (``twotower analyze doclength``): the BEIR folder and split,
    the retrievers (``bm25``, ``dense``) and dense models compared, and the ``top_k`` documents whose length is
    measured per query (GTR §6.4).

    Example::

        cfg = tt.DocLengthConfig(data="my-beir-dir", retrievers=("bm25", "dense"), top_k=10)
        result = tt.analyze_doclength(cfg, out="analysis")
    """

    data: Path
    split: str = "test"
    retrievers: Sequence[str] = ("bm25", "dense")
    models: Sequence[str | None] = field(default_factory=lambda: [None])  # dense models; None: default
    top_k: int = 10
    batch_size: int | None = None  # None: the device's default
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    show_progress: bool = True


def _tokenizer(model: str | None):
    from transformers import AutoTokenizer

    from twotower.encoders.backbone import read_layout, resolve_model

    return AutoTokenizer.from_pretrained(read_layout(resolve_model(model)).transformer_dir)


def _stats(words: np.ndarray, tokens: np.ndarray) -> dict:
    return {
        "median_words": float(np.median(words)), "mean_words": float(words.mean()),
        "median_tokens": float(np.median(tokens)), "mean_tokens": float(tokens.mean()),
        "entries": int(len(words)),
    }


def run_doclength(cfg: DocLengthConfig) -> dict:
    from twotower.data.beir import BeirDataset
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    bad = [r for r in cfg.retrievers if r not in RETRIEVERS]
    if bad:
        raise TwoTowerError(f"unknown retriever {bad}: choose from {', '.join(RETRIEVERS)}")
    t0 = time.perf_counter()
    ds = BeirDataset.load(cfg.data, cfg.split)
    models = list(cfg.models) or [None]
    tok_model = models[0] if "dense" in cfg.retrievers else None
    tokenizer = _tokenizer(tok_model)
    doc_ids = list(ds.corpus)
    texts = [ds.corpus[d].full_text for d in doc_ids]
    words = {d: len(t.split()) for d, t in zip(doc_ids, texts)}
    enc = tokenizer(texts, add_special_tokens=False, truncation=False, return_attention_mask=False,
                    return_token_type_ids=False, verbose=False)["input_ids"]
    tokens = {d: len(ids) for d, ids in zip(doc_ids, enc)}

    def lengths(ids: list[str]) -> dict:
        return _stats(np.array([words[d] for d in ids], dtype=np.float64),
                      np.array([tokens[d] for d in ids], dtype=np.float64))

    rows = [{"system": "corpus (all documents)", **lengths(doc_ids)}]
    rel = [d for rels in ds.qrels.values() for d, s in rels.items() if s > 0]
    rows.append({"system": f"relevant documents ({cfg.split} qrels)", **lengths(rel)})
    distributions = {}
    systems = [("bm25", None)] if "bm25" in cfg.retrievers else []
    systems += [("dense", m) for m in models] if "dense" in cfg.retrievers else []
    for retriever, model in systems:
        res = run_eval(EvalConfig(data=cfg.data, split=cfg.split, retriever=retriever, model=model,
                                  top_k=cfg.top_k, batch_size=cfg.batch_size, precision=cfg.precision,
                                  device=cfg.device, metrics=("ndcg@10",), show_progress=cfg.show_progress))
        top = [d for ranking in res.run.values()
               for d, _ in sorted(ranking.items(), key=lambda kv: -kv[1])[: cfg.top_k]]
        name = "bm25" if retriever == "bm25" else f"dense: {Path(str(model)).name if model else 'all-MiniLM-L6-v2'}"
        rows.append({"system": name, **lengths(top), "ndcg@10": res.metrics.get("ndcg@10")})
        distributions[name] = [words[d] for d in top]
    cfg_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    cfg_json["models"] = [str(m) if m else None for m in models]
    tok_name = Path(str(tok_model)).name if tok_model else "all-MiniLM-L6-v2"
    return {
        "analysis": "doclength",
        "title": f"Median length of the top-{cfg.top_k} retrieved documents (GTR §6.4)",
        "dataset": Path(cfg.data).name,
        "split": cfg.split,
        "config": cfg_json,
        "num_queries": len(ds.queries),
        "tokenizer": tok_name,
        "rows": rows,
        "distributions_words": distributions,
        "notes": [f"Median over all (query, retrieved document) entries of the top {cfg.top_k}; words = whitespace "
                  f"split of title + text; tokens = {tok_name} subword tokens without special tokens or truncation."],
        "timings": {"total_s": round(time.perf_counter() - t0, 2)},
    }


def plot_doclength(result: dict, out_dir: str | Path) -> list[Path]:
    from twotower.analysis._common import pyplot, save_figure

    plt = pyplot()
    dist = result["distributions_words"]
    refs = {r["system"]: r for r in result["rows"][:2]}
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(dist) + 3), 5))
    names = list(dist)
    if names:
        ax.boxplot([dist[n] for n in names], showfliers=False)
        ax.set_xticks(range(1, len(names) + 1), names)
        for i, n in enumerate(names, start=1):
            med = float(np.median(dist[n]))
            ax.annotate(f"median {med:.0f}", (i, med), textcoords="offset points", xytext=(30, 4), fontsize=9)
    styles = iter([("tab:grey", "--"), ("tab:green", ":")])
    for name, row in refs.items():
        color, ls = next(styles)
        ax.axhline(row["median_words"], color=color, linestyle=ls, label=f"{name}: median {row['median_words']:.0f}")
    ax.set_ylabel("document length (words)")
    ax.set_xlabel("retriever")
    ax.set_title(f"Length of top-{result['config']['top_k']} retrieved documents — "
                 f"{result['dataset']}/{result['split']} ({result['num_queries']} queries)\n"
                 "boxes: quartiles, whiskers: 1.5 IQR")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    return [save_figure(fig, Path(out_dir) / "doclength.png")]


def write_doclength(result: dict, out_dir: str | Path) -> list[Path]:
    from twotower.analysis._common import write_json

    plots = plot_doclength(result, out_dir)
    result["plots"] = [p.name for p in plots]
    return [write_json(Path(out_dir) / "doclength.json", result), *plots]
