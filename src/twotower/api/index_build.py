"""How :meth:`Index.build <twotower.Index.build>` writes, once its options are checked: by one of three routes —
a Milvus collection (``backend="milvus"``), Ray workers encoding a corpus file into a local folder (``ray=True``), or
a local FAISS folder — each with the encoder given (an :class:`~twotower.Encoder`, a name or a directory; a model
fitted to a hybrid gets its BM25 side too: :func:`twotower.retrieval.indexing.spec_for_model`).

Example::

    from twotower.api.index_build import write_index
    from twotower.retrieval.indexing import EncodeConfig
    from twotower.retrieval.store import IndexSpec

    model, added = write_index("tea-index", ["Green tea is steamed."], IndexSpec(), EncodeConfig(), backend="faiss",
                               encoder=None, ids=None, metadatas=None, language_given=False, runtime="auto",
                               device="auto", multivector=None, project=None, uri=None, collection=None, ray=False,
                               ray_address=None, workers=None, gpus_per_worker=0.0)
"""

from __future__ import annotations

from pathlib import Path

from twotower.api.dataset import corpus_documents
from twotower.errors import TwoTowerError


def _encoder_parts(encoder, device: str):
    """(loaded DualEncoder, the name or directory the index records) for ``encoder``: an Encoder, a name, None."""
    from twotower.api.encoder import Encoder
    from twotower.encoders.device import resolve_device
    from twotower.encoders.towers import DualEncoder

    if isinstance(encoder, Encoder):
        return encoder.model, encoder.source
    if encoder is not None and not isinstance(encoder, (str, Path)):
        raise TwoTowerError(f"encoder: give an Encoder, a model name or a directory, not {type(encoder).__name__}")
    return DualEncoder.load(encoder, device=resolve_device(device)), \
        (str(encoder) if encoder is not None else None)


def build_index(cls, path, corpus, *, ids, metadatas, encoder, embedding, given_vectors, kind, bm25, mode,
                batch_size, show_progress, specs: dict, more: dict, options: dict):
    """:meth:`Index.build <twotower.Index.build>` once its keywords are sorted
    (:func:`twotower.api.build_keywords.new_form`: ``specs``; ``more``: the keywords kept beside the signature;
    ``options``: what is left, fields of the ``IndexSpec`` or unknown). Returns the new ``cls`` (an Index)."""
    from dataclasses import replace

    from twotower.api._checks import check_build_options, index_folder
    from twotower.api.build_specs import Milvus
    from twotower.api.encoder import Encoder, model_argument
    from twotower.api.index_files import check_mode, read_corpus
    from twotower.encoders.runtimes import check_runtime
    from twotower.io import check_output_dir
    from twotower.retrieval.bm25 import BM25Params
    from twotower.retrieval.indexing import EncodeConfig
    from twotower.retrieval.store import IndexSpec

    device, precision, compile_ = more["device"], more["precision"], more["compile"]
    path = index_folder(path)  # an open Index: a new version of its folder
    encoder = encoder if isinstance(encoder, (Encoder, type(None))) else model_argument(encoder, "encoder")
    check_output_dir(path, "path")  # before any loading or encoding
    there = check_mode(Path(path), mode)
    corpus, skipped = read_corpus(corpus, Path(path), max_file_bytes=more["max_file_bytes"],
                                  show_progress=show_progress)
    if there and mode == "append":
        index = cls(path, device=device, precision=precision, embedding=embedding)
        index.add(corpus, ids=ids, metadatas=metadatas, batch_size=batch_size, compile=compile_,
                  show_progress=show_progress, runtime=more["runtime"] or "auto")
        index.skipped = skipped
        return index
    check_build_options(multivector=more["multivector"], project=more["project"], batch_size=batch_size)
    runtime = check_runtime(more["runtime"] or getattr(encoder, "runtime", None) or "auto")
    ann, compression, ray, backend = specs["ann"], specs["compression"], specs["ray"], specs["backend"]
    milvus = backend if isinstance(backend, Milvus) else None
    backend = "milvus" if milvus is not None else backend
    language, bigrams = more["language"], more["bigrams"]
    spec = IndexSpec(kind=kind, bm25=(backend != "milvus" if bm25 is None else bm25) or bigrams or language is not None,
                     bm25_params=BM25Params(ngram=2 if bigrams else 1, language=language or "en"))
    if ann is not None:
        spec = replace(spec, hnsw_m=ann.m, ef_construction=ann.ef_construction, nlist=ann.nlist, pq_m=ann.pq_m,
                       train_size=ann.train_size)
    if compression is not None:
        spec = replace(spec, vectors=compression.vectors, dim=compression.dim, rescore=compression.rescore,
                       rescore_factor=compression.rescore_factor)
    unknown = sorted(set(options) - {"bm25_params"})  # the IndexSpec's BM25 settings: accepted as before
    if unknown:
        raise TwoTowerError(f"Index.build: unknown option(s) {', '.join(unknown)}")
    spec = replace(spec, **options)
    cfg = EncodeConfig(batch_size=batch_size, precision=precision, device=device, show_progress=show_progress,
                       compile=compile_)
    passages = specs["passages"]
    model, added = write_index(path, corpus, spec, cfg, backend=backend, encoder=encoder, ids=ids,
                               metadatas=metadatas, language_given=language is not None, runtime=runtime,
                               device=device, multivector=more["multivector"], project=more["project"],
                               uri=milvus and milvus.uri, collection=milvus and milvus.collection,
                               ray=ray is not None, ray_address=ray and ray.address, workers=ray and ray.workers,
                               gpus_per_worker=ray.gpus_per_worker if ray else 0.0, embedding=embedding,
                               given_vectors=given_vectors,
                               passages=passages.spec() if passages else passages)
    index = cls(path, device=device, precision=precision, embedding=embedding)
    if model is not None and embedding is None:
        index._searcher._encoder = model  # the encoder the manifest names, already loaded: searches reuse it
    index.added_ids = added if added is not None else list(index.store.doc_ids)
    index.skipped = skipped
    return index


