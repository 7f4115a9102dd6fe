"""What no backend takes in a filter, refused before any work: the limits on a filter's size, numbers beyond float
range, lone surrogates, and comparing with null.

:func:`check_filter` walks a filter's raw JSON (a dict, lists, values) once, without recursion, before
:func:`twotower.retrieval.filters.parse_filter` builds anything, and stops at the first problem, so a filter of
any size or depth costs at most :data:`MAX_FILTER_PARTS` steps to refuse. The same
check runs on every surface (Python, the command line, the HTTP service, LangChain / LlamaIndex) and on every
backend (local and Milvus), since each parses its filter with ``parse_filter``:

- **depth**: ``$and`` / ``$or`` / ``$not`` nest at most :data:`MAX_FILTER_DEPTH` (32) levels (Milvus's own parser
  gives up at about 200 nested ``$or``, Python's at about 500), and a value at most :data:`MAX_VALUE_DEPTH` (32), as
  metadata;
- **conditions**: at most :data:`MAX_FILTER_CONDITIONS` (1,024) field conditions in all (one per operator on a
  field: ``{"year": {"$gte": 1, "$lt": 5}}`` is two), wherever they sit (under ``$and``, ``$or`` or ``$not``);
- **parts**: at most :data:`MAX_FILTER_PARTS` (20,480) objects, lists, keys and values in all, so that what a
  parser would refuse anyway (lists of lists, objects of many keys) costs no more to refuse;
- **lists**: the ``$in`` / ``$nin`` lists hold at most :data:`MAX_FILTER_VALUES` (4,096) values in all;
- **numbers** lie within float range (about ±1.8e308; a whole number of hundreds of digits is refused, named);
- **strings** (keys and values) hold no lone surrogate: it cannot be encoded as UTF-8, so no document can hold it
  (metadata refuses it too) and Milvus cannot be sent it;
- **null** is no value to compare with (``$eq $ne $in $nin``), on any backend and under ``$not`` as anywhere: Milvus
  reads a JSON null as a missing field, so no expression there can tell them apart. ``{"f": {"$exists": false}}``
  finds documents without ``f``.

A file given as ``--filter @FILE`` is read only when it is a regular file of at most 1 MiB
(``twotower.cli.helpers.read_filter_file``).
"""

from __future__ import annotations

import sys
from typing import Any

from twotower.data.ids import text_problem
from twotower.data.metadata import kind, not_json_hint, type_name
from twotower.errors import DataError

MAX_FILTER_DEPTH = 32
MAX_VALUE_DEPTH = 32
MAX_FILTER_CONDITIONS = 1024
MAX_FILTER_VALUES = 4096
# every object, list and value a filter holds, counted: a filter within the limits above holds at most about 6,200
# (1,024 conditions, each a branch object and a value, and 4,096 list values); what holds more is refused after at
# most this many steps, whatever is inside (nested lists, objects of many keys), before the parser sees it
MAX_FILTER_PARTS = 4 * (MAX_FILTER_CONDITIONS + MAX_FILTER_VALUES)
_FLOAT_MAX = sys.float_info.max
_LOGICAL = ("$and", "$or")
_NULL_REFUSED = ("$eq", "$ne", "$in", "$nin")


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes: safe to print and to send as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _fail(message: str, field: str, hint: str | None = None) -> DataError:
    return DataError("filter", message, field=printable(field), hint=hint)


def _check_string(text: str, field: str, what: str) -> None:
    problem = text_problem(text)
    if problem:
        raise _fail(f"{what} {printable(problem)}", field, "no document can hold it (metadata refuses it too)")


def _check_leaf(value: Any, field: str, op: str | None) -> None:
    if value is None and op in _NULL_REFUSED:
        raise _fail(f"{op} compares with null, which no backend can answer the same way (Milvus reads a null as a "
                    "missing field)", field, f"find documents without the field with {{\"{field.rsplit('.', 1)[0]}\": "
                    "{\"$exists\": false}}; store a value other than null to mean 'none'")
    if isinstance(value, int) and not isinstance(value, bool) and not -_FLOAT_MAX <= value <= _FLOAT_MAX:
        raise _fail(f"the number {str(value)[:12]}... ({len(str(abs(value)))} digits) is beyond float range "
                    "(about ±1.8e308): no metadata number can compare with it", field, "give a smaller number")
    if isinstance(value, str):
        _check_string(value, field, "the value")
    if kind(value) == "other":
        raise _fail(f"a value of type {type_name(value)} is not JSON", field, not_json_hint(value))


