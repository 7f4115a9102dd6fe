"""What a split's judgements allow to be measured, checked before its metrics are reported.

- Every grade lies in a sane range (:func:`twotower.data.grades.check_grade`: the loader checks files line by line,
  this checks qrels built in memory, e.g. by ``Dataset.from_lists``).
- Something is relevant: qrels whose grades are all ≤ 0 make every metric 0 whatever the retriever; refused.
- Warnings (counted): judged queries with no relevant document (each scores 0 and pulls the means down), and
  relevant documents whose id equals their query's id, which BEIR's rule (:func:`metrics.drop_identical_ids`)
  drops from every ranking, so they can never be found.
"""

from __future__ import annotations

from pathlib import Path

from twotower.checks import flag
from twotower.data.grades import check_grade
from twotower.errors import DataError

Qrels = dict[str, dict[str, int]]
SHOWN = 5  # ids named in a warning


def _named(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def check_judgements(qrels: Qrels, source: str | Path, *, ignore_identical_ids: bool = True) -> list[str]:
    """Raise :class:`DataError` (naming ``source``, the qrels file) for a grade out of range or for qrels where
    nothing is relevant; return warnings for what the metrics would otherwise hide."""
    for qid, rels in qrels.items():
        for did, grade in rels.items():
            check_grade(grade, source, where=f"query {qid!r}, document {did!r}: ")
    judged = [q for q, rels in qrels.items() if rels]
    relevant = sum(grade > 0 for rels in qrels.values() for grade in rels.values())
    if judged and not relevant:
        raise DataError(source, f"none of the {sum(len(r) for r in qrels.values())} judgements has a score > 0: "
                        "nothing is relevant, so every metric would be 0 whatever the retriever",
                        hint="relevant documents are graded 1 or more; check the score column or the "
                             f"{flag('split')}")
    warnings = []
    empty = sorted(q for q in judged if not any(grade > 0 for grade in qrels[q].values()))
    if empty:
        warnings.append(f"{source}: {len(empty)} of {len(judged)} judged queries have no relevant document (every "
                        f"grade ≤ 0): they score 0 in every metric and lower the means ({_named(empty)})")
    if ignore_identical_ids:
        same = sorted(q for q, rels in qrels.items() if rels.get(q, 0) > 0)
        if same:
            warnings.append(f"{source}: {len(same)} relevant judgement(s) name a document with its query's own id "
                            f"({_named(same)}): BEIR's identical-id rule drops such a document from every ranking, "
                            "so it is never found and the metrics count it as missed")
    return warnings
