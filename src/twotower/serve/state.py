"""The service's state: its input limits, the searcher over the live index version, and the locks that keep reads
and writes consistent (one immutable version per request, writes serialized). No HTTP here: serve.app maps this
onto endpoints, and the errors below onto status codes (and an embedding of your own that fails while a request uses
it, :class:`~twotower.encoders.external.EmbeddingFailed`, onto 502)."""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from twotower.errors import TwoTowerError

from twotower.data.ids import MAX_TEXT_CHARS
from twotower.encoders.external import EmbeddingFailed, embedding_errors  # noqa: F401  (EmbeddingFailed: serve.app)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeLimits:
    """Input limits; requests over them get a 4xx, never reach the model."""

    max_query_chars: int = 2048
    max_k: int = 1000
    max_batch_queries: int = 64
    max_docs_per_request: int = 256
    max_id_chars: int = 1024  # characters; the id rule (data.ids.MAX_ID_BYTES) also bounds its UTF-8 bytes
    max_title_chars: int = 2048
    max_text_chars: int = MAX_TEXT_CHARS  # as Python's (data.ids): a document of any length up to it
    max_body_bytes: int = 32 * 1024 * 1024  # room for one document at that limit (its JSON can be longer)

    def __post_init__(self) -> None:
        from twotower.checks import check_number

        check_number(self.max_k, "max_k", integer=True, minimum=1, maximum=1_000_000)
        check_number(self.max_batch_queries, "max_batch", integer=True, minimum=1, maximum=100_000)
        check_number(self.max_body_bytes, "max_body_bytes", integer=True, minimum=1024,
                     hint="a search request alone takes hundreds of bytes")
        for name in ("max_query_chars", "max_docs_per_request", "max_id_chars", "max_title_chars", "max_text_chars"):
            check_number(getattr(self, name), name, integer=True, minimum=1)