def external_parts(docs: list, embedding, given_vectors, entry: dict | None = None):
    """``(query encoder, document writer)`` for an index of your own vectors: an
    :class:`~twotower.encoders.external.ExternalEncoder` over ``embedding`` (None: precomputed vectors) that
    encodes queries, and the documents' vectors (``given_vectors``, else ``embedding``'s, encoded here once)
    checked, one per document — or one per passage with ``entry``, character passages
    (:mod:`twotower.encoders.text_passages`) — for the write."""
    from twotower.encoders.external import ExternalEncoder, GivenVectors

    if not docs:
        raise TwoTowerError("the corpus holds no documents to index")
    base = ExternalEncoder(embedding)
    if entry is not None:
        from twotower.encoders.text_passages import split_texts

        texts = split_texts([d.id for d in docs], [d.title for d in docs], [d.text for d in docs], entry)[0]
    else:
        texts = [d.full_text for d in docs]
    if given_vectors is None:
        given_vectors = base.encode_documents(texts)
    writer = GivenVectors(given_vectors, base, len(texts))
    return ExternalEncoder(embedding, dim=writer.dim), writer


def external_passages(passages, given_vectors) -> dict | None:
    """The character-passage entry an index of your own vectors is split by (None: one vector per document):
    on by default for an embedding (``passage_window`` / ``passage_overlap`` in characters); precomputed vectors
    are one per document, so passages asked for with them are refused."""
    from twotower.encoders.text_passages import manifest_entry

    if passages is False:
        return None
    if given_vectors is not None:
        if passages is not None:
            raise TwoTowerError("precomputed vectors are one per document: drop the passage options, or give "
                                "embedding= so that long documents are split into passages")
        return None
    if passages is None:
        return manifest_entry()
    if passages.score != "max":
        from twotower.checks import given

        raise TwoTowerError(f"{given('passage_score', passages.score)}: with an embedding of your own a document "
                            "scores by its best passage only; drop it")
    return manifest_entry(passages.window, passages.overlap, passages.max_passages)


