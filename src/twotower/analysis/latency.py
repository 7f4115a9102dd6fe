"""Encoding latency and throughput per model and precision (GTR §8).

- Query latency: one query of exactly ``query_length`` tokens (special tokens included), batch 1,
  through the public path (``encode_texts``: tokenize, forward, pool, normalise, copy to numpy),
  ``warmup`` untimed runs then ``runs`` timed ones; p50 / p95 / mean in milliseconds.
- Document throughput: ``n_docs`` documents (the data set's first ones, or a synthetic text) at
  batch ``doc_batch_size`` and the model's document max length; documents per second.

Precisions: ``fp32`` and ``auto`` (the fast path: bf16 autocast where the CPU has AMX/AVX512-BF16
or the GPU supports bf16; the resolved precision is recorded). On a shared machine latencies
include whatever else runs: the torch thread count is recorded with them.

Models: any ``--model`` accepts (a directory or a registered name such as ``mpnet-base``); each
row records the parameter count and embedding size, so latency by model size (GTR §8) is one run
with ``--model minilm-l6 --model mpnet-base``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from twotower.checks import flag, given
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

_FILLER = ("retrieval of scientific claims needs evidence from abstracts that describe experiments, "
           "cohorts, measurements and their statistical significance in clinical and laboratory settings ")


@dataclass
class LatencyConfig:
    """Settings of :func:`twotower.analyze_latency` (``twotower analyze latency``): the models and precisions
    timed, the query length in tokens, timed and warm-up runs of the batch-1 query, and the documents encoded for
    documents/s (GTR §8).

    Example::

        cfg = tt.LatencyConfig(models=[None, "mpnet-base"], precisions=("fp32", "auto"), runs=50)
        result = tt.analyze_latency(cfg, out="analysis")
    """

    models: Sequence[str | None] = field(default_factory=lambda: [None])
    precisions: Sequence[str] = ("fp32", "auto")
    query_length: int = 128
    runs: int = 100
    warmup: int = 10
    data: Path | None = None
    n_docs: int = 256
    doc_batch_size: int = 64
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    show_progress: bool = True


def text_of_length(tokenizer, n_tokens: int) -> str:
    """A text that the tokenizer turns into at least ``n_tokens`` tokens (truncation cuts it to n)."""
    text = _FILLER
    while len(tokenizer(text, add_special_tokens=True)["input_ids"]) < n_tokens:
        text += _FILLER
    return text


def _percentiles(times_s: list[float]) -> dict:
    ms = np.asarray(times_s) * 1000.0
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "mean_ms": float(ms.mean()), "runs": int(len(ms))}


def run_latency(cfg: LatencyConfig) -> dict:
    import torch

    from twotower.encoders.device import describe, resolve_device
    from twotower.encoders.inference import encode_texts, resolve_precision
    from twotower.encoders.io import max_positions
    from twotower.encoders.towers import DualEncoder

    if cfg.runs < 1 or cfg.query_length < 2:
        raise TwoTowerError(f"latency needs {flag('runs')} ≥ 1 and {flag('query_length')} ≥ 2 (got "
                            f"{given('runs', cfg.runs)}, {given('query_length', cfg.query_length)})")
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]  # other processes on the machine inflate latencies: record them
    docs: list[str] | None = None
    if cfg.data is not None:
        from twotower.data.beir import iter_corpus

        docs = []
        for doc in iter_corpus(Path(cfg.data) / "corpus.jsonl"):
            docs.append(doc.full_text)
            if len(docs) == cfg.n_docs:
                break
    rows = []
    device = resolve_device(cfg.device)
    for name in list(cfg.models) or [None]:
        model = DualEncoder.load(name, device=device)
        label = Path(str(name)).name if name else "all-MiniLM-L6-v2"
        tower = model.query_tower
        positions = max_positions(tower.backbone)
        if positions is not None and cfg.query_length > positions:
            raise TwoTowerError(f"{given('query_length', cfg.query_length)} is more than the {positions} positions "
                                f"of model {label}: give {positions} or less")
        device = next(tower.parameters()).device
        query = text_of_length(tower.tokenizer, cfg.query_length)
        n_tok = len(tower.tokenizer(query, truncation=True, max_length=cfg.query_length)["input_ids"])
        doc_texts = docs or [text_of_length(model.doc_tower.tokenizer, model.doc_max_length)] * cfg.n_docs
        for precision in cfg.precisions:
            resolved = resolve_precision(precision, device)
            times = []
            for i in range(cfg.warmup + cfg.runs):
                t0 = time.perf_counter()
                encode_texts(tower, [query], max_length=cfg.query_length, batch_size=1,
                             precision=precision, show_progress=False)
                if i >= cfg.warmup:
                    times.append(time.perf_counter() - t0)
            encode_texts(model.doc_tower, doc_texts[: cfg.doc_batch_size], max_length=model.doc_max_length,
                         batch_size=cfg.doc_batch_size, precision=precision, show_progress=False)  # warm-up
            t0 = time.perf_counter()
            encode_texts(model.doc_tower, doc_texts, max_length=model.doc_max_length,
                         batch_size=cfg.doc_batch_size, precision=precision, show_progress=cfg.show_progress,
                         desc=f"{label} {precision} docs")
            docs_s = len(doc_texts) / (time.perf_counter() - t0)
            rows.append({"model": label, "precision": precision, "resolved_precision": resolved,
                         "query_tokens": n_tok, **_percentiles(times), "docs_per_s": float(docs_s),
                         "doc_batch_size": cfg.doc_batch_size, "doc_max_length": int(model.doc_max_length),
                         "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                         "dim": int(model.dim)})
            log.info("%s %s: p50 %.2f ms, %.1f docs/s", label, precision, rows[-1]["p50_ms"], docs_s)
    cfg_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    cfg_json["models"] = [str(m) if m else None for m in cfg.models]
    load_end = os.getloadavg()[0]
    return {
        "analysis": "latency",
        "title": f"Batch-1 query latency at {cfg.query_length} tokens and documents/s at batch {cfg.doc_batch_size}",
        "config": cfg_json,
        "device": describe(device),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": {"start": load_start, "end": load_end},
        "doc_source": f"first {cfg.n_docs} documents of {Path(cfg.data).name}" if docs else "synthetic text",
        "rows": rows,
        "notes": [f"p50/p95 over {cfg.runs} runs after {cfg.warmup} warm-up runs, through encode_texts "
                  f"(tokenize + forward + pool + normalise); 'auto' = bf16 (weights cast on CPU) where the hardware has fast "
                  f"bf16 (see resolved_precision). {torch.get_num_threads()} torch threads; 1-minute load average "
                  f"{load_start:.1f} at start, {load_end:.1f} at end"
                  + (" (above the core count: other processes shared the CPU and the times are inflated)."
                     if max(load_start, load_end) > (os.cpu_count() or 1) else ".")] + size_notes(rows),
        "timings": {"total_s": round(time.perf_counter() - t_start, 2)},
    }


def size_notes(rows: list[dict]) -> list[str]:
    """Per model: parameters, p50 per precision and the fast path's speed-up; across models: the
    latency ratio next to the parameter ratio (GTR §8: latency by model size)."""
    notes = []
    models = list(dict.fromkeys(r["model"] for r in rows))
    for name in models:
        mine = {r["precision"]: r for r in rows if r["model"] == name}
        first = next(iter(mine.values()))
        text = f"{name} ({first['params_m']:.1f}M parameters, {first['dim']}-d): batch-1 p50 " + ", ".join(
            f"{r['p50_ms']:.1f} ms {p}" + (f" ({r['resolved_precision']})" if p == "auto" else "")
            for p, r in mine.items())
        if "fp32" in mine and "auto" in mine and mine["auto"]["resolved_precision"] != "fp32":
            text += f"; the fast path is {mine['fp32']['p50_ms'] / mine['auto']['p50_ms']:.2f}× fp32"
        notes.append(text + ".")
    if len(models) > 1:
        small, large = (min(models, key=lambda m: next(r["params_m"] for r in rows if r["model"] == m)),
                        max(models, key=lambda m: next(r["params_m"] for r in rows if r["model"] == m)))
        for precision in dict.fromkeys(r["precision"] for r in rows):
            a = next((r for r in rows if r["model"] == small and r["precision"] == precision), None)
            b = next((r for r in rows if r["model"] == large and r["precision"] == precision), None)
            if a and b and small != large:
                notes.append(f"{large} vs {small} at {precision}: {b['params_m'] / a['params_m']:.1f}× the parameters, "
                             f"{b['p50_ms'] / a['p50_ms']:.1f}× the batch-1 latency, "
                             f"{a['docs_per_s'] / b['docs_per_s']:.1f}× fewer documents/s.")
    return notes


def plot_latency(result: dict, out_dir: str | Path) -> list[Path]:
    from twotower.analysis._common import pyplot, save_figure

    plt = pyplot()
    rows = result["rows"]
    labels = [f"{r['model']} ({r['params_m']:.0f}M)\n{r['precision']}"
              + (f" ({r['resolved_precision']})" if r["precision"] == "auto" else "") for r in rows]
    x = np.arange(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(9, 2.4 * len(rows) * 2), 4.8))
    p50 = [r["p50_ms"] for r in rows]
    p95 = [r["p95_ms"] for r in rows]
    ax1.bar(x - 0.2, p50, width=0.4, label="p50", color="tab:blue")
    ax1.bar(x + 0.2, p95, width=0.4, label="p95", color="tab:orange")
    for xi, v in zip(x, p50):
        ax1.annotate(f"{v:.1f}", (xi - 0.2, v), ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(x, labels, fontsize=8)
    ax1.set_ylabel("milliseconds per query")
    ax1.set_title(f"Batch-1 query latency, {result['config']['query_length']} tokens "
                  f"({result['config']['runs']} runs)")
    ax1.legend()
    ax1.grid(True, axis="y", alpha=0.3)
    dps = [r["docs_per_s"] for r in rows]
    ax2.bar(x, dps, color="tab:green", label=f"batch {result['config']['doc_batch_size']}")
    for xi, v in zip(x, dps):
        ax2.annotate(f"{v:.1f}", (xi, v), ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(x, labels, fontsize=8)
    ax2.set_ylabel("documents per second")
    ax2.set_title(f"Document encoding throughput ({result['doc_source']})", fontsize=10)
    ax2.legend()
    ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Encoding speed on {result['device']} with {result['torch_threads']} threads")
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "latency.png")]


def write_latency(result: dict, out_dir: str | Path) -> list[Path]:
    from twotower.analysis._common import write_json

    plots = plot_latency(result, out_dir)
    result["plots"] = [p.name for p in plots]
    return [write_json(Path(out_dir) / "latency.json", result), *plots]
