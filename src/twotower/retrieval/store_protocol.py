"""What an index backend offers: the :class:`Store` protocol.

Two backends implement it side by side: :class:`twotower.retrieval.store.IndexStore` (vectors, documents, FAISS and
BM25 in the index folder) and :class:`twotower.retrieval.milvus.store.MilvusStore` (all of it in a Milvus
collection; the folder names it). Neither imports the other: they share the batch of new documents
(:class:`~twotower.retrieval.index.newdocs.NewDocs`) and the folder's versions
(:mod:`twotower.retrieval.index.versions`), and :mod:`twotower.retrieval.backends` picks one by the manifest. The
Searcher, the API and the service are written against this protocol.

A store is one immutable version: reads see that version; ``add`` / ``remove`` return the new version's store and
leave this one usable; ``refresh`` moves to the live version. Rows are the numbers searches speak in: ``doc_ids[row]``
is a row's id, ``row_of[id]`` an id's row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from twotower.retrieval.index.newdocs import NewDocs


class Store(Protocol):
    """One version of an index (see the module's docstring)."""

    root: Path
    manifest: dict
    doc_ids: Sequence[str]
    row_of: Mapping[str, int]

    @classmethod
    def open(cls, root: str | Path) -> "Store":
        """The live version of the index folder ``root``."""
        ...

    @classmethod
    def build(cls, root: str | Path, docs: NewDocs, *, model: dict, spec: Any = None, keep: int = 2,
              show_progress: bool = True) -> "Store":
        """Write ``docs`` as the index at ``root`` (new, or a new version replacing its content)."""
        ...

    @property
    def version(self) -> str: ...

    def __len__(self) -> int: ...

    def refresh(self) -> "Store": ...

    def close(self) -> None: ...

    def add(self, docs: NewDocs, *, replace: bool = False, keep: int = 2, show_progress: bool = True) -> "Store":
        """A new version with ``docs`` added (ids already held are an error unless ``replace``)."""
        ...

    def remove(self, ids: Sequence[str], *, keep: int = 2, show_progress: bool = True) -> "Store":
        """A new version without ``ids`` (unknown ids are an error)."""
        ...

    def search(self, queries: np.ndarray, k: int = 10, **options) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores, rows)`` per query vector, best first (row -1 / score -inf where fewer)."""
        ...

    def existing(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` the store holds (batched: no round trip per id)."""

    def rows(self, ids: Sequence[str]) -> list[int]: ...

    def document(self, row: int) -> dict: ...

    def documents(self, ids: Sequence[str]) -> list[dict]:
        """``{"_id", "title", "text"[, "metadata"]}`` of each of ``ids`` (unknown ids are an error)."""
        ...

    def info(self) -> dict:
        """The manifest, with ``backend`` and ``live_version``."""
        ...