def check_filter(obj: Any) -> None:
    """Refuse, before any parsing or search, a filter over the limits above or holding a value no backend can
    compare with: a :class:`~twotower.DataError` whose ``field`` names the place (``year.$in[3]``, ``$or``).

    Every operator's operand is walked by the same rules wherever it sits: ``$and`` / ``$or`` take a list of
    filters and ``$not`` one filter, each a level deeper (:data:`MAX_FILTER_DEPTH` in all), whose conditions count
    towards :data:`MAX_FILTER_CONDITIONS` and whose values meet the null rule, as at the top.

    Example::

        from twotower.retrieval.filters.checks import check_filter

        check_filter({"$or": [{"year": {"$gte": 2020}}, {"tags": {"$in": ["tea", "mate"]}}]})  # passes
    """
    conditions = values = parts = 0
    # (node, depth, field name for messages, the operator that holds node, whether node is a filter object); depth
    # counts $and / $or / $not levels for a filter object, and levels of nesting inside a field's value otherwise
    stack: list[tuple[Any, int, str, str | None, bool]] = [(obj, 0, "filter", None, True)]
    while stack:
        node, depth, field, op, is_filter = stack.pop()
        if is_filter and depth > MAX_FILTER_DEPTH:
            raise _fail(f"$and / $or / $not nested deeper than {MAX_FILTER_DEPTH} levels", field,
                        "flatten it: $and / $or take many filters in one list")
        if not is_filter and depth > MAX_VALUE_DEPTH and isinstance(node, (dict, list, tuple)):
            raise _fail(f"a value nested deeper than {MAX_VALUE_DEPTH} levels", field, "compare with one value")
        if isinstance(node, (list, tuple)) or (isinstance(node, dict) and not is_filter):  # a filter object's
            parts += len(node)  # keys are conditions, counted as such
            if parts > MAX_FILTER_PARTS:
                raise _fail(f"more than {MAX_FILTER_PARTS:,} parts (filters, operators, keys and values) in all",
                            field, "a field compares with one value, $in / $nin with one flat list: select with "
                            "fewer conditions")
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    continue  # the parser names it
                if not is_filter:
                    _check_string(key, field, "a key")
                    stack.append((value, depth + 1, f"{field}.{key}", None, False))
                elif key in _LOGICAL:
                    if isinstance(value, (list, tuple)):  # anything else: the parser names it
                        if len(value) > MAX_FILTER_CONDITIONS:
                            raise _fail(f"{key} lists {len(value):,} filters, more than the "
                                        f"{MAX_FILTER_CONDITIONS:,} conditions a filter may hold", key,
                                        "select with fewer conditions, e.g. one $in list instead of many $or "
                                        "branches")
                        stack.extend((v, depth + 1, f"{key}[{i}]", key, True) for i, v in enumerate(value))
                elif key == "$not":
                    if isinstance(value, dict):  # anything else: the parser names it
                        stack.append((value, depth + 1, key, key, True))
                else:  # a field, $text, or an unknown operator (the parser names it): its operators' operands
                    _check_string(key, key, "the field name")
                    if isinstance(value, dict) and value and all(isinstance(k, str) and k.startswith("$")
                                                                 for k in value):
                        for sub_op, sub in value.items():
                            conditions += 1
                            stack.append((sub, 1, f"{key}.{sub_op}", sub_op, False))
                    else:
                        conditions += 1
                        stack.append((value, 1, key if isinstance(value, dict) else f"{key}.$eq", "$eq", False))
                    if conditions > MAX_FILTER_CONDITIONS:
                        raise _fail(f"more than {MAX_FILTER_CONDITIONS:,} conditions (one per operator on a field)",
                                    key, "select with fewer conditions, e.g. one $in list instead of many $or "
                                    "branches")
        elif isinstance(node, (list, tuple)):
            if len(node) > MAX_FILTER_VALUES:
                raise _fail(f"a list of {len(node):,} values, more than {MAX_FILTER_VALUES:,}", field,
                            "select with fewer values")
            if op in ("$in", "$nin") and depth == 1:
                values += len(node)
                if values > MAX_FILTER_VALUES:
                    raise _fail(f"more than {MAX_FILTER_VALUES:,} values in $in / $nin lists in all", field,
                                "select with fewer values")
            stack.extend((v, depth + 1, f"{field}[{i}]", op, False) for i, v in enumerate(node))
        elif not is_filter:
            _check_leaf(node, field.rsplit("[", 1)[0] if op in ("$in", "$nin") and depth == 2 else field, op)


def load_filter_text(text: str) -> Any:
    """A filter given as JSON text, decoded; a :class:`~twotower.DataError` (field ``filter``) for text that is not
    JSON, nests deeper than Python's JSON reader goes, or holds a number of more than 4,300 digits."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"not JSON: {exc.msg} at column {exc.colno}", "filter") from None
    except RecursionError:
        raise _fail(f"nested too deep for JSON text ($and / $or nest at most {MAX_FILTER_DEPTH} levels)", "filter",
                    "flatten it: $and / $or take many filters in one list") from None
    except ValueError as exc:  # Python's limit on the digits of a whole number
        raise _fail(f"holds a number of more than 4,300 digits, beyond float range ({exc})", "filter",
                    "give a smaller number") from None


__all__ = ["MAX_FILTER_CONDITIONS", "MAX_FILTER_DEPTH", "MAX_FILTER_PARTS", "MAX_FILTER_VALUES", "MAX_VALUE_DEPTH",
           "check_filter", "load_filter_text", "printable"]
