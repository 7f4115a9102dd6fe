"""What the framework retrievers and stores share: the index they take (an Index or its path), their search options
checked when the retriever is made, a hit's text as twotower joins title and text, and what a hit becomes in a RAG
framework: its best passage (the default) or its whole document (``whole_documents=True``).

A passage travels as the framework's text (LangChain's ``page_content``, LlamaIndex's node text), exactly
``document_text[start:end]``, with the document's metadata as it was given plus one key, :data:`PASSAGE`
(``"passage"``): ``{"document_id", "title", "start", "end", "score", "passage_score"}`` and ``"page"`` when the
passage knows its page (a PDF's). ``start`` and ``end`` count code points (Python string offsets) into the
document's text; ``score`` is the document's search score (what ranked it), ``passage_score`` the passage's own
(None for a document of one passage).
"""

from __future__ import annotations

from pathlib import Path

from twotower.api.index import Hit, Index
from twotower.checks import check_number
from twotower.errors import TwoTowerError
from twotower.retrieval.prf import check_prf

__all__ = ["PASSAGE", "as_index", "call_options", "check_filter", "check_passages", "check_whole_documents",
           "hit_metadata", "hit_passages", "joined_text", "passage_metadata", "passage_place", "search",
           "search_options"]

PASSAGE = "passage"  # the metadata key a passage's place travels under

# the values Index.search documents
MODES = ("dense", "bm25", "hybrid", "rrf")
NORMS = ("minmax", "zscore")


def as_index(index, option: str = "index") -> Index:
    """``index`` itself when it is an :class:`~twotower.Index`; the index opened at it when it is a path."""
    if isinstance(index, Index):
        return index
    if isinstance(index, (str, Path)) and str(index).strip():
        return Index.open(index)
    raise TwoTowerError(f"{option}: give a twotower.Index or the path of an index directory, "
                        f"not {type(index).__name__} {index!r}")


def _whole(name: str, value, minimum: int = 1) -> None:
    check_number(value, name, integer=True, minimum=minimum, optional=True)


def _number(name: str, value, low: float, high: float) -> None:
    check_number(value, name, minimum=low, maximum=None if high == float("inf") else high, optional=True)


def check_breadth(index: Index, ef_search, nprobe) -> None:
    """``ef_search`` / ``nprobe`` against the kind of ``index`` now, as its first search would check them."""
    _whole("ef_search", ef_search)
    _whole("nprobe", nprobe)
    if ef_search is None and nprobe is None:
        return
    store = index.store
    faiss_index = getattr(store, "faiss_index", None)
    if faiss_index is None:
        return  # another backend (Milvus) checks its own search parameters
    if store.codec.vectors == "binary":
        from twotower.retrieval.index.binary import hamming_params

        hamming_params(faiss_index, ef_search, nprobe)
    else:
        from twotower.retrieval.index.kinds import search_params

        search_params(faiss_index, ef_search=ef_search, nprobe=nprobe)


def search_options(index: Index, k, *, mode=None, lam=None, norm=None, prf_depth=None, prf_weight=None, rerank=None,
                   rerank_depth=None, ef_search=None, nprobe=None) -> dict:
    """The options of :meth:`Index.search` checked against ``index`` now, before any query (each error names the
    option), with a re-ranker given as a directory loaded once here rather than on every search."""
    _whole("k", k)
    if mode is not None and mode not in MODES:
        raise TwoTowerError(f"mode {mode!r}: choose one of {', '.join(MODES)} (or leave it out: the model's fitted "
                            "mode, else dense)")
    resolved, _ = index.resolve(mode, lam)
    if lam is not None:
        _number("lam", lam, 0.0, 1.0)
        if resolved != "hybrid":
            raise TwoTowerError(f"lam weighs dense against BM25 in mode hybrid; mode {resolved} does not use it: drop "
                                "it or set mode='hybrid'")
    if norm is not None:
        if norm not in NORMS:
            raise TwoTowerError(f"norm {norm!r}: choose one of {', '.join(NORMS)}")
        if resolved != "hybrid":
            raise TwoTowerError(f"norm normalises the two sides of mode hybrid; mode {resolved} does not use it")
    if resolved != "dense" and not index.info().get("bm25"):
        raise TwoTowerError(f"mode {resolved} needs the index's BM25 part and {index.path} has none: rebuild it with "
                            "bm25=True (twotower index build --bm25) or use mode='dense'")
    _whole("prf_depth", prf_depth)
    _number("prf_weight", prf_weight, 0.0, float("inf"))
    check_prf(prf_depth, prf_weight, mode=resolved)
    _whole("rerank_depth", rerank_depth)
    check_breadth(index, ef_search, nprobe)
    if rerank_depth is not None and rerank is None:
        raise TwoTowerError("rerank_depth sets how many hits rerank re-ranks: pass rerank or drop it")
    if isinstance(rerank, (str, Path)) and str(rerank) != "none":
        from twotower import Reranker

        rerank = Reranker(rerank, device=index.device, precision=index.precision)
    return {"mode": mode, "lam": lam, "norm": norm, "prf_depth": prf_depth, "prf_weight": prf_weight,
            "rerank": rerank, "rerank_depth": rerank_depth, "ef_search": ef_search, "nprobe": nprobe}


