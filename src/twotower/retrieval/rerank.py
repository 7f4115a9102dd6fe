"""Cross-encoder re-ranking of the top n of any run, and training such a cross-encoder.

:class:`Reranker` loads any local cross-encoder directory (sentence-transformers ``CrossEncoder``
layout or a plain Hugging Face sequence-classification model with one label) and re-scores each
query's top ``n`` documents; documents below the top ``n`` keep their order under them.

:func:`train_reranker` builds one from a backbone (default all-MiniLM-L6-v2) on a train split:
every judged (query, positive) pair is grouped with ``negatives`` documents mined from BM25's top
``mine_depth`` (judged positives removed), and the model learns to put the positive first with a
softmax cross-entropy over the group (the "localized contrastive estimation" loss of Gao et al.).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from twotower.progress import progress_bar

from twotower.errors import ModelError
from twotower.io import atomic_directory
from twotower.retrieval.hybrid import zscores

log = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]


def _check_has_head(path: Path) -> None:
    """Refuse a plain encoder (its config names e.g. BertModel): loaded as a cross-encoder it would get a randomly
    initialised scoring head and re-rank at random without a word."""
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return  # no readable config: the loader below names the problem
    if architectures and not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ModelError(f"{path}: not a cross-encoder: its config.json names {', '.join(map(str, architectures))}, "
                         "which has no scoring head (a re-ranker would score at random); pass a model trained with "
                         "'twotower train-reranker' or another *ForSequenceClassification model")


def _is_cross_encoder(path: Path) -> bool:
    """``path`` holds a saved cross-encoder: a config.json naming a *ForSequenceClassification architecture, and
    weights beside it (a user's folder with some other config.json is not one, and must not be replaced)."""
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    weights = any((path / name).is_file() for name in ("model.safetensors", "pytorch_model.bin",
                                                        "model.safetensors.index.json", "pytorch_model.bin.index.json"))
    return bool(architectures) and all(str(a).endswith("ForSequenceClassification") for a in architectures) and weights


class Reranker:
    """A cross-encoder scoring (query, document) pairs.

    Example::

        ce = tt.Reranker("my-reranker")  # a directory written by tt.train_reranker
        scores = ce.score([("how is green tea made", "Green tea leaves are steamed.")])
        hits = index.search("how is green tea made", k=10, rerank=ce)
    """

    def __init__(self, model_dir: str | Path, *, max_length: int | None = None, batch_size: int = 32,
                 precision: str = "auto", device: str = "auto") -> None:
        from sentence_transformers import CrossEncoder

        from twotower.encoders.device import resolve_device

        device = str(resolve_device(device))
        path = Path(model_dir)
        if not path.is_dir():
            raise ModelError(f"{path}: cross-encoder directory not found")
        _check_has_head(path)
        try:
            self.model = CrossEncoder(str(path), max_length=max_length, device=device, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: cannot load a cross-encoder ({exc})") from None
        if self.model.num_labels != 1:
            raise ModelError(f"{path}: a re-ranker needs one output label, this model has {self.model.num_labels}")
        self.name = str(model_dir)
        self.batch_size = batch_size
        self.precision = precision

    def score(self, pairs: list[tuple[str, str]], *, show_progress: bool = False) -> np.ndarray:
        from twotower.encoders.inference import autocast_context, resolve_precision

        device = self.model.device
        precision = resolve_precision(self.precision, device)
        # sort by length so that batches pad little, then restore the order
        order = np.argsort([-(len(q) + len(d)) for q, d in pairs], kind="stable")
        with torch.inference_mode(), autocast_context(precision, device):
            scores = self.model.predict([pairs[i] for i in order], batch_size=self.batch_size,
                                        show_progress_bar=show_progress, convert_to_numpy=True)
        out = np.empty(len(pairs), dtype=np.float32)
        out[order] = np.asarray(scores, dtype=np.float32).reshape(-1)
        return out

    def rerank(
        self, run: Run, queries: Mapping[str, str], doc_text: Callable[[str], str], *, top_n: int = 100,
        show_progress: bool = True, weight: float | None = None,
    ) -> Run:
        """Re-score each query's ``top_n`` documents (by the cross-encoder alone, or blended with the run's own
        scores by ``weight``: :func:`blend`); the rest follow below, in their old order."""
        pairs, keys = [], []
        ranked_by_q: dict[str, list[str]] = {}
        for q, docs in run.items():
            ranked = ranking(docs)
            ranked_by_q[q] = ranked
            for d in ranked[:top_n]:
                pairs.append((queries[q], doc_text(d)))
                keys.append((q, d))
        scores = self.score(pairs, show_progress=show_progress)
        out: Run = {q: {} for q in run}
        for (q, d), s in zip(keys, scores):
            out[q][d] = float(s)
        if weight is not None:
            out = {q: blend(run[q], ce, weight) for q, ce in out.items()}
        for q, ranked in ranked_by_q.items():
            floor = min(out[q].values(), default=0.0)
            for i, d in enumerate(ranked[top_n:], start=1):
                out[q][d] = floor - i  # below every re-scored document, old order kept
        return out


def ranking(docs: Mapping[str, float]) -> list[str]:
    """One query's documents best first, ties by id: the order whose head :meth:`Reranker.rerank` re-scores."""
    return [d for d, _ in sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))]


