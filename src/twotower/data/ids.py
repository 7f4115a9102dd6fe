"""The one rule for document and query ids, and the one check for text, that every way in applies.

An id travels through formats that split on whitespace or end a record at a newline: TREC run files
(``qid Q0 docid rank score tag``, space-separated), qrels (tab-separated), JSON lines, HTTP paths. So an id is a
non-empty string of printable characters without whitespace; the BEIR loader, the service's request models, the
index writer and the run writer all call :func:`id_problem`, so an id one of them takes every other one takes too.

Text (titles, document and query texts) may hold anything Unicode can encode; a lone surrogate (a JSON escape
such as ``"\\ud800"`` without its pair) cannot be encoded as UTF-8, so it is refused where the text comes in
(:func:`text_problem`), not found by a codec error deep in the tokenizer or the index writer.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")
# whitespace (str.isspace: spaces, tabs, newlines, NBSP, U+2028 ...), C0/C1 controls, DEL
_NOT_IN_ID = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")

# the longest id, in bytes of UTF-8, anywhere: files, the index, the service's paths and bodies, Milvus (whose
# primary key holds at most this much); a longer id is refused where it comes in, so none is stored that some way
# out (GET /documents/{id}) could not name
MAX_ID_BYTES = 1024

ID_RULE = ("an id is one token of printable characters: no spaces, tabs, newlines or control characters "
           "(TREC run files and qrels split on them); e.g. replace spaces with '_'")


def _describe(ch: str) -> str:
    return f"{ch!r} (U+{ord(ch):04X})"


MAX_TEXT_CHARS = 4_000_000  # one text (a document's, a title, a query): the limit Python, the CLI and HTTP share


def document_text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a document's text, title or a query (longer than :data:`MAX_TEXT_CHARS`, or
    :func:`text_problem`), or None when it can."""
    if len(text) > MAX_TEXT_CHARS:
        return (f"is {len(text):,} characters long, over the limit of {MAX_TEXT_CHARS:,} for one text: split it into "
                "several documents")
    return text_problem(text)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored (a lone surrogate, with its position), or None when it can."""
    bad = _SURROGATE.search(text)
    if bad is None:
        return None
    return (f"holds a lone surrogate {_describe(bad.group())} at character {bad.start() + 1}: not valid Unicode "
            "(a JSON escape such as \\ud800 without its pair); fix or drop the character")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be an id, or None when it can (see :data:`ID_RULE`)."""
    if not value:
        return "is empty"
    if not value.strip():
        return f"is blank ({len(value)} whitespace characters)"
    surrogate = text_problem(value)
    if surrogate:
        return surrogate
    bad = _NOT_IN_ID.search(value)
    if bad is not None:
        return f"holds {_describe(bad.group())} at character {bad.start() + 1}: {ID_RULE}"
    size = len(value.encode("utf-8"))
    if size > MAX_ID_BYTES:
        return f"is {size} bytes long (UTF-8): an id is at most {MAX_ID_BYTES} bytes"
    return None


def first_bad_id(ids) -> tuple[str, str] | None:
    """The first ``(id, problem)`` among ``ids`` that breaks the rule, or None."""
    for value in ids:
        problem = id_problem(value)
        if problem:
            return value, problem
    return None


def check_texts(texts, what: str) -> list[str]:
    """``texts`` as a list when each is a string the tokenizer can take, else a :class:`TwoTowerError` naming the
    first bad one as ``what[i]`` (not a string, or holding a lone surrogate: see :func:`text_problem`)."""
    from twotower.errors import TwoTowerError

    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TwoTowerError(f"{what}[{i}]: a text is a string, got {type(text).__name__}")
        problem = text_problem(text)
        if problem:
            raise TwoTowerError(f"{what}[{i}] {problem}")
    return texts
