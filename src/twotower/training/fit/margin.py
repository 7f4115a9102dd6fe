"""Mining with the model, guarded against false negatives by a relative margin.

A retrieved document that the qrels do not judge may still be relevant (an unjudged positive): trained on as a
negative, it teaches the model the wrong thing. The guard: a candidate is skipped when it scores within a relative
``margin`` of the pair's positive, or above it::

    skip  ⇔  s(q, c) ≥ s(q, p) − margin · |s(q, p)|

How wide a margin should be is measured on dev queries, whose judgements are all known, as a stand-in for
unjudged positives: for each dev query with two or more judged positives, each positive in turn plays the
pair's positive and the others, where they rank within the mining ranks a..b, play unjudged positives. For each
margin in the grid we count the share of those that the rule skips (``false_negatives_skipped``: higher is
safer) and the share of the judged-irrelevant candidates in ranks a..b it skips too (``negatives_skipped``: the
cost, hard negatives lost), and keep the margin with the largest difference (Youden's J; ties: the smaller
margin). With no such dev pair the rule runs at margin 0 (skip only candidates scoring above the positive).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from twotower.data.pairs import TrainExample

Ranking = list[tuple[str, float]]  # (doc id, score), best first


def inside_margin(candidate: float, positive: float, margin: float) -> bool:
    """True when ``candidate`` scores within a relative ``margin`` of ``positive`` or above it (skip it)."""
    return candidate >= positive - margin * abs(positive)


def measure_margins(
    rankings: Mapping[str, Ranking], positives: Mapping[str, Mapping[str, float]], margins: Sequence[float],
    rank_range: tuple[int, int],
) -> dict:
    """The dev table described in the module docstring: ``{"pairs", "candidates", "by_margin": {m: {...}}}``.

    ``rankings``: each dev query's ranking (at least ``rank_range[1]`` deep); ``positives``: each dev query's
    judged positives with the model's score for each (whether retrieved or not)."""
    a, b = rank_range
    fn_pairs: list[tuple[float, float]] = []  # (unjudged-positive stand-in score, pair positive score)
    neg_pairs: list[tuple[float, float]] = []
    for q, ranking in rankings.items():
        pos = positives.get(q, {})
        window = ranking[a - 1 : b]
        for anchor, s_anchor in pos.items():
            for doc, score in window:
                if doc == anchor:
                    continue
                (fn_pairs if doc in pos else neg_pairs).append((score, s_anchor))
    table = {}
    for m in margins:
        fn = sum(inside_margin(c, p, m) for c, p in fn_pairs)
        neg = sum(inside_margin(c, p, m) for c, p in neg_pairs)
        table[float(m)] = {
            "false_negatives_skipped": round(fn / len(fn_pairs), 4) if fn_pairs else None,
            "negatives_skipped": round(neg / len(neg_pairs), 4) if neg_pairs else None,
        }
    return {"pairs": len(fn_pairs), "candidates": len(neg_pairs), "by_margin": table}


def choose_margin(measured: dict) -> tuple[float, str]:
    """(margin, why) from :func:`measure_margins`' table."""
    table = measured["by_margin"]
    if not measured["pairs"]:
        return 0.0, "no dev query has a second judged positive within the mining ranks: margin 0 (skip only candidates above the positive)"

    def youden(m: float) -> float:
        row = table[m]
        return (row["false_negatives_skipped"] or 0.0) - (row["negatives_skipped"] or 0.0)

    best = max(sorted(table), key=lambda m: (round(youden(m), 10), -m))
    row = table[best]
    return best, (f"largest (dev false negatives skipped − dev negatives skipped) = {row['false_negatives_skipped']} − "
                  f"{row['negatives_skipped']} over {measured['pairs']} dev positive pairs")


def mine_negatives(
    examples: Sequence[TrainExample], rankings: Mapping[str, Ranking], positive_scores: Mapping[tuple[str, str], float],
    judged: Mapping[str, Mapping[str, int]], doc_text, *, margin: float, rank_range: tuple[int, int],
    per_query: int, seed: int, at_least: int = 1, corpus_ids: Sequence[str] = (),
) -> tuple[list[TrainExample], dict]:
    """Each example with up to ``per_query`` negatives sampled from its query's ranks a..b: never a judged
    document of the query, never one inside the ``margin`` of the example's positive. An example left with
    fewer than ``at_least`` is topped up with random unjudged documents of ``corpus_ids`` (the loss needs them).
    Returns the examples and counts (candidates seen, skipped as judged, skipped by the margin, topped up)."""
    a, b = rank_range
    rng = random.Random(seed)
    out, seen, judged_skip, margin_skip, empty = [], 0, 0, 0, 0
    for ex in examples:
        s_pos = positive_scores[(ex.qid, ex.pid)]
        pool = []
        for doc, score in rankings.get(ex.qid, [])[a - 1 : b]:
            seen += 1
            if doc == ex.pid or doc in judged.get(ex.qid, {}):
                judged_skip += 1
            elif inside_margin(score, s_pos, margin):
                margin_skip += 1
            else:
                pool.append(doc)
        chosen = rng.sample(pool, min(per_query, len(pool)))
        if len(chosen) < at_least and corpus_ids:
            empty += 1
            for _ in range(100 * at_least):
                doc = rng.choice(corpus_ids)
                if doc != ex.pid and doc not in judged.get(ex.qid, {}) and doc not in chosen:
                    chosen.append(doc)
                if len(chosen) >= at_least:
                    break
        out.append(replace(ex, negatives=[doc_text(d) for d in chosen], negative_ids=chosen))
    stats = {"examples": len(out), "candidates": seen, "skipped_judged": judged_skip,
             "skipped_by_margin": margin_skip, "examples_topped_up_at_random": empty}
    return out, stats