def blend(first: Mapping[str, float], ce: Mapping[str, float], weight: float) -> dict[str, float]:
    """One query's re-scored documents (the keys of ``ce``) by ``weight``·z(cross-encoder) + (1 − ``weight``)·z(first
    stage), each z-scored over those documents: a cross-encoder too weak to rank alone can still correct the first
    stage (1: the cross-encoder alone)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"re-ranker weight must be in [0, 1], got {weight}")
    if weight == 1.0:
        return dict(ce)
    zc, zf = zscores(ce), zscores({d: first[d] for d in ce})
    return {d: weight * zc[d] + (1.0 - weight) * zf[d] for d in ce}


@dataclass
class RerankerTrainConfig:
    """Settings of :func:`twotower.train_reranker` (``twotower train-reranker``): BM25-mined ``negatives`` per
    judged positive from the top ``mine_depth``, epochs, (query, positive) groups per step, learning rate and
    warm-up, the pair's max length in tokens.

    Example::

        cfg = tt.RerankerTrainConfig(epochs=1, negatives=2, max_queries=100)
        stats = tt.train_reranker("my-beir-dir", "my-reranker", config=cfg)
    """

    negatives: int = 3
    mine_depth: int = 30
    epochs: int = 4  # SciFact train: 1 epoch at 3e-5 left the loss at chance (1.385 → 1.356), 4 at 1e-4 → 0.092
    batch_queries: int = 8  # groups per step: batch_queries × (1 + negatives) pairs
    lr: float = 1e-4
    warmup: float = 0.1
    max_length: int = 192
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    max_queries: int | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        from twotower.checks import check_number

        check_number(self.lr, "lr", above=0, hint="the learning rate; default 1e-4")
        check_number(self.warmup, "warmup", minimum=0, maximum=1, hint="a fraction of the steps")
        for key, least in (("negatives", 1), ("mine_depth", 2), ("epochs", 1), ("batch_queries", 1),
                           ("max_length", 16)):
            check_number(getattr(self, key), key, integer=True, minimum=least)
        check_number(self.seed, "seed", integer=True, minimum=0, maximum=2**32 - 1)
        check_number(self.max_queries, "max_queries", integer=True, minimum=1, optional=True)


def mine_negatives(
    queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]], doc_ids: list[str], doc_texts: list[str],
    *, depth: int = 30, show_progress: bool = True,
) -> dict[str, list[str]]:
    """BM25's top ``depth`` for each judged query, its judged documents removed."""
    from twotower.retrieval.bm25 import BM25

    bm25 = BM25().index(doc_ids, doc_texts, show_progress=show_progress)
    qids = [q for q in qrels if q in queries]
    _, idx = bm25.search([queries[q] for q in qids], depth, show_progress=show_progress)
    return {q: [doc_ids[j] for j in row if qrels[q].get(doc_ids[j], 0) <= 0] for q, row in zip(qids, idx)}


