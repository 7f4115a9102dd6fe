"""The checks :class:`twotower.Index` runs on its callers' options before any work (the one rule for numbers,
:mod:`twotower.checks`; the one check for texts, :mod:`twotower.data.ids`), kept apart from the Index itself."""

from __future__ import annotations

from twotower.checks import check_number
from twotower.data.ids import check_texts
from twotower.errors import TwoTowerError


def check_build_options(*, multivector, project, batch_size) -> None:
    """:meth:`Index.build`'s numbers (Ray's settings: :class:`twotower.api.build_specs.Ray`)."""
    for name, value in (("multivector", multivector), ("project", project), ("batch_size", batch_size)):
        check_number(value, name, integer=True, minimum=1, optional=True)


def check_search_options(queries: list, *, k, rerank_depth, ef_search, nprobe, prf_depth, lam, prf_weight) -> None:
    """:meth:`Index.search`'s numbers and query texts (a lone surrogate named here, not by the tokenizer)."""
    check_texts(queries, "query")
    check_number(k, "k", integer=True, minimum=1, hint="the number of hits", option="--top-k")
    for name, value in (("rerank_depth", rerank_depth), ("ef_search", ef_search), ("nprobe", nprobe),
                        ("prf_depth", prf_depth)):
        check_number(value, name, integer=True, minimum=1, optional=True)
    check_number(lam, "lam", minimum=0, maximum=1, optional=True, option="--lambda")
    check_number(prf_weight, "prf_weight", above=0, optional=True)


def check_run_queries(queries, k) -> None:
    """:meth:`Index.run`'s ``{query_id: text}`` and ``k``."""
    check_number(k, "k", integer=True, minimum=1)
    if not isinstance(queries, dict):
        raise TwoTowerError(f"queries: a dict {{query_id: text}}, not {type(queries).__name__}")
    check_texts(queries.values(), "queries")


def resolve_search(searcher, mode, lam, norm, *, has_text: bool, rerank, passages) -> tuple[str, float]:
    """``(mode, λ)`` an :meth:`Index.search <twotower.Index.search>` runs with (a fitted model's own unless given),
    after refusing the options that mode would not use."""
    asked_lam = lam
    mode, lam = searcher.resolve(mode if mode is not None or has_text else "dense", lam)  # a vector alone: dense
    if asked_lam is not None and mode != "hybrid":
        raise TwoTowerError(f"lambda weighs dense against BM25 in mode hybrid; mode {mode} does not use it: drop "
                            "it or search with mode='hybrid'")
    if norm is not None and mode != "hybrid":
        raise TwoTowerError(f"norm normalises the two sides of mode hybrid; mode {mode} does not use it")
    if not has_text and (mode != "dense" or rerank is not None):
        raise TwoTowerError(f"query_vector alone searches the dense side; mode {mode}"
                            f"{' and rerank' if rerank is not None else ''} need the query's text: give query too")
    check_number(passages, "passages", integer=True, minimum=1)
    return mode, lam


def index_folder(path):
    """``path`` as an index folder: a str or path-like as it is, an open :class:`~twotower.Index` as its folder;
    anything else refused naming the parameter."""
    import os

    if hasattr(path, "path") and hasattr(path, "store"):  # an open Index (typed by what it has: no import upward)
        return path.path
    if not isinstance(path, (str, os.PathLike)):
        raise TwoTowerError(f"path: an index folder (a str or pathlib.Path) or an open tt.Index, not "
                            f"{type(path).__name__}")
    return path