def write_index(path: str | Path, corpus, spec, cfg, *, backend: str, encoder, ids, metadatas, language_given: bool,
                runtime: str, device: str, multivector: int | None, project: int | None, uri: str | None,
                collection: str | None, ray: bool, ray_address: str | None, workers: int | None,
                gpus_per_worker: float, passages=None, embedding=None, given_vectors=None):
    """Write ``corpus`` as an index at ``path`` with ``spec`` (an ``IndexSpec``) and ``cfg`` (an ``EncodeConfig``),
    the other arguments as :meth:`Index.build <twotower.Index.build>` takes them (``language_given``: its
    ``language`` was given; ``embedding`` / ``given_vectors``: an embedding of your own or precomputed vectors,
    :func:`external_parts`). Returns ``(encoder, ids)``: the loaded DualEncoder the index names (None when Ray's
    workers loaded their own) and the ids written, in order (None: the index's, after a Ray build)."""
    from twotower.encoders.runtimes import using_runtime
    from twotower.retrieval.indexing import build_index_from, spec_for_model

    external = embedding is not None or given_vectors is not None
    if external:
        if encoder is not None:
            raise TwoTowerError("give encoder (a twotower model) or embedding / vectors (your own), not both")
        if ray or multivector or project:
            raise TwoTowerError("ray, multivector and project need a twotower encoder; drop them with "
                                "embedding= or vectors=")
        entry = external_passages(passages, given_vectors)
    if backend not in ("faiss", "milvus"):
        raise TwoTowerError(f"backend {backend!r}: choose faiss (a local index folder) or milvus")
    if backend == "faiss" and (uri is not None or collection is not None):
        raise TwoTowerError("uri / collection name a Milvus location: pass backend='milvus'")
    if passages is not None and passages is not False and ray:
        from twotower.checks import flag, switch

        raise TwoTowerError(f"passages are split and searched by the local FAISS backend and Milvus; {switch('ray')} "
                            f"keeps each document's first window: drop {flag('passages')} (and its tuning options) or "
                            f"{switch('ray')}")
    if backend == "milvus":
        if ray:
            raise TwoTowerError("ray=True writes a local FAISS index; drop it for backend='milvus'")
        if passages and passages.score != "max":
            from twotower.checks import given

            raise TwoTowerError(f"{given('passage_score', passages.score)}: a Milvus index scores a document by its "
                                f"best passage only; drop it, or build with {given('backend', 'faiss')}")
        from twotower.retrieval.indexing import build_milvus_from
        from twotower.retrieval.milvus.build import check_options

        check_options(Path(path), spec, uri=uri, collection=collection, multivector=multivector, project=project)
        docs = corpus_documents(corpus, ids=ids, metadatas=metadatas)
        if external:
            model, writer = external_parts(docs, embedding, given_vectors, entry)
            build_milvus_from(docs, path, writer, model=None, spec=spec, cfg=cfg, uri=uri, collection=collection,
                              passages=entry or False)
            return model, [d.id for d in docs]
        model, source = _encoder_parts(encoder, device)
        spec = spec_for_model(spec, source, language_given=language_given)
        with using_runtime(runtime):
            build_milvus_from(docs, path, model, model=source, spec=spec, cfg=cfg, uri=uri,
                              collection=collection, passages=True if passages is None else passages)
        return model, [d.id for d in docs]
    if ray:
        if multivector or project:
            raise TwoTowerError("ray encodes single-vector indexes; drop multivector/project")
        if ids is not None or metadatas is not None:
            raise TwoTowerError("ray=True reads the corpus from a file: put ids and metadata into its records")
        if not isinstance(corpus, (str, Path)) or not isinstance(encoder, (str, Path, type(None))):
            raise TwoTowerError("ray=True reads the corpus and the model on every worker: give corpus and encoder "
                                "as paths or names")
        from twotower.scale.ray_encode import RayConfig, build_index_ray

        model_name = str(encoder) if encoder is not None else None
        spec = spec_for_model(spec, model_name, language_given=language_given)
        build_index_ray(corpus, path, model=model_name, spec=spec, cfg=cfg, ray_cfg=RayConfig(
            address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker))
        return None, None  # the workers loaded the model; the ids written: the index's
    docs = corpus_documents(corpus, ids=ids, metadatas=metadatas)
    if external:
        from twotower.retrieval.store import check_target

        check_target(Path(path))  # before any encoding (the kind's options need the vectors' size: checked after)
        model, writer = external_parts(docs, embedding, given_vectors, entry)
        build_index_from(docs, path, writer, model=None, spec=spec, cfg=cfg, passages=entry or False)
        return model, [d.id for d in docs]
    model, source = _encoder_parts(encoder, device)
    spec = spec_for_model(spec, source, language_given=language_given)
    with using_runtime(runtime):
        build_index_from(docs, path, model, model=source, spec=spec, multivector=multivector, project_dim=project,
                         cfg=cfg, passages=True if passages is None else passages)
    return model, [d.id for d in docs]
