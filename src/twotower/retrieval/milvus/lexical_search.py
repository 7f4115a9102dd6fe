"""BM25 searched on a Milvus index's sparse vectors, exact after any writes (:mod:`.lexical` says how): ``store.bm25``
of a :class:`~.store.MilvusStore`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.lexical import SparseBM25

MAX_TOPK = 16_384  # Milvus' largest limit per search


class MilvusBM25:
    """``store.bm25``: twotower's BM25 searched on the collection's sparse vectors (:mod:`.lexical`)."""

    def __init__(self, store, lexicon: SparseBM25) -> None:
        self.store = store
        self.params = lexicon.params
        self.lexicon = lexicon

    @property
    def doc_ids(self) -> list[str]:
        return self.store.doc_ids

    def search(self, queries: Sequence[str], k: int = 1000, *, show_progress: bool = False,
               n_threads: int = 0, expr: str = "") -> tuple[np.ndarray, np.ndarray]:
        """Top-k ``(scores, rows)``, best first, as a fresh local BM25 index over the same documents ranks and scores
        them; a document that shares no term with the query is not returned; with ``expr``
        (:meth:`.store.MilvusStore.filter_expression`) only documents it selects."""
        k = max(1, min(k, len(self.store)))
        terms = self.lexicon.query_terms(queries)
        vectors = self.lexicon.query_vectors(queries, terms)
        if self.lexicon.exact_in_milvus:  # every row weighed with today's avgdl: Milvus' scores are exact
            return self.store._ranked(mc.SPARSE, vectors, k, {"metric_type": "IP"}, expr)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i, found in self._exact(terms, vectors, k, expr).items():
            for j, (score, doc_id) in enumerate(found):
                scores[i, j], rows[i, j] = score, self.store.row_of.intern(doc_id)
        return scores, rows

    def _exact(self, terms: list[list[int]], vectors: list[dict], k: int,
               expr: str) -> dict[int, list[tuple[float, str]]]:
        """The exact top ``k`` of each query (by index): Milvus' best candidates (weighed with older avgdls) scored
        again exactly (:meth:`.lexical.SparseBM25.rescore`), widened until no document beyond them can reach the
        k-th score (:meth:`.lexical.SparseBM25.bound`). Queries go to Milvus 64 at a time."""
        bound, want = self.lexicon.bound(), min(MAX_TOPK, max(2 * k, k + 20))
        pending, out = [i for i, v in enumerate(vectors) if v], {}
        while pending:
            again = []
            for start in range(0, len(pending), 64):
                chunk = pending[start:start + 64]
                with self.store._errors("searching"):
                    found = self.store.client.search(self.store.collection, data=[vectors[i] for i in chunk],
                                                     anns_field=mc.SPARSE, limit=want,
                                                     search_params={"metric_type": "IP"},
                                                     output_fields=["id", mc.SPARSE, "length", "avgdl"],
                                                     filter=self.store._visible(expr))
                for i, hits in zip(chunk, found):
                    scored = sorted(((self.lexicon.rescore(terms[i], dict(h["entity"][mc.SPARSE]),
                                                           int(h["entity"]["length"]), float(h["entity"]["avgdl"])),
                                      h["entity"]["id"]) for h in hits), key=lambda p: (-p[0], p[1]))
                    if len(hits) < want or want >= MAX_TOPK:  # every matching document seen (or Milvus' most)
                        out[i] = [p for p in scored[:k] if p[0] > 0]
                    elif scored[k - 1][0] > float(hits[-1]["distance"]) * bound * (1 + 1e-5):
                        out[i] = scored[:k]  # no document beyond the candidates can reach the k-th score
                    else:
                        again.append(i)
            pending, want = again, min(MAX_TOPK, want * 4)
        return out


__all__ = ["MilvusBM25"]
