"""The service's request and response models (pydantic), built for one set of :class:`~twotower.serve.state.
ServeLimits`.

Requests are strict: ``"k": true`` or ``"k": "3"`` is a 422, not k = 1 or 3 (a JSON number may still fill a float
field); unknown fields are refused. Document ids follow the one id rule of :mod:`twotower.data.ids` (the BEIR
loader's), and no text may hold a lone surrogate, so what the service stores the command line can load, and a
TREC run can carry.
"""

# no `from __future__ import annotations`: pydantic resolves these annotations at run time.

from types import SimpleNamespace
from typing import Annotated, Literal

from twotower.data.ids import document_text_problem, id_problem


def _valid_id(value):
    problem = id_problem(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"document id {value!r} {problem}")
    return value


def _valid_text(value):
    """Before pydantic's own str check, whose message for a lone surrogate ("unable to parse raw data as a unicode
    string") does not say what is wrong; anything but a str is left to it."""
    problem = document_text_problem(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"the text {problem}")
    return value


def _valid_filter(value):
    """A ``"filter"`` checked by the filter language's own parser (:func:`twotower.retrieval.filters.parse_filter`):
    its message names the offending operator or field, and the service answers 422 at ``["body", "filter"]``. The
    request holds the parsed :class:`~twotower.retrieval.filters.Filter` from then on: parsed once, here."""
    from twotower.errors import DataError
    from twotower.retrieval.filters import parse_filter

    try:
        return None if value is None else parse_filter(value)
    except DataError as exc:
        raise ValueError(str(exc)) from None


def _valid_metadata(value):
    """A document's ``"metadata"`` checked by the one metadata rule (:func:`twotower.data.metadata.check_metadata`)
    while the request is validated: a lone surrogate in a key, a number beyond ±2**53, nesting past 32 levels are a
    422 at ``["body", "documents", i, "metadata"]`` naming the field, as a filter's mistakes are."""
    from twotower.data.metadata import check_metadata
    from twotower.errors import DataError

    try:
        check_metadata(value, "metadata")
    except DataError as exc:
        raise ValueError(str(exc)) from None
    return value


def build_models(limits) -> SimpleNamespace:
    """The models as attributes: SearchRequest, BatchSearchRequest, Segment, Highlight, Hit, SearchResponse,
    BatchSearchResponse, Lead, DocumentIn, AddRequest, DocumentOut, WriteResponse, Health, Info, ErrorBody."""
    from pydantic import AfterValidator, AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue

    Text = BeforeValidator(_valid_text)
    Query = Annotated[str, Field(min_length=1, max_length=limits.max_query_chars, pattern=r"\S"), Text]  # not blank
    K = Annotated[int, Field(ge=1, le=limits.max_k)]
    Mode = Literal["dense", "bm25", "hybrid", "rrf"]
    Lambda = Annotated[float | None, Field(default=None, ge=0.0, le=1.0)]
    PrfDepth = Annotated[int | None, Field(default=None, ge=1, le=limits.max_k, description="documents fed back (off)")]
    PrfWeight = Annotated[float | None, Field(default=None, gt=0.0, allow_inf_nan=False, description="their share (1)")]
    DocId = Annotated[str, Field(min_length=1, max_length=limits.max_id_chars), BeforeValidator(_valid_id)]
    DocText = Annotated[str, Field(max_length=limits.max_text_chars), Text]
    Metadata = dict[str, JsonValue]
    Filter = Annotated[Metadata | None, AfterValidator(_valid_filter), Field(
        default=None, description='a metadata filter: {"field": value}, $eq $ne $gt $gte $lt $lte $in $nin $exists, '
        '$and / $or lists, $not, dotted paths into nested objects, {"$text": {"$contains": "phrase"}} (an exact '
        "substring of the document's text); at most 32 levels of $and / $or, 1,024 conditions and 4,096 $in / $nin "
        "values, checked before any search (docs: Your documents: metadata and filters)")]
    Highlighting = Annotated[bool, Field(default=False, description='each hit with its "highlight": the '
                                        "query's terms marked in its title and in a window of its text")]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    class SearchRequest(Strict):
        query: Query
        k: K = 10
        mode: Mode | None = Field(default=None, description="default: the model's fitted mode (twotower fit), else dense")
        lam: Lambda = Field(default=None, alias="lambda", description="hybrid weight of dense (default: tuned)")
        prf_depth: PrfDepth = None
        prf_weight: PrfWeight = None
        filter: Filter = None
        highlight: Highlighting = False

    class BatchSearchRequest(Strict):
        queries: Annotated[list[Query], Field(min_length=1, max_length=limits.max_batch_queries)]
        k: K = 10
        mode: Mode | None = None
        lam: Lambda = Field(default=None, alias="lambda")
        prf_depth: PrfDepth = None
        prf_weight: PrfWeight = None
        filter: Filter = None
        highlight: Highlighting = False

    class Segment(BaseModel):
        text: str
        match: bool = Field(description="whether this piece is one of the query's terms")

    class Lead(BaseModel):
        """The start of a document's text, shown in place of the title it lacks."""

        text: list[Segment]
        cut_after: bool = Field(description="the text goes on after these pieces")

    class Highlight(BaseModel):
        """The query's terms marked (serve.highlight): plain-text pieces that, joined, give the title, or the window
        of the text shown; ``cut_before`` / ``cut_after``: the text goes on before / after the window."""

        title: list[Segment]
        text: list[Segment]
        cut_before: bool
        cut_after: bool
        lead: Lead | None = Field(default=None, description="only for a document without a title (a plain string): "
                                  "the start of its text, about a line, to show in the title's place")

    class PassageOut(BaseModel):
        text: str = Field(description="the passage: the document's text[start:end]")
        start: int = Field(description="where it starts in the document's text (characters)")
        end: int = Field(description="where it ends (exclusive)")
        score: float | None = Field(default=None, description="the query's score for it (null: a whole short "
                                    "document)")
        page: int | None = Field(default=None, description="the 1-based page it starts on (a document read from a "
                                 "PDF; null otherwise)")
        start_utf16: int = Field(description="start in UTF-16 code units (JavaScript's String indexes): start and "
                                 "end count Unicode code points, as Python does")
        end_utf16: int = Field(description="end in UTF-16 code units")

    class Hit(BaseModel):
        id: str
        score: float
        title: str
        metadata: Metadata = Field(default_factory=dict, description="the document's metadata")
        passages: list[PassageOut] = Field(default_factory=list, description="the best passage of the document's "
                                           "text (long documents are split into passages; a short one's is its "
                                           "whole text)")
        highlight: Highlight | None = Field(default=None, description='only when the request sent "highlight": true')

    class SearchResponse(BaseModel):
        version: str
        took_ms: float
        hits: list[Hit]

    class BatchSearchResponse(BaseModel):
        version: str
        took_ms: float
        results: list[list[Hit]]

    class DocumentIn(Strict):
        id: DocId = Field(validation_alias=AliasChoices("_id", "id"))
        title: Annotated[str, Field(max_length=limits.max_title_chars), Text] = ""
        text: DocText
        metadata: Annotated[Metadata, AfterValidator(_valid_metadata)] = Field(
            default_factory=dict, description="JSON metadata stored with the document and returned with it exactly "
                                              "as sent (its own namespace: any key, id and text included; at most "
                                              "64 KiB)")

    class AddRequest(Strict):
        documents: Annotated[list[DocumentIn | DocText], Field(
            min_length=1, max_length=limits.max_docs_per_request,
            description='documents {"_id" (or "id"), "title", "text", "metadata"}, or plain strings (ids from their '
                        'content, as twotower.document_id gives them, returned in "ids")')]
        replace: bool = True

    class DocumentOut(BaseModel):
        id: str
        title: str
        text: str
        metadata: Metadata = Field(default_factory=dict)
        version: str

    class WriteResponse(BaseModel):
        version: str
        documents: int
        added: int = 0
        replaced: int = 0
        deleted: int = 0
        ids: list[str] = Field(default_factory=list, description="the ids written (or deleted), in request order")

    class Health(BaseModel):
        status: str
        version: str
        documents: int
        dim: int
        model: str | None

    class Info(BaseModel):
        """What a client (the search page) needs to know about the index it searches."""

        version: str
        documents: int
        model: str | None
        modes: list[Mode] = Field(description="the search modes this index supports")
        default_mode: Mode = Field(description="the mode a search without one uses")
        metadata_fields: list[str] | None = Field(
            description="the dotted paths of the documents' leaf metadata fields (a field holding objects shows as "
                        "the paths inside it; empty: none has metadata; null: not known, as on a Milvus index)")
        max_k: int
        max_query_chars: int
        passages: int | None = Field(default=None, description="the passages the documents are split into (null: "
                                     "one vector per document)")

    class ErrorBody(BaseModel):
        error: str
        detail: object

    return SimpleNamespace(**{name: value for name, value in locals().items() if isinstance(value, type)
                              and issubclass(value, BaseModel) and value is not BaseModel and name != "Strict"})


