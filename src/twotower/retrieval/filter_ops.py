"""The filter language's ``$not`` and ``$text`` beyond parsing: the text filter's argument, and both as Milvus
expressions with exactly the meaning :meth:`twotower.retrieval.filters.Filter.matches` gives them.

``{"$text": {"$contains": "green tea"}}`` lets through the documents whose text holds the phrase: an exact,
case-sensitive substring of the document's ``text`` (not its title, not its metadata; no analyzer, no stemming:
``"Tea"`` does not find ``"tea"``). Locally it is evaluated by :mod:`twotower.retrieval.text_filter`; on Milvus as
``text like "%phrase%"`` with ``%``, ``_`` and ``\\`` escaped, checked against Milvus Lite by the tests. Milvus' LIKE
reads a backslash followed by a letter as an escape of that letter, so a phrase holding a backslash is refused on a
Milvus index (a :class:`~twotower.DataError`), never answered differently.

``$not``: Milvus evaluates a condition on a missing JSON field (or on a value of another kind) as *unknown*, and
``not unknown`` is unknown, so ``not (metadata["lang"] == "en")`` would skip a document without ``lang`` where
``$not`` lets it through. A negated condition is therefore written as ``not (exists path) or not (condition)``
(``$exists`` alone is never unknown), and ``$not`` over ``$and`` / ``$or`` is pushed down to the conditions (De
Morgan). A negated range (``$gt``…) is exact only where the path holds values of the compared kind (or null, or
nothing): :func:`twotower.retrieval.milvus.filtering.milvus_filter` refuses it on a path that has held others.
"""

from __future__ import annotations

import json
from typing import Any

from twotower.errors import DataError

TEXT_FIELD = "text"  # the Milvus collection's text field


def text_phrase(value: Any) -> str:
    """The phrase of ``{"$text": {"$contains": phrase}}`` (a non-empty string), or a DataError naming ``$text``."""
    example = '{"$text": {"$contains": "green tea"}}'
    if not isinstance(value, dict) or set(value) != {"$contains"}:
        raise DataError("filter", f"$text takes {{\"$contains\": \"phrase\"}}, got "
                        f"{json.dumps(value, default=str)[:60]}", field="$text", hint=f"e.g. {example}")
    phrase = value["$contains"]
    if not isinstance(phrase, str) or not phrase:
        raise DataError("filter", "$text.$contains takes a non-empty string, got "
                        f"{json.dumps(phrase, default=str)[:60]}", field="$text.$contains", hint=f"e.g. {example}")
    return phrase


def text_expr(phrase: str, negated: bool = False) -> str:
    """``text like "%phrase%"`` (escaped), or its negation; a phrase with a backslash is refused (module docstring)."""
    if "\\" in phrase:
        raise DataError("filter", "a $text phrase holding a backslash cannot be matched exactly on a Milvus index "
                        "(Milvus' LIKE reads \\x as an escape)", field="$text.$contains",
                        hint="leave the backslash out of the phrase, or use the local backend")
    pattern = "%" + phrase.replace("%", "\\%").replace("_", "\\_") + "%"
    expr = f"{TEXT_FIELD} like {json.dumps(pattern, ensure_ascii=False)}"
    return f"not ({expr})" if negated else expr


def negated_expr(expr: str, op: str, target: str) -> str:
    """The negation of one condition's Milvus expression ``expr`` (on the JSON path ``target``), never unknown:
    ``$exists`` negates as is, every other operator also lets through the documents that lack the path."""
    if op == "$exists":
        return f"not ({expr})"
    return f"(not (exists {target}) or not ({expr}))"


__all__ = ["TEXT_FIELD", "negated_expr", "text_expr", "text_phrase"]
