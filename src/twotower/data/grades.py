"""The range a relevance grade (a qrels score) can sanely take, checked where qrels come in.

Real collections grade from -2 (TREC's spam) to 4 or so; a grade of 10¹² or -5·10⁹ is a wrong column or a
corrupted file, and pytrec_eval (C ints) turns such numbers into all-zero metrics without a word."""

from __future__ import annotations

from pathlib import Path

from twotower.errors import DataError

MIN_GRADE = -100
MAX_GRADE = 100


def check_grade(score: int, path: str | Path, line: int | None = None, *, where: str = "") -> int:
    """``score`` when it lies within ``MIN_GRADE``..``MAX_GRADE``; a :class:`DataError` naming the file, line and
    field (and ``where``: the query and document) otherwise."""
    if isinstance(score, bool) or not isinstance(score, int):
        raise DataError(path, f"{where}relevance grade {score!r} is not an integer", line=line, field="score")
    if not MIN_GRADE <= score <= MAX_GRADE:
        raise DataError(path, f"{where}relevance grade {score} is outside any sane range ({MIN_GRADE} to {MAX_GRADE})",
                        line=line, field="score",
                        hint="qrels grade relevance with small integers such as 0, 1, 2; check the column order "
                             "query-id, corpus-id, score")
    return score