def document_name(i: int, item) -> str:
    """A document of a ``POST /documents`` body as a message names it: its place, and its id or what it is."""
    if isinstance(item, dict):
        ident = item.get("_id", item.get("id"))
        if isinstance(ident, str):
            shown = ident if len(ident) <= 80 else ident[:79] + "…"
            return f"documents[{i}] (id {shown!r})"
        return f"documents[{i}]"
    if isinstance(item, str):
        return f"documents[{i}] (a plain string of {len(item):,} characters)"
    return f"documents[{i}]"


def named_errors(errors: list[dict], body) -> list[dict]:
    """The validation errors of a request (``{"loc", "msg", "type"}``), those of a ``POST /documents`` body's
    documents named by :func:`document_name` and told once: a document is an object or a plain string, and pydantic
    answers for both forms; only the form the document has is kept (both, as one message, for neither)."""
    docs = body.get("documents") if isinstance(body, dict) else None
    out, told, dropped = [], set(), []
    for e in errors:
        loc = list(e.get("loc", ()))
        if (not isinstance(docs, list) or loc[:2] != ["body", "documents"] or len(loc) < 4
                or not isinstance(loc[2], int) or not 0 <= loc[2] < len(docs)):
            out.append(e)
            continue
        i, item, as_object = loc[2], docs[loc[2]], loc[3] == "DocumentIn"
        name = document_name(i, item)
        if not isinstance(item, (dict, str)):
            if i not in told:
                told.add(i)
                kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list"}.get(type(item), "null")
                out.append({"loc": ["body", "documents", i], "type": "document_type",
                            "msg": f'{name}: a document is an object {{"_id", "title", "text", "metadata"}} or a '
                                   f"string, not {kind}"})
            continue
        if isinstance(item, dict) != as_object:  # pydantic trying the form this document does not have
            dropped.append(e)
            continue
        field = [str(p) for p in loc[4:]] if as_object else []
        out.append({**e, "loc": ["body", "documents", i, *field],
                    "msg": f"{name}{': ' + '.'.join(field) if field else ''}: {e.get('msg', '')}"})
        told.add(i)
    # a document none of whose errors was kept (pydantic naming its forms otherwise): its errors as they came
    return out + [e for e in dropped if e["loc"][2] not in told]
