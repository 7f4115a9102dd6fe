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

from twotower.data.ids import id_problem, text_problem


def _valid_id(value):
    problem = id_problem(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"document id {value!r} {problem}")
    return value


def _valid_text(value):
    """Before pydantic's own str check, whose message for a lone surrogate ("unable to parse raw data as a unicode
    string") does not say what is wrong; anything but a str is left to it."""
    problem = text_problem(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"the text {problem}")
    return value


def build_models(limits) -> SimpleNamespace:
    """The models as attributes: SearchRequest, BatchSearchRequest, Hit, SearchResponse, BatchSearchResponse,
    DocumentIn, AddRequest, DocumentOut, WriteResponse, Health, ErrorBody."""
    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

    Text = BeforeValidator(_valid_text)
    Query = Annotated[str, Field(min_length=1, max_length=limits.max_query_chars, pattern=r"\S"), Text]  # not blank
    K = Annotated[int, Field(ge=1, le=limits.max_k)]
    Mode = Literal["dense", "bm25", "hybrid", "rrf"]
    Lambda = Annotated[float | None, Field(default=None, ge=0.0, le=1.0)]
    PrfDepth = Annotated[int | None, Field(default=None, ge=1, le=limits.max_k, description="documents fed back (off)")]
    PrfWeight = Annotated[float | None, Field(default=None, gt=0.0, allow_inf_nan=False, description="their share (1)")]
    DocId = Annotated[str, Field(min_length=1, max_length=limits.max_id_chars), BeforeValidator(_valid_id)]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    class SearchRequest(Strict):
        query: Query
        k: K = 10
        mode: Mode | None = Field(default=None, description="default: the model's fitted mode (twotower fit), else dense")
        lam: Lambda = Field(default=None, alias="lambda", description="hybrid weight of dense (default: tuned)")
        prf_depth: PrfDepth = None
        prf_weight: PrfWeight = None

    class BatchSearchRequest(Strict):
        queries: Annotated[list[Query], Field(min_length=1, max_length=limits.max_batch_queries)]
        k: K = 10
        mode: Mode | None = None
        lam: Lambda = Field(default=None, alias="lambda")
        prf_depth: PrfDepth = None
        prf_weight: PrfWeight = None

    class Hit(BaseModel):
        id: str
        score: float
        title: str

    class SearchResponse(BaseModel):
        version: str
        took_ms: float
        hits: list[Hit]

    class BatchSearchResponse(BaseModel):
        version: str
        took_ms: float
        results: list[list[Hit]]

    class DocumentIn(Strict):
        id: DocId = Field(alias="_id")
        title: Annotated[str, Field(max_length=limits.max_title_chars), Text] = ""
        text: Annotated[str, Field(max_length=limits.max_text_chars), Text]

    class AddRequest(Strict):
        documents: Annotated[list[DocumentIn], Field(min_length=1, max_length=limits.max_docs_per_request)]
        replace: bool = True

    class DocumentOut(BaseModel):
        id: str
        title: str
        text: str
        version: str

    class WriteResponse(BaseModel):
        version: str
        documents: int
        added: int = 0
        replaced: int = 0
        deleted: int = 0

    class Health(BaseModel):
        status: str
        version: str
        documents: int
        dim: int
        model: str | None

    class ErrorBody(BaseModel):
        error: str
        detail: object

    return SimpleNamespace(**{name: value for name, value in locals().items() if isinstance(value, type)
                              and issubclass(value, BaseModel) and value is not BaseModel and name != "Strict"})
