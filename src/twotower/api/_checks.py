"""The checks :class:`twotower.Index` runs on its callers' options before any work (the one rule for numbers,
:mod:`twotower.checks`; the one check for texts, :mod:`twotower.data.ids`), kept apart from the Index itself."""

from __future__ import annotations

from twotower.checks import check_number, option_name
from twotower.data.ids import check_texts
from twotower.errors import TwoTowerError


def check_build_options(*, multivector, project, batch_size, ray, ray_address, workers, gpus_per_worker) -> None:
    """:meth:`Index.build`'s numbers, and Ray's settings refused without ``ray`` (a local build would ignore them)."""
    for name, value in (("multivector", multivector), ("project", project), ("batch_size", batch_size),
                        ("workers", workers)):
        check_number(value, name, integer=True, minimum=1, optional=True)
    check_number(gpus_per_worker, "gpus_per_worker", minimum=0, maximum=1024)
    if ray:
        return
    unused = [option_name(n).rstrip("=") for n, v in (("ray_address", ray_address), ("workers", workers),
                                                      ("gpus_per_worker", gpus_per_worker or None)) if v is not None]
    if unused:
        raise TwoTowerError(f"{', '.join(unused)} set how Ray encodes; without {option_name('ray').rstrip('=')} the "
                            "build runs here and would ignore them: drop them or turn Ray on")


def check_search_options(queries: list, *, k, rerank_depth, ef_search, nprobe, prf_depth, lam, prf_weight) -> None:
    """:meth:`Index.search`'s numbers and query texts (a lone surrogate named here, not by the tokenizer)."""
    check_texts(queries, "query")
    check_number(k, "k", integer=True, minimum=1, hint="the number of hits")
    for name, value in (("rerank_depth", rerank_depth), ("ef_search", ef_search), ("nprobe", nprobe),
                        ("prf_depth", prf_depth)):
        check_number(value, name, integer=True, minimum=1, optional=True)
    check_number(lam, "lam", minimum=0, maximum=1, optional=True)
    check_number(prf_weight, "prf_weight", above=0, optional=True)


def check_run_queries(queries, k) -> None:
    """:meth:`Index.run`'s ``{query_id: text}`` and ``k``."""
    check_number(k, "k", integer=True, minimum=1)
    if not isinstance(queries, dict):
        raise TwoTowerError(f"queries: a dict {{query_id: text}}, not {type(queries).__name__}")
    check_texts(queries.values(), "queries")
