"""Hard-negative mining: retrieve for each training query, drop every judged positive, and
sample negatives from ranks a..b (ANCE / Contriever style)."""

from __future__ import annotations

import logging
import random
from dataclasses import replace

from twotower.data.beir import BeirDataset
from twotower.data.pairs import TrainExample
from twotower.checks import flag, given
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)


def retrieve_for_mining(ds: BeirDataset, retriever: str, *, model=None, depth: int = 100, precision: str = "auto",
                        show_progress: bool = True, language: str = "en") -> dict[str, list[str]]:
    """Ranked doc ids (best first) for every query of ``ds`` with ``bm25`` (its text analysis for
    ``language``) or ``model`` (a DualEncoder)."""
    doc_ids = list(ds.corpus)
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    if retriever == "bm25":
        from twotower.retrieval.bm25 import BM25, BM25Params

        bm = BM25(BM25Params(language=language)).index(doc_ids, [ds.corpus[d].full_text for d in doc_ids], show_progress=show_progress)
        run = bm.search_run(qids, queries, depth, show_progress=show_progress)  # matching documents only
        return {qid: list(docs) for qid, docs in run.items()}  # best first
    elif retriever == "model":
        if model is None:
            raise ValueError("mining with 'model' needs a model")
        from twotower.encoders.towers import EncodeOptions
        from twotower.retrieval.dense import exact_search

        opts = EncodeOptions(precision=precision, show_progress=show_progress)
        d = model.encode_documents([ds.corpus[x].full_text for x in doc_ids], opts)
        q = model.encode_queries(queries, opts)
        _, idx = exact_search(q, d, depth)
    else:
        raise ValueError(f"unknown mining retriever '{retriever}': choose bm25 or model")
    return {qid: [doc_ids[j] for j in row] for qid, row in zip(qids, idx)}


def add_hard_negatives(
    examples: list[TrainExample],
    ds: BeirDataset,
    ranked: dict[str, list[str]],
    *,
    num_negatives: int = 4,
    rank_range: tuple[int, int] = (3, 50),
    seed: int = 0,
) -> list[TrainExample]:
    """Give each example up to ``num_negatives`` documents sampled from ranks ``a..b`` (1-based,
    inclusive) of its query's ranking, never one judged relevant to that query."""
    a, b = rank_range
    if not 1 <= a <= b:
        raise ValueError(f"rank range must satisfy 1 <= a <= b, got {a}..{b}")
    if a > len(ds.corpus):
        raise TwoTowerError(f"{given('rank_from', a)}: the collection has only {len(ds.corpus)} documents, so ranks "
                            f"{a}..{b} hold none to sample negatives from; give {flag('rank_from')} at most "
                            f"{len(ds.corpus)}")
    rng = random.Random(seed)
    out = []
    short = none = 0
    for ex in examples:
        positives = set(ds.qrels.get(ex.qid, {})) | {ex.pid}
        pool = [d for d in ranked.get(ex.qid, [])[a - 1 : b] if d not in positives]
        chosen = rng.sample(pool, min(num_negatives, len(pool)))
        short += len(chosen) < num_negatives
        none += not chosen
        out.append(replace(ex, negatives=[ds.corpus[d].full_text for d in chosen], negative_ids=chosen))
    if out and none == len(out):
        raise TwoTowerError(f"ranks {a}..{b}: no example got a negative (the rankings hold only judged positives "
                            f"there, or end before rank {a}: {len(ds.corpus)} documents); lower {flag('rank_from')}")
    if short:
        log.warning("ranks %d..%d: %d of %d examples got fewer than %d negatives (%d got none): the rankings end "
                    "before rank %d or hold judged positives there (%d documents); widen %s/%s",
                    a, b, short, len(out), num_negatives, none, b, len(ds.corpus), flag("rank_from"), flag("rank_to"))
    return out