def call_options(given, allowed: tuple[str, ...], where: str) -> dict:
    """``given`` (a dict of search settings: ``search_kwargs``, a call's keyword arguments) as a plain dict, each
    key one of ``allowed``; a :class:`TwoTowerError` naming ``where`` and the unknown keys otherwise."""
    if not isinstance(given, dict):
        raise TwoTowerError(f"{where}: a dict of {', '.join(allowed)}, not {type(given).__name__} {given!r}")
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TwoTowerError(f"{where}: unknown option(s) {', '.join(map(str, unknown))}; it takes "
                            f"{', '.join(allowed)}")
    return dict(given)


def check_filter(flt):
    """``flt`` (a metadata filter: :func:`twotower.parse_filter`) checked now, before any query: None when it lets
    every document through, else the filter as given."""
    from twotower.retrieval.filters import parse_filter

    return None if parse_filter(flt).empty else flt


def hit_metadata(hit: Hit) -> dict:
    """A hit's metadata for a framework's document: the document's metadata exactly as it was given (a copy; no key
    added, removed or renamed: the id, score and title travel in the framework's own fields)."""
    import copy

    return copy.deepcopy(hit.metadata)


def search(index: Index, query: str, k: int, options: dict) -> list[Hit]:
    """``index.search(query, k, **options)`` for one non-empty query (the Index runs one search at a time, whichever
    thread or retriever asks: Hugging Face fast tokenizers fail under concurrent calls)."""
    if not isinstance(query, str) or not query.strip():
        raise TwoTowerError(f"query {query!r}: empty or not a string; give the text to search for")
    return index.search(query, k, **options)


def joined_text(hit: Hit) -> str:
    """Title and text as twotower joins them for the document encoder: ``"title text"``, or the text alone."""
    return f"{hit.title} {hit.text}".strip() if hit.title else hit.text


def check_whole_documents(value) -> bool:
    """``whole_documents`` as given: True or False (a framework store's or retriever's choice between a hit's best
    passage, the default, and its whole document)."""
    if not isinstance(value, bool):
        raise TwoTowerError(f"whole_documents: True (each hit's whole document) or False (its best passage, the "
                            f"default), not {type(value).__name__} {value!r}")
    return value


def check_passages(value) -> int:
    """``passages`` as given: how many of each hit's best passages (a whole number, 1 or more)."""
    check_number(value, "passages", integer=True, minimum=1)
    return int(value)


def hit_passages(hit: Hit) -> list:
    """The hit's passages, best first (its whole text as one passage when it carries none)."""
    if hit.passages:
        return list(hit.passages)
    from twotower.retrieval.passages import Passage

    return [Passage(hit.text, 0, len(hit.text))]


def passage_place(doc_id: str, title: str, score: float, passage) -> dict:
    """Where ``passage`` lies and how it scored: ``{"document_id", "title", "start", "end", "score",
    "passage_score"}``, with ``"page"`` when the passage has one."""
    place = {"document_id": doc_id, "title": title, "start": int(passage.start), "end": int(passage.end),
             "score": float(score), "passage_score": None if passage.score is None else float(passage.score)}
    page = getattr(passage, "page", None)
    if page is not None:
        place["page"] = page
    return place


def passage_metadata(doc_id: str, title: str, score: float, passage, metadata: dict) -> dict:
    """A copy of a document's ``metadata`` with the passage's place under :data:`PASSAGE`; a
    :class:`TwoTowerError` when the metadata already holds that key (it would be overwritten)."""
    import copy

    if PASSAGE in metadata:
        raise TwoTowerError(f"document {doc_id!r}: its metadata holds a key {PASSAGE!r}, where a passage's place goes "
                            "(document_id, start, end, score): rename that key, or ask for whole documents "
                            "(whole_documents=True: metadata exactly as stored)")
    return {**copy.deepcopy(metadata), PASSAGE: passage_place(doc_id, title, score, passage)}