class ServiceState:
    """The searcher, its current snapshot, and the locks that keep reads and writes consistent."""

    def __init__(
        self, index, *, model: str | None = None, precision: str = "auto", query_runtime: str = "auto",
        device: str = "auto", compute_lock=None,
    ) -> None:
        """``index``: an index folder, or a :class:`~twotower.retrieval.searcher.Searcher` to serve as it is (an
        open ``twotower.Index``'s, whose encoder, model and store the service then shares: ``api.tools``), with the
        lock its owner holds around the encoder (``compute_lock``), so that the two never run it at once."""
        from twotower.retrieval.indexing import EncodeConfig
        from twotower.retrieval.searcher import Searcher

        if isinstance(index, Searcher):
            self.searcher = index
            self.index = Path(index.store.root)
        else:
            self.index = Path(index)
            self.searcher = Searcher(self.index, model=model, query_runtime=query_runtime, precision=precision,
                                     device=device)
        self.searcher.onnx_queries  # load the encoder (and export it to ONNX) now, not on the first request
        self.cfg = EncodeConfig(precision=precision, show_progress=False, device=device)
        # Hugging Face fast tokenizers fail under concurrent calls ("Already borrowed") and the model
        # and FAISS use every core anyway: one search or encode at a time.
        self.compute_lock = compute_lock if compute_lock is not None else threading.Lock()
        self.write_lock = threading.Lock()
        self._refresh_lock = threading.Lock()

    # ---- snapshots ----------------------------------------------------------------------

    def snapshot(self):
        """The live index version (picking up writes by other processes); one object per request."""
        with self._refresh_lock:
            try:
                self.searcher.refresh()
            except TwoTowerError as exc:  # a half-visible foreign write: keep serving what we have
                log.warning("index refresh failed, serving version %s: %s", self.searcher.store.version, exc)
            return self.searcher.store

    def search(self, queries: list[str], k: int, mode: str | None, lam: float | None, prf_depth: int | None = None,
               prf_weight: float | None = None, filter: dict | None = None) -> tuple[object, list[list]]:
        """``(store, [[(id, score, title, metadata, text, passages), ...] per query])`` from one index version (each
        hit's best passage: :mod:`twotower.retrieval.passages`); ``filter``:
        only the documents it lets through (:mod:`twotower.retrieval.filters`)."""
        store = self.snapshot()
        check_feedback(store, mode, prf_depth, prf_weight)
        view = copy.copy(self.searcher)  # same encoder, pinned to this request's version
        view.store = store
        resolved, weight = view.resolve(mode, lam)
        from twotower.retrieval.passages import lexical_weight

        lexical = lexical_weight(resolved, weight)  # a hit's passage chosen by both sides, as tt.Index does
        if lam is not None and resolved != "hybrid":  # as the CLI and the API refuse it: a weight nothing uses
            raise TwoTowerError(f'"lambda" weighs dense against BM25 in mode hybrid; mode {resolved} does not use it: '
                                'drop "lambda" or send "mode": "hybrid"')
        kwargs = {"mode": mode, "lam": lam,  # None: the model's fitted choice, else dense / DEFAULT_LAMBDA
                  "prf_depth": prf_depth, "prf_weight": prf_weight, "filter": filter}
        k = min(k, len(store))
        q_vecs = None
        with self.compute_lock, embedding_errors():  # an embedding of your own that fails: EmbeddingFailed (502)
            if resolved != "bm25" and getattr(store, "passages", None):  # once: the search and the hits' passages
                from twotower.retrieval.searcher import restriction

                restriction(store, filter)  # a bad filter fails before any encoding
                q_vecs = view.encode_queries(queries)
            run = view.run({str(i): q for i, q in enumerate(queries)}, k, query_vectors=q_vecs, **kwargs)
        from twotower.retrieval.passages import ranked_passages

        rankings = [sorted(run[str(i)].items(), key=lambda kv: -kv[1])[:k] for i in range(len(queries))]
        if hasattr(store, "prefetch"):  # a Milvus index: the documents in one query, not one each
            store.prefetch([d for ranked in rankings for d, _ in ranked])
        results = []
        for i, ranked in enumerate(rankings):
            found = ranked_passages(store, ranked, queries[i], None if q_vecs is None else q_vecs[i],
                                    lexical=lexical)
            results.append([(d, s, doc["title"], doc.get("metadata") or {}, doc["text"], p)
                            for (d, s), (doc, p) in zip(ranked, found)])
        return store, results

    # ---- writes -------------------------------------------------------------------------

    def add(self, docs: list, replace: bool):
        """Encode ``docs`` (:class:`~twotower.data.beir.Document` objects: :func:`request_documents`) and add them
        as a new version; ``(live store, how many replaced)``."""
        from twotower.retrieval.indexing import encode_new_docs
        from twotower.retrieval.store import IndexStoreError

        with self.write_lock:
            store = self.snapshot()
            held = store.existing([d.id for d in docs])  # one batched lookup, not a query per document on Milvus
            dup = [d.id for d in docs if d.id in held]
            if dup and not replace:
                raise Conflict(f"{len(dup)} document id(s) already in the index: "
                                + ", ".join(repr(d) for d in dup[:5]) + " (send \"replace\": true to overwrite)")
            with self.compute_lock, embedding_errors():  # fails before anything is written
                new = encode_new_docs(self.searcher.encoder, docs, self.cfg,
                                      multivector=store.multivector, projection=store.projection,
                                      passages=getattr(store, "passages", None))
            try:
                live = store.add(new, replace=replace, show_progress=False)
            except IndexStoreError as exc:
                if "already in the index" in str(exc):  # another process added them meanwhile
                    raise Conflict(str(exc)) from None
                raise
            with self._refresh_lock:
                self.searcher.store = live
            return live, len(dup)

    def remove(self, doc_id: str):
        with self.write_lock:
            store = self.snapshot()
            if doc_id not in store.row_of:
                raise NotFound(f"document '{doc_id}' is not in the index (version {store.version})")
            if len(store) == 1:
                raise Conflict("cannot delete the last document: an index needs at least one")
            live = store.remove([doc_id], show_progress=False)
            with self._refresh_lock:
                self.searcher.store = live
            return live


def request_documents(items: list) -> list:
    """A ``POST /documents`` body's documents as :class:`~twotower.data.beir.Document` objects: a plain string gets
    its content id (:func:`twotower.document_id`, as the Python API gives it), a document object its own id, title,
    text and metadata, checked by the metadata rules (:mod:`twotower.data.metadata`; errors name
    ``documents[i]``, its id and the field)."""
    from twotower.data.beir import Document
    from twotower.data.metadata import check_metadata, document_id

    return [Document(document_id(d), "", d, {}) if isinstance(d, str)
            else Document(d.id, d.title, d.text, check_metadata(d.metadata, f"documents[{i}] (id {d.id!r})"))
            for i, d in enumerate(items)]


class NotFound(TwoTowerError):
    """An unknown document id: the service answers 404."""


class Conflict(TwoTowerError):
    """Ids already in the index without ``replace``, or deleting the last document: 409."""


def check_feedback(store, mode: str | None, depth: int | None, weight: float | None) -> None:
    """The pseudo-relevance feedback settings of a request, refused in the request's own words (its JSON fields
    ``prf_depth``, ``prf_weight``, ``mode``), not in the command line's."""
    from twotower.retrieval.prf import check_prf

    check_prf(depth, weight, mode=mode, fields=True)
    if depth is None:
        return
    if store.multivector:
        raise TwoTowerError('"prf_depth": pseudo-relevance feedback needs one vector per document and this index is '
                            'multi-vector: drop "prf_depth"')
    if depth > len(store):
        raise TwoTowerError(f'"prf_depth" {depth}: the index holds only {len(store)} documents to feed back; send a '
                            f'smaller "prf_depth"')
