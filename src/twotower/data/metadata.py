"""Documents as users have them: content ids for plain strings, and the metadata a document carries.

A document's **metadata** is a JSON object whose values are strings, numbers, booleans, null, lists and nested
objects, kept apart from the document's id, title and text: its own namespace. It is stored with the document in
the index (``docs.jsonl``), comes back exactly as given on every hit (no key added, removed or renamed) and can be
filtered on (:mod:`twotower.retrieval.filters`). Given beside the document (``metadatas=``, a
:class:`~twotower.Document`'s ``metadata``, HTTP's ``"metadata"``), any key is allowed, ``id``, ``text``, ``title``
and ``score`` included. Only the **flat form**, one JSON object per document (``{"_id", "title", "text", ...}``: a
``corpus.jsonl`` line, a dict in a list), mixes the two: there the keys :data:`FLAT_KEYS` are the document's own
fields and every other key is metadata, so metadata holding one of them cannot be written flat: a
:class:`~twotower.DataError` naming the key (:func:`flat_document`), never a silent overwrite. The rules, checked
before anything is encoded or written:

- keys are non-empty strings;
- values are JSON: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list``/``tuple`` (stored as a list) and
  ``dict`` with string keys; not sets, bytes, dates or other objects; numbers are finite (no NaN, no ±inf) and
  integers lie within ±2**53 (numbers compare as float64; keep larger ids as strings); nesting at most
  :data:`MAX_DEPTH` levels;
- one document's metadata takes at most :data:`MAX_METADATA_BYTES` (64 KiB) as UTF-8 JSON.

A plain string gets its id from its content: :func:`document_id` (``"doc-"`` and the first 16 hex digits of the
SHA-256 of the text), so the same text always gets the same id and adding it twice is detected as a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from twotower.data.ids import text_problem
from twotower.errors import DataError

FLAT_KEYS = ("_id", "id", "title", "text")  # a flat document's own fields: not metadata keys there
MAX_METADATA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_INT = 2**53


def document_id(text: str) -> str:
    """The id a document given as a plain string gets: ``"doc-"`` + the first 16 hex digits of the SHA-256 of its
    UTF-8 text (deterministic: the same text, the same id).

    Example::

        import twotower as tt

        assert tt.document_id("Green tea is steamed.") == tt.document_ids(["Green tea is steamed."])[0]
    """
    return "doc-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def document_ids(texts: Sequence[str]) -> list[str]:
    """The ids :meth:`Index.build <twotower.Index.build>` / :meth:`Index.add <twotower.Index.add>` give a list of
    plain strings (:func:`document_id` of each), known before adding them.

    Example::

        ids = tt.document_ids(["Green tea is steamed.", "Coffee is roasted."])
        assert len(set(ids)) == 2 and ids[0].startswith("doc-")
    """
    if isinstance(texts, str):
        raise DataError("texts", "expected a list of strings, got one string", hint="wrap it in a list: [text]")
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DataError(f"texts[{i}]", f"expected a string, got {type(text).__name__}")
        out.append(document_id(text))
    return out


def _check_value(value, where: str, path: str, depth: int) -> object:
    """``value`` as stored JSON (tuples as lists), or a DataError naming ``path`` inside the metadata."""
    if depth > MAX_DEPTH:
        raise DataError(where, f"metadata nested deeper than {MAX_DEPTH} levels", field=path,
                        hint="flatten the metadata")
    if value is None or isinstance(value, (str, bool)):
        problem = text_problem(value) if isinstance(value, str) else None
        if problem:
            raise DataError(where, f"metadata string {problem}", field=path)
        return value
    if isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            raise DataError(where, f"metadata integer {value} is beyond ±2**53 (numbers compare as float64)",
                            field=path, hint="store such a number as a string")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DataError(where, f"metadata number {value} is not finite (JSON has no NaN or infinity)",
                            field=path, hint="use null for a missing number")
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                raise DataError(where, f"metadata key {key!r} is not a non-empty string", field=path or None,
                                hint="JSON object keys are strings")
            if text_problem(key):  # named with the surrogate escaped: a message must itself be valid UTF-8
                shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
                raise DataError(where, f"metadata key '{shown}' {text_problem(key)}",
                                field=f"{path}.{shown}" if path else shown)
            out[key] = _check_value(item, where, f"{path}.{key}" if path else key, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_check_value(item, where, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise DataError(where, f"metadata value of type {type_name(value)} is not JSON", field=path,
                    hint=not_json_hint(value))


def check_metadata(metadata, where: str, *, flat: bool = False) -> dict:
    """``metadata`` checked against the rules above and returned as a plain JSON dict (a copy; tuples as lists);
    a :class:`~twotower.DataError` naming ``where`` (the document) and the field otherwise. ``flat``: the metadata
    came from a flat document's other keys, where :data:`FLAT_KEYS` are not metadata."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise DataError(where, f"metadata must be a dict, got {type(metadata).__name__}", field="metadata")
    if flat:
        _refuse_flat_clash(metadata, where)
    out = _check_value(metadata, where, "", 0)
    size = len(json.dumps(out, ensure_ascii=False).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        raise DataError(where, f"metadata takes {size:,} bytes as JSON, more than the {MAX_METADATA_BYTES:,} "
                        "(64 KiB) a document may carry", field="metadata",
                        hint="store large content elsewhere and keep a reference (a path, a URL) in the metadata")
    return out


def _refuse_flat_clash(metadata: Mapping, where: str) -> None:
    clash = next((key for key in FLAT_KEYS if key in metadata), None)
    if clash is not None:
        raise DataError(where, f"metadata key {clash!r} clashes with the document's own {clash!r} in the flat form "
                        "(one object per document: _id, id, title and text are the document's fields there)",
                        field=clash, hint="give the metadata beside the document instead: metadatas=, "
                        "tt.Document(id, title, text, metadata), or HTTP's \"metadata\" object")


def flat_document(doc_id: str, title: str, text: str, metadata: Mapping | None, where: str = "document") -> dict:
    """The flat form ``{"_id", "title", "text", **metadata}`` of a document (a BEIR ``corpus.jsonl`` line, what
    :meth:`Index.add <twotower.Index.add>` takes back); a :class:`~twotower.DataError` naming the key when the
    metadata holds one of :data:`FLAT_KEYS`, which the flat form cannot tell from the document's own fields.

    Example::

        from twotower.data.metadata import flat_document

        assert flat_document("d1", "", "Green tea.", {"kind": "tea"}) == {"_id": "d1", "title": "", "text": "Green tea.",
                                                                          "kind": "tea"}
    """
    metadata = metadata or {}
    _refuse_flat_clash(metadata, where)
    return {"_id": doc_id, "title": title, "text": text, **metadata}


def type_name(value: Any) -> str:
    """The name of ``value``'s type for a message: Python's own types by name (``int``), any other with its
    package (``numpy.int64``, ``numpy.bool``), so that a numpy scalar is never taken for the Python type it
    resembles."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__name__}"


def not_json_hint(value: Any) -> str:
    """What to do with a value of a type JSON has no place for (a numpy scalar: ``.item()``)."""
    if type(value).__module__.split(".")[0] == "numpy" and hasattr(value, "item"):
        return "convert numpy scalars to Python numbers first, e.g. value.item()"
    return ("use strings, numbers, booleans, null, lists and objects (e.g. a set as a sorted list, bytes as a "
            "string)")


def kind(value: Any) -> str:
    """The kind of a JSON value: ``null`` ``bool`` ``number`` ``string`` ``list`` ``object`` (``other``: not JSON)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    return "object" if isinstance(value, dict) else "other"
