"""Documents in, index versions out: encode them with the index's encoder and build or add (local or Milvus).

The encoder that built an index is recorded in its manifest (``model``: name, path, pooling, normalisation,
lengths: :func:`model_info`) and re-loaded (:func:`load_encoder`) for documents added later and for the
:class:`~twotower.retrieval.searcher.Searcher`'s queries, so the vectors stay comparable. Everything a build can
check is checked before any encoding (:func:`check_build`).

Example::

    from twotower.retrieval.indexing import EncodeConfig, add_documents, build_index

    build_index("scifact", "scifact-index", cfg=EncodeConfig(show_progress=False))
    add_documents("scifact-index", "new-docs.jsonl", replace=True)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twotower.checks import flag, given, switch
from twotower.data.beir import Document, load_corpus
from twotower.errors import TwoTowerError
from twotower.retrieval.backends import open_store
from twotower.retrieval.index.files import REBUILT
from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs, check_spec, check_target
from twotower.retrieval.store_protocol import Store

log = logging.getLogger(__name__)


@dataclass
class EncodeConfig:
    batch_size: int | None = None  # None: the device's default (encoders.inference.DEFAULT_BATCH_SIZE)
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    show_progress: bool = True
    compile: bool = False  # torch.compile single-vector document encoding (EncodeOptions.compile)


def model_info(model_arg: str | None, encoder) -> dict:
    """What the manifest records about the encoder (an embedding of your own: its own record,
    :meth:`~twotower.encoders.external.ExternalEncoder.manifest_info`)."""
    from twotower.encoders.backbone import resolve_model

    if hasattr(encoder, "manifest_info"):
        return encoder.manifest_info()
    tower = encoder.doc_tower
    path = resolve_model(model_arg)
    if Path(path).exists():  # a local directory: absolute, so the index loads it from any working directory
        path = str(Path(path).resolve())
    return {
        "name": str(model_arg) if model_arg else "all-MiniLM-L6-v2",
        "path": path,
        "pooling": tower.pooling,
        "normalize": bool(tower.normalize),
        "query_max_length": int(encoder.query_max_length),
        "doc_max_length": int(encoder.doc_max_length),
    }


def load_encoder(info: dict, override: str | None = None, device: str = "auto"):
    """The dual encoder an index was built with (or ``override``, a model directory), on ``device``. An index of
    precomputed vectors gets an :class:`~twotower.encoders.external.ExternalEncoder` without an embedding (queries
    come as vectors); one built with an embedding of your own needs it given again (``Index.open(...,
    embedding=...)``): it is not stored."""
    from twotower.encoders.device import resolve_device
    from twotower.encoders.external import ExternalEncoder, is_external
    from twotower.encoders.towers import DualEncoder

    if is_external(info):
        built = info["embedding"]
        if override:
            raise TwoTowerError(f"model {override!r}: this index was built with {info.get('name')}, not a twotower "
                                "model; its queries are encoded by that embedding only")
        if built.get("kind") != "vectors":
            raise TwoTowerError(f"this index was built with your own embedding ({built.get('kind')}: "
                                f"{built.get('source')}), which an index does not store: give it again, "
                                "tt.Index.open(path, embedding=...), or search with query_vector=")
        return ExternalEncoder(None, dim=int(built["dim"]), normalize=bool(built.get("normalize", True)))
    target = resolve_device(device)
    if override:
        return DualEncoder.load(override, device=target)
    path = info.get("path")
    model = path if path and Path(path).exists() else info.get("name")
    return DualEncoder.load(
        model, pooling=info.get("pooling"), normalize=info.get("normalize"),
        query_max_length=info.get("query_max_length"), doc_max_length=info.get("doc_max_length"), device=target,
    )


def encode_new_docs(
    encoder, docs: list[Document], cfg: EncodeConfig, *, multivector: int | None = None,
    projection: np.ndarray | None = None, passages: dict | None = None,
) -> NewDocs:
    """``docs`` encoded for an index: one vector each, ME-BERT's first ``multivector`` token vectors, or, with
    ``passages`` (a :class:`~twotower.encoders.passages.PassageSpec`'s manifest entry), one vector per passage
    of each document (:mod:`twotower.encoders.passages`)."""
    from twotower.data.files import page_breaks
    from twotower.encoders.towers import EncodeOptions

    texts = [d.full_text for d in docs]
    if passages is not None and passages.get("unit") == "chars":  # an embedding of your own: no tokenizer to count
        from twotower.encoders.text_passages import split_texts

        parts, offsets, spans = split_texts([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
                                            passages, [page_breaks(getattr(d, "metadata", None)) for d in docs])
        opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress,
                             compile=cfg.compile, unit="passage")
        return NewDocs([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
                       encoder.encode_documents(parts, opts), offsets,
                       metadata=[getattr(d, "metadata", None) or {} for d in docs], spans=spans)
    if passages is not None and not multivector:
        from twotower.encoders.passages import PassageSpec, split_documents

        spec = PassageSpec.from_manifest(passages).resolved(encoder.doc_max_length)
        split = split_documents(encoder.doc_tower.tokenizer, [d.title for d in docs], [d.text for d in docs], spec,
                                prompt=encoder.prompts.get("document", ""), ids=[d.id for d in docs],
                                breaks=[page_breaks(getattr(d, "metadata", None)) for d in docs])
        opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress,
                             compile=cfg.compile, unit="passage")
        return NewDocs([d.id for d in docs], [d.title for d in docs], [d.text for d in docs],
                       encoder.encode_documents(split.texts, opts), split.offsets,
                       metadata=[getattr(d, "metadata", None) or {} for d in docs], spans=split.spans)
    if multivector:
        from twotower.retrieval.multivector import encode_multivector

        vectors, offsets = encode_multivector(
            encoder.doc_tower, texts, multivector, max_length=encoder.doc_max_length, batch_size=cfg.batch_size,
            precision=cfg.precision, projection=projection, show_progress=cfg.show_progress,
        )
    else:
        opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress,
                             compile=cfg.compile)
        vectors, offsets = encoder.encode_documents(texts, opts), None
    return NewDocs([d.id for d in docs], [d.title for d in docs], [d.text for d in docs], vectors, offsets,
                   metadata=[getattr(d, "metadata", None) or {} for d in docs])


def spec_for_model(spec: IndexSpec, model: str | None, *, language_given: bool = False) -> IndexSpec:
    """``spec`` with a BM25 part when the model was fitted to hybrid or RRF retrieval (``twotower fit``): its
    searches need one; in the fitted BM25 language unless ``language_given`` (the user's --language)."""
    from dataclasses import replace

    from twotower.retrieval.defaults import read_defaults

    fitted = read_defaults(model)
    if fitted is None:
        return spec
    if fitted.language and not language_given and (spec.bm25 or fitted.needs_bm25):
        spec = replace(spec, bm25_params=replace(spec.bm25_params, language=fitted.language))
    if spec.bm25 or not fitted.needs_bm25:
        return spec
    log.info("the model was fitted to %s retrieval: building the BM25 part too", fitted.mode)
    return replace(spec, bm25=True)


def check_build(out: str | Path, spec: IndexSpec, cfg: EncodeConfig, *, dim: int, num_docs: int,
                multivector: int | None = None) -> None:
    """Everything an index build can check before encoding: the output directory, the index kind and
    its options for ``num_docs`` documents of ``dim`` dimensions (up to ``multivector`` vectors each), the
    precision. A failure here costs nothing and writes nothing."""
    from twotower.encoders.inference import check_precision

    check_precision(cfg.precision, f"unknown {flag('precision')}")
    check_target(Path(out))
    check_spec(spec, dim, num_docs, num_docs * multivector if multivector else num_docs)


def check_multivector_sizes(encoder, multivector: int | None, project_dim: int | None) -> None:
    """Refuse sizes the model cannot honour, before anything is encoded: ME-BERT's m above the document length in
    tokens (a document has no more token vectors than that), a projection wider than the model's vectors (a
    random projection to more dimensions adds none of information, only size)."""
    length = getattr(encoder, "doc_max_length", None)
    if multivector and length and multivector > length:
        raise TwoTowerError(f"{given('multivector', multivector)}: a document gives at most {length} token vectors "
                            f"(the model's document length), so m can be at most {length}")
    dim = encoder.doc_tower.dim
    if project_dim and project_dim > dim:
        raise TwoTowerError(f"{given('project', project_dim)} is wider than the model's {dim}-dimensional token "
                            f"vectors: a projection makes them smaller; give {flag('project')} {dim} or fewer")


def build_index(
    data: str | Path,
    out: str | Path,
    *,
    model: str | None = None,
    spec: IndexSpec | None = None,
    multivector: int | None = None,
    project_dim: int | None = None,
    cfg: EncodeConfig | None = None,
    **vector_options,
) -> IndexStore:
    """Encode a BEIR directory's corpus (or a corpus .jsonl file) and write an index at ``out``.
    ``vector_options``: ``vectors``, ``dim``, ``rescore``, ``rescore_factor`` (see :func:`build_index_from`)."""
    from twotower.encoders.device import resolve_device
    from twotower.encoders.towers import DualEncoder

    cfg = cfg or EncodeConfig()
    target = resolve_device(cfg.device)
    data = Path(data)
    check_target(Path(out))  # before loading anything
    corpus = load_corpus(data / "corpus.jsonl" if data.is_dir() else data)
    encoder = DualEncoder.load(model, device=target)
    return build_index_from(list(corpus.values()), out, encoder, model=model, spec=spec, multivector=multivector,
                            project_dim=project_dim, cfg=cfg, **vector_options)


def build_index_from(
    docs: list[Document],
    out: str | Path,
    encoder,
    *,
    model: str | None = None,
    spec: IndexSpec | None = None,
    multivector: int | None = None,
    project_dim: int | None = None,
    cfg: EncodeConfig | None = None,
    vectors: str | None = None,
    dim: int | None = None,
    rescore: str | None = None,
    rescore_factor: int | None = None,
    passages=True,
) -> IndexStore:
    """Encode ``docs`` with ``encoder`` (a loaded DualEncoder; ``model``: the name or directory it came from, which
    the manifest records so that searches load it again) and write an index at ``out``.

    ``passages``: True (the default) splits documents longer than the encoder's window into passages, one vector
    each, a document scored by its best (a :class:`~twotower.encoders.passages.PassageSpec` sets the window,
    overlap and limit); False keeps each document's first window only. Multi-vector indexes keep ME-BERT's first
    m token vectors (passages are refused with them).

    ``vectors`` (fp32 | fp16 | int8 | binary), ``dim`` (keep the first ``dim`` dimensions, re-normalised),
    ``rescore`` (binary: int8 | fp32 | none) and ``rescore_factor`` (binary: k × factor Hamming candidates are
    rescored), when given, override ``spec``'s fields of the same names (:mod:`twotower.retrieval.index.codecs`);
    bad values fail before any encoding."""
    from dataclasses import replace as _replace

    cfg = cfg or EncodeConfig()
    spec = spec_for_model(spec or IndexSpec(), model, language_given=spec is not None)  # a given spec: its language
    options = {"vectors": vectors, "dim": dim, "rescore": rescore, "rescore_factor": rescore_factor}
    spec = _replace(spec, **{k: v for k, v in options.items() if v is not None})
    check_target(Path(out))
    if multivector is None and encoder.multivector:
        multivector = int(encoder.multivector)
        log.info("the model was trained with --multivector %d: building a multi-vector index with m=%d", multivector,
                 multivector)
    check_multivector_sizes(encoder, multivector, project_dim)  # before any encoding: sizes no model can honour
    projection = None
    if project_dim:
        if not multivector:
            raise TwoTowerError(f"{flag('project')} applies to multi-vector indexes ({flag('multivector')} M)")
        from twotower.retrieval.multivector import random_projection

        projection = random_projection(encoder.doc_tower.dim, project_dim)  # token vectors are in the tower's space
    dim = projection.shape[1] if projection is not None else encoder.doc_tower.dim
    passage_entry = passage_settings(passages, encoder, multivector=multivector)
    check_build(out, spec, cfg, dim=dim, num_docs=len(docs), multivector=multivector)
    new = encode_new_docs(encoder, docs, cfg, multivector=multivector, projection=projection, passages=passage_entry)
    return IndexStore.build(out, new, model=model_info(model, encoder), spec=spec, multivector=multivector,
                            projection=projection, show_progress=cfg.show_progress, passages=passage_entry)


def passage_settings(passages, encoder, *, multivector: int | None = None) -> dict | None:
    """The manifest entry of ``passages`` (True, False / None, or a
    :class:`~twotower.encoders.passages.PassageSpec`) for ``encoder``: checked, the window filled in; None when
    documents are not split. Refused with ME-BERT's multi-vector documents (they are a document's first m tokens)."""
    from twotower.encoders.passages import PassageSpec

    if passages is None or passages is False:
        return None
    if isinstance(passages, dict):  # a manifest entry already (character passages: encoders.text_passages)
        return passages
    if passages is True:
        passages = PassageSpec()
    if not isinstance(passages, PassageSpec):
        raise TwoTowerError(f"{flag('passages')} takes True, False or a PassageSpec, not {type(passages).__name__}")
    if multivector:
        if passages != PassageSpec():  # asked for explicitly
            raise TwoTowerError(f"passages apply to single-vector indexes; a multi-vector index ({flag('multivector')}"
                                f") keeps each document's first m token vectors: drop one of them")
        return None
    return passages.resolved(int(encoder.doc_max_length)).manifest()


def build_milvus_from(docs: list, out: str | Path, encoder, *, model: str | None, spec, cfg, uri: str | None,
                      collection: str | None, passages=False) -> Store:
    """Encode ``docs`` (``Document``s) with ``encoder`` and write a Milvus-backed index at ``out``
    (:meth:`~twotower.retrieval.milvus.store.MilvusStore.build`, which checks the options and the documents' sizes
    again before it writes; ``tt.Index.build`` checks the options before it loads the model). ``passages``: as
    :func:`build_index_from` takes it (a row per passage: :mod:`twotower.retrieval.milvus.passages`)."""
    from twotower.encoders.inference import check_precision
    from twotower.retrieval.milvus.store import MilvusStore

    out = Path(out)
    check_precision(cfg.precision, f"unknown {flag('precision')}")
    if not docs:
        raise TwoTowerError("the corpus holds no documents to index")
    if encoder.multivector:
        raise TwoTowerError(f"this model was trained with {flag('multivector')}; a Milvus index holds one vector per "
                            f"document (use {given('backend', 'faiss')})")
    dim = getattr(encoder, "dim", None)
    if spec.vectors == "binary" and isinstance(dim, int) and dim % 8:
        raise TwoTowerError(f"{given('vectors', 'binary')}: Milvus packs binary vectors 8 dimensions a byte; this "
                            f"model's vectors have {dim}: use {given('vectors', 'int8')} or fp32")
    entry = passage_settings(passages, encoder)
    new = encode_new_docs(encoder, docs, cfg, passages=entry)
    return MilvusStore.build(out, new, model=model_info(model, encoder), spec=spec, uri=uri, collection=collection,
                             show_progress=cfg.show_progress, passages=entry)


def add_documents(
    index: str | Path, docs_path: str | Path, *, replace: bool = False, model: str | None = None,
    cfg: EncodeConfig | None = None,
) -> Store:
    """Encode only the documents in ``docs_path`` (BEIR corpus lines) and add them to ``index``."""
    docs = load_corpus(docs_path)
    return add_documents_from(index, list(docs.values()), replace=replace, model=model, cfg=cfg, source=str(docs_path))


def add_documents_from(
    index: str | Path | Store, docs: list[Document], *, replace: bool = False, model: str | None = None,
    cfg: EncodeConfig | None = None, source: str = "documents", encoder=None, remove: Sequence[str] = (),
) -> Store:
    """Encode ``docs`` (with ``encoder``, a loaded DualEncoder, or the index's own model) and add them to ``index``
    as a new version; ``source`` names them in errors. ``remove``: ids of other documents the same version leaves
    out (one write: :mod:`twotower.retrieval.sync`)."""
    cfg = cfg or EncodeConfig()
    store = open_store(index) if isinstance(index, (str, Path)) else index
    index = store.root
    if hasattr(store, "existing"):  # a Milvus index: batched queries, not one per document
        known = store.existing([d.id for d in docs])
        dup = [d.id for d in docs if d.id in known]
    else:
        dup = [d.id for d in docs if d.id in store.row_of]
    rerun = getattr(store, "wrote", None)  # a Milvus index: this very write committed before a crash (issue #44)
    if dup and rerun and rerun([(d.id, d.title, d.text, getattr(d, "metadata", None) or {}) for d in docs], replace):
        return store.refresh()  # done already: nothing to encode again
    if dup and not replace:
        shown = ", ".join(repr(d) for d in dup[:5]) + (" …" if len(dup) > 5 else "")
        raise TwoTowerError(
            f"{source}: {len(dup)} document id(s) are already in the index {index}: {shown} "
            f"(pass {switch('replace')} to overwrite them)"
        )
    # before spending time encoding: the files a write copies must still match their checksums (the
    # write checks again under the lock)
    store.files.check_all(writing=True, skip=REBUILT)
    from twotower.retrieval.index.encoder_check import check_index_encoder

    info = store.manifest.get("model") or {}
    if encoder is None:  # a --model string: the index's own model or refused (a loaded encoder: its size, below)
        check_index_encoder(index, info, model)
    encoder = encoder or load_encoder(store.manifest["model"], model, cfg.device)
    vectors = store.manifest.get("vectors") or {}
    if not store.multivector:  # the encoder's output size against the stored vectors' (before a projection)
        check_index_encoder(index, info, model, encoder_dim=int(encoder.dim),
                            index_dim=int(vectors.get("source_dim") or store.manifest.get("dim") or encoder.dim))
    new = encode_new_docs(encoder, docs, cfg, multivector=store.multivector, projection=store.projection,
                          passages=getattr(store, "passages", None))
    if remove:
        return store.add(new, replace=replace, show_progress=cfg.show_progress, remove=list(remove))
    return store.add(new, replace=replace, show_progress=cfg.show_progress)
