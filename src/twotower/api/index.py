"""A stored index: build it from documents, open it, search it (dense, BM25, hybrid, RRF), grow and shrink it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from twotower.api._errors import user_errors
from twotower.api.build_specs import ANN, Compression, Milvus, Passages, Ray
from twotower.api.dataset import corpus_documents
from twotower.api.hit import Hit, hits_of
from twotower.api.index_manage import Managing, locked as _locked
from twotower.api.index_files import Syncing
from twotower.errors import TwoTowerError

__all__ = ["Hit", "Index", "corpus_documents"]

log = logging.getLogger(__name__)


class Index(Managing, Syncing):
    """A versioned index directory: vectors (FAISS: flat, HNSW, IVF, IVF-PQ), ids, documents, optionally BM25, and
    a manifest naming the encoder. Searches load the encoder on first use; every search reads one whole version,
    even while another process adds documents. Documents carry metadata (every field but id, title and text),
    returned on each :class:`Hit` and filtered on with ``search(..., filter=...)``; ``added_ids`` holds the ids the
    last :meth:`build` / :meth:`add` through this object wrote, in order. Without a query: :meth:`list`,
    :meth:`count`, :meth:`get`, :meth:`delete` (by filter) and :meth:`update` (metadata only).

    Example::

        import twotower as tt

        index = tt.Index.build("tea-index", ["Green tea is steamed.", "Coffee is roasted."],
                               metadatas=[{"kind": "tea"}, {"kind": "coffee"}], bm25=True)
        for hit in index.search("green tea", k=1, mode="hybrid", filter={"kind": "tea"}):
            print(hit.id, hit.text, hit.metadata)
    """

    def __init__(self, path: str | Path, *, device: str = "auto", precision: str = "auto", model: str | None = None,
                 query_runtime: str = "auto", verify: bool = False, embedding=None) -> None:
        """Open the index at ``path`` (see :meth:`open`)."""
        from twotower.retrieval.backends import open_store
        from twotower.retrieval.searcher import Searcher

        import threading

        from twotower.api._checks import index_folder
        from twotower.api.encoder import model_argument

        path, model = index_folder(path), model_argument(model, "model")  # an open Index, an Encoder: objects too
        self.path = Path(path)
        self.device = device
        self.precision = precision
        self._lock = threading.RLock()
        self._rerankers: dict[str, object] = {}  # cross-encoders loaded from a directory, by path
        self.added_ids: list[str] = []  # the ids the last build / add through this object wrote, in order
        self.skipped: list[dict] = []  # files the last build from files left out: [{"path", "reason"}]
        self._searcher = Searcher(open_store(self.path, verify=verify), model=model, query_runtime=query_runtime,
                                  precision=precision, device=device, embedding=embedding)

    @classmethod
    @user_errors
    def open(cls, path: str | Path, *, device: str = "auto", precision: str = "auto", model: str | None = None,
             query_runtime: str = "auto", verify: bool = False, embedding=None) -> "Index":
        """Open an index written by :meth:`build` or ``twotower index build``. ``model`` overrides the encoder the
        manifest names (it must make vectors of the same size); ``query_runtime`` ``auto`` (default) encodes
        queries with ONNX Runtime on a CPU (faster at batch 1; its export kept on disk, so that a new process's
        first search loads neither torch nor the weights: :mod:`twotower.encoders.onnx_cache`), ``onnx`` insists on
        it, ``torch`` encodes them with PyTorch; ``verify`` checks every file's SHA-256 now.
        ``embedding``: an index built with an embedding of your own needs it again (an index does not store it;
        the manifest records its class, and another one is refused); one of precomputed vectors may take any of
        their size, or search with ``query_vector=``.

        Example::

            index = tt.Index.open("tea-index")
            print(len(index), index.info()["dim"])
        """
        return cls(path, device=device, precision=precision, model=model, query_runtime=query_runtime, verify=verify,
                   embedding=embedding)

    @classmethod
    @user_errors
    def build(
        cls, path: str | Path, corpus, *, ids=None, metadatas=None, encoder=None, embedding=None, vectors=None,
        kind: str = "flat", ann: ANN | None = None, bm25: bool | None = None, passages: bool | Passages | None = None,
        compression: Compression | None = None, backend: str | Milvus = "faiss", ray: bool | Ray = False,
        mode: str = "create", batch_size: int | None = None, show_progress: bool = True, **options,
    ) -> "Index":
        """Encode ``corpus`` and write an index at ``path`` (a new folder, or an index that gets a new version):
        ``tt.Index.build("my-index", "my-folder")``. The option groups are small specs of their own
        (:mod:`twotower.api.build_specs`): :class:`~twotower.ANN`, :class:`~twotower.Compression`,
        :class:`~twotower.Passages`, :class:`~twotower.Ray`, :class:`~twotower.Milvus`.

        ``corpus``: a list of strings (ids from their content, :func:`~twotower.document_id`, or ``ids``; metadata
        from ``metadatas``, one dict or None per text), documents (``[{"_id" or "id", "title", "text", ...}]``:
        every other key is metadata; ``{id: text}``; ``{id: {"title", "text", ...}}``), a
        :class:`~twotower.Dataset`, a BEIR folder or ``corpus.jsonl`` path (extra fields: metadata), or files: a
        folder (read recursively), one file or a glob (``"docs/**/*.md"``) of ``.txt``, ``.md``, ``.html``,
        ``.pdf`` and ``.docx`` files — one document per file, its id the path relative to the folder, ``source``,
        ``format``, ``size``, ``mtime`` and ``sha256`` in its metadata (:mod:`twotower.data.files`; a file that
        cannot be read is skipped with its reason, listed in :attr:`skipped`; keep the index up to date with
        :meth:`sync`). The ids written, in order, are in :attr:`added_ids` afterwards.
        ``encoder``: an :class:`~twotower.Encoder`, a model name or directory (None: all-MiniLM-L6-v2; a model
        fitted to a hybrid gets its BM25 side too). ``embedding``: your own vectors instead
        (:mod:`twotower.encoders.external`): a function from a list of texts to vectors, a LangChain
        ``Embeddings`` or a LlamaIndex embedding model (give it again to :meth:`open`). ``vectors``: an array of
        precomputed document vectors, one row per document (search with ``query_vector=``); either is
        L2-normalised (cosine scores) and recorded in the manifest.
        ``kind``: ``flat`` (exact) | ``hnsw`` | ``ivf`` | ``ivfpq`` | a FAISS factory string. ``ann``: an
        :class:`~twotower.ANN` tuning the approximate kinds (HNSW's ``m``, IVF's ``nlist`` ...).
        ``bm25`` (default: on locally, off on Milvus, whose BM25 needs sparse vectors: Milvus 2.4 or later;
        ``bm25=False`` leaves it out): the lexical side for ``bm25`` / ``hybrid`` / ``rrf`` searches, making
        ``hybrid`` the default search.
        ``passages`` (default: on): a document longer than the encoder's window is split into passages, one
        vector each, and scores as its best (every :class:`Hit` carries its best passage); a
        :class:`~twotower.Passages` tunes the split, ``False`` keeps each document's first window only.
        ``compression``: a :class:`~twotower.Compression` storing fp16, int8 or binary vectors, or fewer
        dimensions. ``backend``: ``faiss`` (a local folder) or a :class:`~twotower.Milvus` collection (its
        ``kind`` flat | hnsw | ivf; the folder keeps the manifest). ``ray``: ``True`` or a
        :class:`~twotower.Ray` encodes on a Ray cluster.
        ``mode``: ``create`` (default) refuses a ``path`` that holds an index already; ``overwrite`` replaces its
        documents (a new version); ``append`` adds these documents to it. ``batch_size``: documents encoded at
        once (None: the encoder's). ``show_progress``: progress bars on stderr. Everything is checked before any
        encoding.

        More keywords (``**options``): ``language`` (BM25's language, implies ``bm25``), ``bigrams`` (BM25 over
        unigrams + bigrams), ``multivector=M`` (ME-BERT: the first M token vectors per document), ``project``
        (their random projection), ``device``, ``precision`` (``auto`` | ``fp32`` | ``bf16``), ``compile``,
        ``runtime`` (``auto`` | ``torch`` | ``onnx`` | ``openvino`` | ``onnx-int8`` | ``openvino-int8``; None:
        the Encoder's, else auto), ``max_file_bytes`` (files: skip larger ones; 64 MiB). The old keywords of the
        groups (``hnsw_m``, ``ef_construction``, ``nlist``, ``pq_m``; ``vectors="int8"``, ``dim``, ``rescore``;
        ``passage_window``, ``passage_overlap``, ``max_passages``, ``passage_score``; ``ray_address``,
        ``workers``, ``gpus_per_worker``; ``uri``, ``collection``) still work, with a ``DeprecationWarning``
        naming the spec that replaces them (:mod:`twotower.api.build_keywords`).

        Example::

            index = tt.Index.build("my-index", "my-folder")
            ds = tt.load_beir("my-beir-dir")
            index = tt.Index.build("hnsw-index", ds, kind="hnsw", ann=tt.ANN(m=48), show_progress=False)
        """
        from twotower.api.build_keywords import kept, new_form
        from twotower.api.index_vectors import precomputed

        if isinstance(vectors, str):  # the old vectors="int8": a compression
            options["vectors"] = vectors
            vectors = None
        given_vectors = vectors if precomputed(vectors) else None
        specs = new_form(options, ann=ann, compression=compression, passages=passages, ray=ray, backend=backend)
        more = kept(options)
        from twotower.api.index_build import build_index

        return build_index(cls, path, corpus, ids=ids, metadatas=metadatas, encoder=encoder, embedding=embedding,
                           given_vectors=given_vectors, kind=kind, bm25=bm25, mode=mode, batch_size=batch_size,
                           show_progress=show_progress, specs=specs, more=more, options=options)

    @classmethod
    @user_errors
    def attach(cls, path: str | Path, *, uri: str, collection: str, device: str = "auto",
               precision: str = "auto") -> "Index":
        """An index folder at ``path`` (new or empty) for the Milvus index in ``collection`` at ``uri``, made from
        what Milvus holds alone: how a replica on another machine gets its folder (a cache: deleting it loses
        nothing). Token or user/password from ``TWOTOWER_MILVUS_TOKEN`` / ``TWOTOWER_MILVUS_USER`` +
        ``TWOTOWER_MILVUS_PASSWORD``.

        Example::

            replica = tt.Index.attach("replica-index", uri="http://milvus.internal:19530", collection="scifact")
            print(len(replica), replica.info()["backend"])
        """
        from twotower.retrieval.milvus.store import MilvusStore

        MilvusStore.attach(path, uri, collection).close()
        return cls(path, device=device, precision=precision)

    # ------------------------------------------------------------------ facts
    @property
    def store(self):
        """The live version's store (``twotower.retrieval.store.IndexStore`` or ``…milvus.store.MilvusStore``, the
        ``store_protocol.Store`` protocol: internal, for the curious)."""
        return self._searcher.store

    def __len__(self) -> int:
        return len(self._searcher.store)

    def __repr__(self) -> str:
        return f"Index({str(self.path)!r}, documents={len(self)})"

    def info(self) -> dict:
        """The live version's manifest (documents, vectors, dim, FAISS factory, BM25, the encoder), its ``path`` and
        ``live_version`` (the version folder searches read).

        Example::

            info = index.info()
            print(info["live_version"], info["num_docs"], info["model"]["name"])
        """
        self._searcher.refresh()
        return {**self._searcher.store.info(), "path": str(self.path)}

    @property
    def encoder(self):
        """The index's encoder as an :class:`~twotower.Encoder` (loaded on first use)."""
        from twotower.api.encoder import Encoder

        return Encoder(self._searcher.encoder, source=self._searcher.store.manifest["model"].get("path"),
                       precision=self.precision)

    def resolve(self, mode: str | None = None, lam: float | None = None) -> tuple[str, float]:
        """The ``(mode, λ)`` a search with these arguments uses: the given ones, else the model's fitted choices
        (``twotower fit``), else dense and 0.5.

        Example::

            mode, lam = index.resolve()
        """
        return self._searcher.resolve(mode, lam)

    # ------------------------------------------------------------------ search
    @user_errors
    @_locked
    def search(self, query: str | Sequence[str] | None = None, k: int = 10, *, mode: str | None = None,
               lam: float | None = None, norm: str | None = None, prf_depth: int | None = None,
               prf_weight: float | None = None, rerank=None, rerank_depth: int | None = None,
               ef_search: int | None = None, nprobe: int | None = None, filter=None,
               query_vector=None, passages: int = 1) -> list[Hit] | list[list[Hit]]:
        """The ``k`` best documents for a query (a list of :class:`Hit`), or for each of a list of queries (a list
        of lists, all from one index version).

        ``mode``: ``dense`` | ``bm25`` | ``hybrid`` (λ·dense + (1−λ)·BM25 after per-query ``norm``: ``minmax`` or
        ``zscore``) | ``rrf``; left out, the mode, λ, normalisation and re-ranker ``twotower fit`` chose for the
        model, else ``hybrid`` (λ 0.5) on an index with BM25 and ``dense`` on one without. ``prf_depth``/``prf_weight``: dense pseudo-relevance feedback (Rocchio on vectors).
        ``rerank``: a cross-encoder directory or :class:`Reranker` re-scoring the top ``rerank_depth`` (default
        100), ``"none"`` to leave a fitted one out. ``ef_search``/``nprobe``: HNSW / IVF search breadth
        (left out: the one the index calibrated when it was built, for recall@10 ≥ 0.95:
        ``twotower.retrieval.index.breadth``). ``filter``: a metadata filter (``{"field": value}``, ``$eq $ne $gt
        $gte $lt $lte $in $nin $exists``, ``$and`` / ``$or`` / ``$not``, dotted paths, ``{"$text": {"$contains":
        "phrase"}}`` on the text: :mod:`twotower.retrieval.filters`): only the documents it lets through
        are searched, in every mode — the ``k`` best of them (exact on flat indexes; fewer only when fewer match).
        ``query_vector``: the query's vector (or a list, one per query) for the dense side instead of encoding the
        text (an index of precomputed vectors: :meth:`build`); alone it searches in mode ``dense``, with ``query``
        the text serves BM25. ``passages``: how many of each hit's best passages its :attr:`Hit.passages` holds
        (default 1).

        Example::

            hits = index.search("how is green tea made", k=5, mode="hybrid", lam=0.6)
            batch = index.search(["green tea", "coffee"], k=3)
            teas = index.search("green tea", k=3, filter={"type": "tea"})
            print(hits[0].id, hits[0].score, len(batch), [h.metadata for h in teas])
        """
        from twotower.api.index_vectors import query_inputs
        queries, single, vectors, texts = query_inputs(query, query_vector)
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise TwoTowerError(f"query {i}: empty or not a string ({q!r}); give the text to search for")
        from twotower.api._checks import check_search_options

        check_search_options(queries, k=k, rerank_depth=rerank_depth, ef_search=ef_search, nprobe=nprobe,
                             prf_depth=prf_depth, lam=lam, prf_weight=prf_weight)
        # numpy integers pass the checks as numbers; FAISS takes Python ints only
        k, rerank_depth, ef_search, nprobe, prf_depth = (None if v is None else int(v) for v in (
            k, rerank_depth, ef_search, nprobe, prf_depth))
        if rerank_depth is not None and rerank is None:
            raise TwoTowerError("rerank_depth sets how many hits rerank re-ranks: pass rerank or drop it")
        searcher = self._searcher
        searcher.refresh()
        store = searcher.store  # one version for rankings, re-ranking and documents
        from twotower.api.reranking import chosen_reranker, cross_encoder, rerank_hits

        rerank, rerank_depth, weight = chosen_reranker(rerank, rerank_depth, mode=mode, fitted=searcher.defaults,
                                                       store=store)
        from twotower.api._checks import resolve_search
        mode, lam = resolve_search(searcher, mode, lam, norm, has_text=bool(texts), rerank=rerank, passages=passages)
        rerank_depth = 100 if rerank_depth is None else rerank_depth
        depth = max(k, rerank_depth) if rerank is not None else k
        from twotower.retrieval.filters import parse_filter

        filter = parse_filter(filter)  # once, here: the search and the hits' passages take it parsed
        searcher.query_vectors = vectors  # None: encode the texts
        try:
            from twotower.api.hit import passage_query_vectors

            q_vecs = passage_query_vectors(searcher, store, mode, filter, queries)
            run = searcher.run({str(i): q for i, q in enumerate(queries)}, depth, mode=mode, lam=lam, norm=norm,
                               prf_depth=prf_depth, prf_weight=prf_weight, ef_search=ef_search, nprobe=nprobe,
                               store=store, filter=filter, query_vectors=q_vecs)
        finally:
            searcher.query_vectors = None
        # best first; equal scores keep the order the search returned them in (as the service's hits do)
        ranked = [sorted(run[str(i)].items(), key=lambda kv: -kv[1]) for i in range(len(queries))]
        if rerank is not None:
            ce = cross_encoder(rerank, self._rerankers, device=self.device, precision=self.precision)
            ranked = rerank_hits(queries, ranked, ce, rerank_depth, weight, store)
        if hasattr(store, "prefetch"):  # a Milvus index: the documents in one query, not one each
            store.prefetch([d for hits in ranked for d, _ in hits[:k]])
        from twotower.retrieval.passages import lexical_weight

        lexical = lexical_weight(mode, lam)  # passages chosen by both sides
        out = [hits_of(store, hits[:k], queries[i], None if q_vecs is None else q_vecs[i], passages, lexical)
               for i, hits in enumerate(ranked)]
        return out[0] if single else out

    @user_errors
    @_locked
    def run(self, queries: dict[str, str], k: int = 1000, **options) -> dict[str, dict[str, float]]:
        """A run ``{query_id: {doc_id: score}}`` for ``{query_id: text}`` (the options of :meth:`search` but
        re-ranking, ``filter`` included), as :func:`twotower.evaluate` and TREC run files use.

        Example::

            run = index.run({"q1": "green tea"}, k=10, mode="bm25")
        """
        from twotower.api._checks import check_run_queries

        check_run_queries(queries, k)
        k = int(k)
        self._searcher.refresh()
        return self._searcher.run(dict(queries), k, **options)

    # ------------------------------------------------------------------ writes
    @user_errors
    @_locked
    def add(self, docs, *, ids=None, metadatas=None, replace: bool = False, batch_size: int | None = None,
            compile: bool = False, show_progress: bool = False, runtime: str = "auto",
            lock_timeout: float | None = 60.0, vectors=None) -> "Index":
        """Encode ``docs`` (any corpus form :meth:`build` takes, with its ``ids`` / ``metadatas`` for a list of
        strings) with the index's encoder and add them as a new version; ids already in the index are an error
        unless ``replace=True`` (a replaced document's metadata is replaced too); ``runtime`` as in :meth:`build`.
        ``lock_timeout``: seconds to wait while another writer holds the index (0: fail at once; None: wait).
        Returns the index; the ids added, in order, are in :attr:`added_ids`. ``vectors``: the documents'
        precomputed vectors, one row each, on an index of your own vectors (built with ``embedding=`` or
        ``vectors=``; its embedding, if any, encodes them otherwise).

        Example::

            index.add([{"_id": "d3", "title": "Oolong", "text": "Oolong is partly oxidised.", "type": "tea"}])
            index.add(["Matcha is ground green tea."], metadatas=[{"type": "tea"}])
            print(index.added_ids)  # ['doc-…']: the text's content id
        """
        from twotower.checks import check_number
        from twotower.encoders.runtimes import check_runtime, using_runtime
        from twotower.retrieval.indexing import EncodeConfig, add_documents_from

        check_runtime(runtime)
        check_number(batch_size, "batch_size", integer=True, minimum=1, optional=True)

        searcher = self._searcher
        searcher.refresh()
        cfg = EncodeConfig(batch_size=batch_size, precision=self.precision, device=self.device,
                           show_progress=show_progress, compile=compile)
        source = str(docs) if isinstance(docs, (str, Path)) else "documents"
        new = corpus_documents(docs, ids=ids, metadatas=metadatas)
        from twotower.retrieval.index.lock import lock_timeout as waiting

        if vectors is not None:
            from twotower.api.index_vectors import add_encoder

            encoder = add_encoder(searcher, vectors, len(new))
        else:
            encoder = searcher.encoder
        with using_runtime(runtime), waiting(lock_timeout):  # another writer: give up after lock_timeout s
            # the store of this write (a Milvus index: its head known, not read again), then any later writer's
            searcher.store = add_documents_from(searcher.store, new, replace=replace, cfg=cfg, encoder=encoder,
                                                source=source)
        searcher.refresh()
        self.added_ids = [d.id for d in new]
        return self

    @user_errors
    @_locked
    def remove(self, ids: Sequence[str], *, lock_timeout: float | None = 60.0) -> "Index":
        """Remove documents by id (a new version without them; an unknown id is an error). Returns the index.
        ``lock_timeout``: seconds to wait while another writer holds the index (0: fail at once; None: wait).

        Example::

            index.remove(["d3"])
        """
        if isinstance(ids, str):
            raise TwoTowerError("remove takes a list of ids, not a single string")
        ids = list(ids)
        bad = next((i for i in ids if not isinstance(i, str)), None)
        if bad is not None:
            raise TwoTowerError(f"ids: a list of document ids (strings); {bad!r} is a {type(bad).__name__}")
        from twotower.retrieval.index.lock import lock_timeout as waiting

        self._searcher.refresh()
        with waiting(lock_timeout):  # another writer holding the index: give up after lock_timeout s
            self._searcher.store = self._searcher.store.remove(list(ids), show_progress=False)
        self._searcher.refresh()
        return self
