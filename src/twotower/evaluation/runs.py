"""TREC run files: ``qid Q0 docid rank score tag``, one line per retrieved document."""

from __future__ import annotations

from pathlib import Path

from twotower.data.ids import first_bad_id
from twotower.errors import DataError
from twotower.io import atomic_write_text

Run = dict[str, dict[str, float]]


def format_run(run: Run, tag: str = "twotower") -> str:
    lines = []
    for qid, docs in run.items():
        ranked = sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)
        for rank, (did, score) in enumerate(ranked, start=1):
            lines.append(f"{qid} Q0 {did} {rank} {score:.9g} {tag}")  # 9 digits: float32 round-trips
    return "\n".join(lines) + ("\n" if lines else "")


def write_run(run: Run, path: str | Path, tag: str = "twotower") -> None:
    if any(c.isspace() for c in tag):
        raise ValueError(f"run tag '{tag}' must not contain whitespace")
    bad = first_bad_id(run) or first_bad_id(d for docs in run.values() for d in docs)
    if bad:  # a line 'qid Q0 docid rank score tag' split on whitespace would read other columns
        raise DataError(path, f"cannot write the TREC run: id {bad[0]!r} {bad[1]}")
    atomic_write_text(path, format_run(run, tag))


def read_run(path: str | Path) -> Run:
    """``{query_id: {doc_id: score}}`` from a TREC run file. A document listed twice for one query is refused,
    naming both lines (which score would count is not for the reader to guess), as is a score that is not a finite
    number; blank lines are skipped."""
    import math

    from twotower.io import read_input_text

    path = Path(path)
    run: Run = {}
    first_line: dict[tuple[str, str], int] = {}
    text = read_input_text(path, what="TREC run file", limit=4 << 30)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise DataError(path, f"expected 6 columns 'qid Q0 docid rank score tag', got {len(parts)}", line=number)
        qid, _, did, _, score, _ = parts
        try:
            value = float(score)
        except ValueError:
            raise DataError(path, f"score must be a number, got '{score}'", line=number, field="score") from None
        if not math.isfinite(value):
            raise DataError(path, f"score must be a finite number, got '{score}'", line=number, field="score")
        if (qid, did) in first_line:
            raise DataError(path, f"document '{did}' is listed twice for query '{qid}' (first on line "
                                  f"{first_line[qid, did]}): a run ranks each document once per query; keep one "
                                  "line", line=number, field="docid")
        first_line[qid, did] = number
        run.setdefault(qid, {})[did] = value
    return run
