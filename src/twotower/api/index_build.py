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


def passage_option(passages: bool | None, window: int | None, overlap: int | None, limit: int | None,
                   score: str | None = None):
    """What :meth:`Index.build <twotower.Index.build>`'s passage options ask for: None (the backend's default),
    False (each document's first window), or a :class:`~twotower.encoders.passages.PassageSpec` (checked again
    against the encoder's length before any encoding)."""
    from twotower.checks import check_number, flag, switch
    from twotower.encoders.passages import MAX_PASSAGES, PassageSpec

    if passages is not None and not isinstance(passages, bool):
        raise TwoTowerError(f"{flag('passages')}: True or False, not {passages!r}")
    tuned = {name: value for name, value in (("passage_window", window), ("passage_overlap", overlap),
                                             ("max_passages", limit), ("passage_score", score))
             if value is not None}
    if passages is False:
        if tuned:
            off = switch("passages", "--no-passages").replace("True", "False")
            raise TwoTowerError(f"{', '.join(flag(n) for n in tuned)} tune passages, which {off} turns off: drop "
                                "one of them")
        return False
    for name, value in tuned.items():
        if name != "passage_score":
            check_number(value, name, integer=True, minimum=0 if name == "passage_overlap" else 1)
    if passages is None and not tuned:
        return None
    return PassageSpec(window=window, overlap=overlap,
                       max_passages=MAX_PASSAGES if limit is None else limit, score="max" if score is None else score)


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
