"""The index backends by name, and opening an index folder with the one its manifest names.

A manifest with ``"backend": "milvus"`` keeps its vectors, documents and BM25 in a Milvus collection
(:class:`~twotower.retrieval.milvus.store.MilvusStore`); any other is a local index folder
(:class:`~twotower.retrieval.store.IndexStore`). Both implement :class:`~twotower.retrieval.store_protocol.Store`;
neither imports this module, so the choice lives here alone.
"""

from __future__ import annotations

from pathlib import Path

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.index.versions import open_live
from twotower.retrieval.store_protocol import Store

BACKENDS = ("faiss", "milvus")  # faiss: the index folder holds everything; milvus: a collection does


def backend_of(manifest: dict) -> str:
    """The backend a version's manifest names (manifests from before backends existed: faiss)."""
    return manifest.get("backend") or "faiss"


def store_class(backend: str) -> type:
    """The :class:`Store` class of ``backend`` (Milvus' imported only when asked for)."""
    if backend == "faiss":
        from twotower.retrieval.store import IndexStore

        return IndexStore
    if backend == "milvus":
        from twotower.retrieval.milvus.store import MilvusStore

        return MilvusStore
    raise IndexStoreError(f"backend {backend!r}: this twotower knows {' and '.join(BACKENDS)}")


def open_store(root: str | Path, *, verify: bool = False) -> Store:
    """The live version of the index folder ``root``, opened by its backend. ``verify``: a local index checks every
    file's sha256 now (a Milvus index checks that the collection is still this index's, always)."""
    from twotower.checks import check_bool

    check_bool(verify, "verify")  # "no" would check every file, 0 would not: a bool, as every flag
    root = Path(root)

    def opened(version_dir: Path, manifest: dict) -> Store:
        backend = backend_of(manifest)
        if backend == "faiss":
            return store_class(backend)(root, version_dir, manifest, verify=verify)
        return store_class(backend)(root, version_dir, manifest)

    return open_live(root, opened)
