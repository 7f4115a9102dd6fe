"""Re-ranking an :class:`~twotower.Index`'s hits with a cross-encoder: which one (the one given, the model's fitted
one from ``twotower fit``, or none), loaded once per directory, re-scoring each query's top hits.

Example::

    from twotower.api.reranking import chosen_reranker, cross_encoder, rerank_hits

    rerank, depth, weight = chosen_reranker("my-reranker", 20, mode="dense", fitted=None, store=store)
    ce = cross_encoder(rerank, {}, device="cpu", precision="fp32")
    ranked = rerank_hits(["green tea"], [[("d1", 0.9), ("d2", 0.7)]], ce, depth, weight, store)
"""

from __future__ import annotations

from pathlib import Path


def chosen_reranker(rerank, rerank_depth: int | None, *, mode: str | None, fitted, store):
    """``(rerank, rerank_depth, weight)`` for a search: the fitted re-ranker (``fitted``: the model's
    ``RetrievalDefaults``, its depth and blend weight) when neither ``rerank`` nor ``mode`` is given; ``"none"``
    leaves a fitted one out (None); ``weight`` None unless fitted."""
    weight = None
    if rerank is None and mode is None and fitted is not None and fitted.rerank:
        rerank = fitted.rerank_path(store.manifest["model"]["path"])
        rerank_depth, weight = fitted.rerank_depth, fitted.rerank_weight
    if isinstance(rerank, (str, Path)) and str(rerank) == "none":
        rerank = None
    return rerank, rerank_depth, weight


def cross_encoder(rerank, loaded: dict, *, device: str, precision: str):
    """``rerank`` as a loaded ``Reranker``: itself, or the cross-encoder in that directory, loaded once into
    ``loaded`` (by resolved path) and then reused."""
    from twotower.retrieval.rerank import Reranker

    if isinstance(rerank, Reranker):
        return rerank
    key = str(Path(rerank).resolve())
    if key not in loaded:
        loaded[key] = Reranker(rerank, device=device, precision=precision)
    return loaded[key]


def rerank_hits(queries, ranked, ce, depth: int, weight: float | None, store):
    """Each query's ``depth`` best of ``ranked`` (``[(doc_id, score)]`` per query, best first) re-scored by ``ce``
    on ``"title text"``, best first (blended with the first stage by ``weight`` when fitted)."""
    from twotower.retrieval.rerank import blend

    def text(d: str) -> str:
        doc = store.document(store.row_of[d])
        return f"{doc['title']} {doc['text']}".strip() if doc["title"] else doc["text"]

    out = []
    if hasattr(store, "prefetch"):  # a Milvus index: the documents in one query, not one each
        store.prefetch([d for hits in ranked for d, _ in hits[:depth]])
    for q, hits in zip(queries, ranked):
        top = hits[:depth]
        scores = ce.score([(q, text(d)) for d, _ in top])
        scored = {d: float(s) for (d, _), s in zip(top, scores)}
        if weight is not None:  # the fitted blend with the first stage (retrieval.rerank.blend)
            scored = blend(dict(top), scored, weight)
        out.append(sorted(((d, scored[d]) for d, _ in top), key=lambda kv: -kv[1]))
    return out
