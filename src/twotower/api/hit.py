"""A search result as the API hands it out: :class:`Hit`, with the passage of its document that matched.

Example::

    from twotower.api.hit import hits_of

    hits = hits_of(store, [("d1", 0.83)], "green tea", query_vector, 1)
    print(hits[0].passage.text)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Hit", "hits_of"]


@dataclass
class Hit:
    """One search result: the document's ``id``, its ``score`` (higher is better), ``title``, ``text``,
    ``metadata`` (the document's metadata exactly as it was given, any key included, ``{}`` when it has none) and
    ``passages``: the part of the text that matched, best first (a :class:`~twotower.retrieval.passages.Passage`:
    ``text``, ``start``, ``end`` with ``hit.text[start:end] == passage.text``, ``score``). A long document split into
    passages scores as its best passage; a short one's passage is its whole text.

    Example::

        hit = index.search("green tea", k=1)[0]
        print(hit.id, round(hit.score, 3), hit.title, hit.metadata, hit.document)
        print(hit.passage.text, hit.passage.start, hit.passage.end)
    """

    id: str
    score: float
    title: str
    text: str
    metadata: dict = field(default_factory=dict)
    passages: list = field(default_factory=list)

    @property
    def passage(self):
        """The best passage (``passages[0]``), or None when the hit carries none."""
        return self.passages[0] if self.passages else None

    @property
    def document(self) -> dict:
        """``{"_id", "title", "text", **metadata}``, the flat form of a BEIR corpus (:meth:`Index.add` takes it back);
        a :class:`~twotower.DataError` naming the key when the metadata holds ``_id``, ``id``, ``title`` or ``text``,
        which the flat form cannot tell apart from the document's own (use ``id``, ``text``, ``metadata``)."""
        from twotower.data.metadata import flat_document

        return flat_document(self.id, self.title, self.text, self.metadata, f"hit {self.id!r}")


def hits_of(store, ranked: list[tuple[str, float]], query: str, query_vector: np.ndarray | None,
            passages: int = 1, lexical: float = 0.0) -> list[Hit]:
    """:class:`Hit` objects for one query's ``ranked`` ``(id, score)`` pairs over ``store`` (one version), each with
    its ``passages`` best passages, ranked by ``query_vector`` (as the search encoded it) or, without one, by the
    words of ``query``; ``lexical`` > 0 (a hybrid search's BM25 weight): by both
    (:func:`twotower.retrieval.passages.best_passages`)."""
    from twotower.retrieval.passages import ranked_passages

    found = ranked_passages(store, ranked, query, query_vector, n=passages, lexical=lexical)
    return [Hit(d, float(s), doc["title"], doc["text"], doc.get("metadata") or {}, p)
            for (d, s), (doc, p) in zip(ranked, found)]



def passage_query_vectors(searcher, store, mode: str, filter, queries: list[str]) -> np.ndarray | None:
    """The queries' vectors, encoded once for both the search and each hit's best passage, when ``store`` keeps
    passages and ``mode`` encodes queries (a bad ``filter`` fails first, before any encoding); else None."""
    if mode == "bm25" or not getattr(store, "passages", None):
        return None
    from twotower.retrieval.searcher import restriction

    restriction(store, filter)
    return searcher.encode_queries(queries)
