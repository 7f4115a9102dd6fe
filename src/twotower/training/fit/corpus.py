"""The corpus as ``fit`` scores it: each document split into passages as an index splits it with the default options
(:func:`twotower.encoders.passages.default_split`: the encoder's window, MaxP), so that fit's dev scores, the
positives' scores behind its margin, its mined negatives and its distillation candidates rank documents as the
index it writes will rank them (issue #52). A corpus of short documents is one vector per document, as before.

Example::

    corpus = CorpusVectors.encode(model, [ds.corpus[d] for d in ids], ids, EncodeOptions())
    scores, rows = corpus.search(query_vectors, k=100)   # documents' rows, best passage's score
    corpus.score(query_vectors[0], rows[0, 0])          # one document's score for one query
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

@dataclass(frozen=True)
class CorpusVectors:
    """A vector per passage; document ``j`` owns ``vectors[offsets[j]:offsets[j + 1]]`` and scores as the best."""

    vectors: np.ndarray
    offsets: np.ndarray

    @classmethod
    def encode(cls, model, docs: Sequence, ids: Sequence[str], opts) -> CorpusVectors:
        """``docs`` (with ``title`` and ``text``) encoded by ``model`` (a DualEncoder) passage by passage."""
        from twotower.encoders.passages import default_split

        split = default_split(model, docs, ids)
        return cls(np.asarray(model.encode_documents(split.texts, opts)), np.asarray(split.offsets, dtype=np.int64))

    @property
    def num_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def single(self) -> bool:
        """Whether every document is one passage (then ``vectors[j]`` is document ``j``'s vector)."""
        return len(self.vectors) == self.num_docs

    def of(self, row: int) -> np.ndarray:
        """Document ``row``'s passage vectors, (passages, dim)."""
        return self.vectors[int(self.offsets[row]):int(self.offsets[row + 1])]

    def score(self, query: np.ndarray, row: int) -> float:
        """Document ``row``'s score for one query vector: its best passage's inner product."""
        return float(np.max(self.of(row) @ query))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's top ``k`` documents, exactly: ``(scores, rows)``, best first (as
        :func:`twotower.retrieval.dense.exact_search`)."""
        from twotower.retrieval.dense import exact_search
        from twotower.retrieval.multivector import exact_multivector_search

        if self.single:
            return exact_search(queries, self.vectors, k)
        return exact_multivector_search(queries, self.vectors, self.offsets, k)

    def save(self, folder: Path) -> None:
        """``vectors.npy`` and ``offsets.npy`` in ``folder``, each written whole or not at all."""
        from twotower.io import atomic_write_bytes

        for name, array in (("doc_vectors.npy", self.vectors), ("doc_offsets.npy", self.offsets)):
            buf = io.BytesIO()
            np.save(buf, array)
            atomic_write_bytes(folder / name, buf.getvalue())

    @classmethod
    def load(cls, folder: Path) -> CorpusVectors | None:
        """What :meth:`save` wrote in ``folder``; None when it is not all there (an older fit kept no offsets)."""
        paths = folder / "doc_vectors.npy", folder / "doc_offsets.npy"
        if not all(p.is_file() for p in paths):
            return None
        return cls(np.load(paths[0]), np.load(paths[1]))
