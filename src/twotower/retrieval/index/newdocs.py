"""A batch of new documents with their vectors: what every backend's ``build`` and ``add`` take (the local folder's
:class:`~twotower.retrieval.store.IndexStore` and Milvus' :class:`~twotower.retrieval.milvus.store.MilvusStore`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twotower.data.ids import first_bad_id
from twotower.retrieval.index.errors import DimensionError, IndexStoreError


@dataclass
class NewDocs:
    """Documents to put into an index, with their vectors.

    Single-vector: ``vectors`` is (n, dim). Multi-vector (ME-BERT) or passages: ``offsets`` (n + 1) says which rows
    of ``vectors`` belong to each document; with passages, ``spans`` (rows, 2) holds each row's ``(start, end)``
    character offsets into its document's text (:mod:`twotower.encoders.passages`).
    """

    ids: list[str]
    titles: list[str]
    texts: list[str]
    vectors: np.ndarray
    offsets: np.ndarray | None = None
    metadata: list[dict] | None = None  # one JSON dict per document (checked: data.metadata); None: all empty
    spans: np.ndarray | None = None  # passages: (rows, 2) character offsets into each document's text

    def __post_init__(self) -> None:
        if not (len(self.ids) == len(self.titles) == len(self.texts)):
            raise ValueError(f"{len(self.ids)} ids, {len(self.titles)} titles, {len(self.texts)} texts")
        if self.metadata is not None and len(self.metadata) != len(self.ids):
            raise ValueError(f"{len(self.ids)} ids, {len(self.metadata)} metadata dicts")
        if self.vectors.ndim != 2:
            raise DimensionError(f"vectors must be a 2-d array (rows, dim), got shape {self.vectors.shape}")
        expected = len(self.ids) if self.offsets is None else int(self.offsets[-1])
        if self.offsets is not None and len(self.offsets) != len(self.ids) + 1:
            raise ValueError(f"offsets must have {len(self.ids) + 1} entries, got {len(self.offsets)}")
        if len(self.vectors) != expected:
            raise ValueError(f"{len(self.ids)} documents need {expected} vectors, got {len(self.vectors)}")
        if self.spans is not None:
            if self.offsets is None or self.spans.shape != (len(self.vectors), 2):
                raise ValueError(f"passage spans need offsets and one (start, end) per vector row, got shape "
                                 f"{self.spans.shape} for {len(self.vectors)} rows")
        bad = first_bad_id(self.ids)
        if bad:  # the rule every loader and the service apply (data.ids)
            raise IndexStoreError(f"document id {bad[0]!r} {bad[1]}")
        seen: set[str] = set()
        for doc_id in self.ids:
            if doc_id in seen:
                raise IndexStoreError(f"duplicate document id '{doc_id}' among the new documents")
            seen.add(doc_id)