def train_reranker(
    data: str | Path, out: str | Path, *, base: str | None = None, split: str = "train",
    cfg: RerankerTrainConfig | None = None, query_ids: set[str] | None = None,
) -> dict:
    """Train a cross-encoder on ``data``'s ``split`` qrels (only ``query_ids`` of them when given, e.g. to keep
    a dev part out) and save it to ``out``; returns stats."""
    from sentence_transformers import CrossEncoder
    from transformers import get_linear_schedule_with_warmup

    from twotower.data.beir import BeirDataset
    from twotower.encoders.backbone import read_layout, resolve_model
    from twotower.encoders.device import describe, resolve_device
    from twotower.encoders.inference import autocast_context, resolve_precision

    from twotower.checks import given, option_name

    cfg = cfg or RerankerTrainConfig()
    if split == "test":
        raise ModelError(f"{given('split', split)}: a re-ranker trained on the test judgements would be evaluated on "
                         "what it learned; train on another split (train, dev)")
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not _is_cross_encoder(out):
        raise ModelError(f"{option_name('out')} {out} is a folder holding other files, not a cross-encoder (its "
                         "config.json naming a *ForSequenceClassification model, and its weights): training would "
                         "replace it whole; give a new folder (or a previous re-ranker's, to replace it)")
    target = resolve_device(cfg.device)
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    ds = BeirDataset.load(data, split)
    if query_ids is not None:
        ds.qrels = {q: rels for q, rels in ds.qrels.items() if q in query_ids}
        ds.queries = {q: t for q, t in ds.queries.items() if q in ds.qrels}
    doc_ids = list(ds.corpus)
    texts = {d: ds.corpus[d].full_text for d in doc_ids}
    negs = mine_negatives(ds.queries, ds.qrels, doc_ids, [texts[d] for d in doc_ids], depth=cfg.mine_depth,
                          show_progress=cfg.show_progress)
    groups = []
    for q, rels in ds.qrels.items():
        pool = negs.get(q, [])
        if not pool:
            continue
        for d, rel in rels.items():
            if rel > 0:
                groups.append((q, d, pool))
    if cfg.max_queries:
        rng.shuffle(groups)
        groups = groups[: cfg.max_queries]
    if not groups:
        raise ModelError(f"{data}: no judged positives with mined negatives in split '{split}'")

    transformer_dir = read_layout(resolve_model(base)).transformer_dir
    ce = CrossEncoder(transformer_dir, num_labels=1, max_length=cfg.max_length, local_files_only=True,
                      device=str(target))
    model, tok = ce.model, ce.tokenizer
    model.train()
    device = next(model.parameters()).device
    precision = resolve_precision(cfg.precision, device)
    steps = cfg.epochs * ((len(groups) + cfg.batch_queries - 1) // cfg.batch_queries)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(optim, int(cfg.warmup * steps), steps)
    group_size = 1 + cfg.negatives
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = progress_bar(total=steps, desc="training re-ranker", disable=not cfg.show_progress)
    for _ in range(cfg.epochs):
        rng.shuffle(groups)
        for b in range(0, len(groups), cfg.batch_queries):
            batch = groups[b : b + cfg.batch_queries]
            pairs = []
            for q, pos, pool in batch:
                chosen = rng.sample(pool, min(cfg.negatives, len(pool)))
                chosen += [rng.choice(pool) for _ in range(cfg.negatives - len(chosen))]
                pairs += [(ds.queries[q], texts[pos])] + [(ds.queries[q], texts[n]) for n in chosen]
            enc = tok([p[0] for p in pairs], [p[1] for p in pairs], padding=True, truncation="only_second",
                      max_length=cfg.max_length, return_tensors="pt").to(device)
            with autocast_context(precision, device):
                logits = model(**enc).logits.float().view(len(batch), group_size)
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long, device=device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            bar.update(1)
            if len(losses) % 10 == 0:  # one host synchronisation per 10 steps, not per step
                bar.set_postfix(loss=f"{torch.stack(losses[-20:]).float().mean().item():.3f}")
    bar.close()
    losses = torch.stack(losses).float().cpu().tolist()
    model.eval()
    from twotower.encoders.backbone import quiet_transformers

    with atomic_directory(out) as tmp, quiet_transformers():  # no "Writing model shards" bar; atomic: a model
        ce.save(str(tmp))                                        # stays at ``out`` except between two renames
    return {"groups": len(groups), "steps": steps, "pairs_per_step": cfg.batch_queries * group_size,
            "train_s": round(time.perf_counter() - t0, 1), "first_loss": round(float(np.mean(losses[:10])), 4),
            "last_loss": round(float(np.mean(losses[-10:])), 4), "device": describe(target)}
