"""Metadata filters: the language LangChain, Chroma and Milvus users write, with one exact meaning.

A filter is a JSON object over a document's metadata (:mod:`twotower.data.metadata`)::

    {"source": "wiki"}                                   equality
    {"source": "wiki", "year": {"$gte": 2020}}           several keys: all must hold (AND)
    {"$or": [{"lang": "en"}, {"lang": {"$in": ["de", "fr"]}}]}
    {"author.name": {"$ne": "Ann"}}                      a dotted path into nested objects

Operators: ``$eq $ne $gt $gte $lt $lte $in $nin $exists`` on a field; ``$and`` / ``$or`` over a non-empty list of
filters; ``$not`` over one filter (the documents it does not let through, missing fields included: see
:mod:`twotower.retrieval.filters.milvus`); ``{"$text": {"$contains": "phrase"}}`` on the document's text (an exact,
case-sensitive substring of the text, not of the title). A field may take several operators at once
(``{"$gte": 1, "$lt": 5}``: all hold). ``None`` or ``{}`` is no filter (every document matches).

The exact semantics (the same in :meth:`Filter.matches`, in :meth:`Filter.mask` and in every search mode):

- **Kinds.** A value is a string, a number (int or float: ``1 == 1.0``), a boolean, null, a list or an object.
  Booleans are not numbers (``True`` does not equal ``1``). Two values are equal only when they are of the same kind
  and equal. ``$gt $gte $lt $lte`` compare numbers with numbers and strings with strings (by Unicode code point, as
  Python and UTF-8 byte order do); a field of another kind does not match (``{"title_len": {"$gt": 3}}`` skips a
  document whose ``title_len`` is the string ``"long"``) — no error, since metadata differ from document to document.
- **Missing fields.** A document without the field matches no condition on it except ``{"$exists": false}``; that
  includes ``$ne`` and ``$nin`` (``{"lang": {"$ne": "en"}}`` needs a ``lang``). A field holding null exists.
- **Lists** (tags): a field holding a list matches ``$eq`` / ``$in`` / ``$gt`` … when *any* element does, and
  ``$ne`` / ``$nin`` when *no* element equals the value(s). ``{"tags": "tea"}`` finds ``{"tags": ["tea", "green"]}``.
- **Objects**: a field holding an object equals no value (filter inside it with a dotted path); ``$ne`` / ``$nin``
  match it. A path does not step into lists (``a.b`` where ``a`` is a list: missing). A key that itself contains a
  dot cannot be filtered on.
- ``$in: []`` matches nothing; ``$nin: []`` matches every document that has the field.

Errors (a :class:`~twotower.DataError` whose ``field`` names the offending path or operator): a filter that is not an
object, an unknown operator, ``$in`` / ``$nin`` without a list, ``$and`` / ``$or`` without a non-empty list of
objects, ``$exists`` without a boolean, a range operator with anything but a number or a string (booleans
included), a comparison with a list or an object, a number that is not finite, an empty path segment; and, checked
first, before anything is built (:mod:`twotower.retrieval.filters.checks`): more than 32 levels of ``$and`` /
``$or``, 1,024 conditions or 4,096 ``$in`` / ``$nin`` values, a number beyond float range, a lone surrogate, a
comparison with null (the one rule on every backend: Milvus cannot tell a null from a missing field).

:func:`parse_filter` validates a filter once; :meth:`Filter.matches` is the reference evaluation over one metadata
dict; :meth:`Filter.mask` evaluates it over a whole index version at once (a boolean array, one entry per document
row, from :class:`~twotower.retrieval.filters.columns.MetadataColumns` built once per version);
:func:`to_milvus_expr` writes the same filter as a Milvus boolean expression over a JSON field.

One module per idea: :mod:`.parse` (the :class:`Filter` tree, :func:`parse_filter`, the reference
:meth:`Filter.matches`), :mod:`.checks` (the limits, before parsing), :mod:`.columns` (evaluation over a version's
metadata as numpy columns), :mod:`.text` (the ``$text`` match), :mod:`.milvus` (the translation to Milvus
expressions). A filter is parsed once, where it comes in (``tt.Index``'s methods, :mod:`twotower.retrieval.manage`'s
functions, the service's request models, the command line); the layers inside take the parsed :class:`Filter`
(``parse_filter`` hands one back as it is).
"""

from twotower.retrieval.filters.checks import (MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_FILTER_PARTS,
                                               MAX_FILTER_VALUES, MAX_VALUE_DEPTH, check_filter, load_filter_text)
from twotower.retrieval.filters.columns import MetadataColumns, columns_of
from twotower.retrieval.filters.milvus import milvus_string, to_milvus_expr
from twotower.retrieval.filters.parse import (COMPARISONS, LOGICAL, And, Condition, Filter, Not, Or, Text,
                                              parse_filter)

__all__ = ["COMPARISONS", "LOGICAL", "MAX_FILTER_CONDITIONS", "MAX_FILTER_DEPTH", "MAX_FILTER_PARTS",
           "MAX_FILTER_VALUES", "MAX_VALUE_DEPTH", "And", "Condition", "Filter", "MetadataColumns", "Not", "Or", "Text",
           "check_filter", "columns_of", "load_filter_text", "milvus_string", "parse_filter", "to_milvus_expr"]
