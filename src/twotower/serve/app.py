"""A search service over a stored index (FastAPI): search, read, add/replace and delete documents.

Endpoints (OpenAPI schema at ``/openapi.json``, docs at ``/docs``)::

    POST   /search            {"query", "k", "mode", "filter"}  → ranked {id, score, title, metadata}
    POST   /search/batch      {"queries": [...], "k", "mode"}   → one ranked list per query
    (both also take "lambda", "filter" (a metadata filter, retrieval.filters), "prf_depth" / "prf_weight":
    dense pseudo-relevance feedback, retrieval.prf, and "highlight": each hit's matches marked, serve.highlight)
    GET    /documents/{id}                                      → {id, title, text, metadata, version}
    POST   /documents         {"documents": [...], "replace"}   → the new version and the "ids" written   (API key)
                              (each document {"_id", "title", "text", "metadata"} or a plain string)
    DELETE /documents/{id}                                      → the new version   (API key)
    POST   /list, /count      {"filter", ...}                   → a page of documents in id order / how many
    POST   /documents/delete  {"filter": non-empty}             → the ids deleted   (API key)
    PATCH  /documents         {"ids" / "filter", "metadata"}    → metadata only, no re-encoding   (API key)
    (the last four: serve.manage)
    GET    /healthz                                             → status, version, documents
    GET    /metrics                                             → Prometheus text
    GET    /info                                                → modes, metadata fields, limits (for clients)
    GET    /                                                    → the search page (HTML; serve/static)

``{id}`` is the document id percent-encoded (``urllib.parse.quote(id, safe="")``; ``.`` and ``..``
as ``%2E`` and ``%2E%2E``, which clients would otherwise resolve away); a ``/`` may also be sent
as is. With ``open_reads=False`` (``--keyed-reads``) every path but ``/healthz`` needs the key,
``/metrics`` and ``/openapi.json`` included, and ``/docs`` and ``/redoc`` are off; reads (the search page too) then
also take the key as the password of HTTP Basic authentication, which a browser can send (serve.auth).

Consistency: every request works on one immutable index version (a snapshot taken when it
starts), so a search that runs while a write is in progress sees the old or the new version,
never a mix. Writes are serialized by a lock in the process (and by the store's file lock across
processes) and go through :meth:`IndexStore.add` / :meth:`IndexStore.remove`, which switch the
live version atomically; a write is acknowledged only after its version is durable on disk.
Reads pick up versions written by other processes (``twotower index add``) on their next request.

Bad input gets a 4xx JSON body ``{"error": ..., "detail": ...}``: 401/403 for a missing/wrong API
key, 404 for unknown ids, 409 for adding existing ids without ``replace``, 413 for a body over the
limit, 422 for anything the request models reject (query length, ``k``, batch size, field types, a ``"filter"``
with an unknown operator: the message names it), 400 for metadata the metadata rules refuse (data.metadata).
The service's side gets a 5xx JSON body of the same form: 502 ``embedding_failed`` when the index's own embedding
(``tt.Index.build(..., embedding=f)``) raises or returns unusable vectors while a search or a write encodes (the
detail names the embedding, the exception's type and message; a write then writes nothing), 503 when the Milvus
behind the index is unavailable.
"""

# no `from __future__ import annotations`: FastAPI and pydantic resolve the request models defined
# inside create_app from their (local) annotations at run time.

import hmac
import logging
import time
from typing import Annotated
from urllib.parse import unquote

from twotower.checks import flag, switch
from twotower.errors import TwoTowerError
from twotower.retrieval.milvus.client import MilvusError
from twotower.serve.auth import (  # noqa: F401  (read_api_key: re-exported)
    API_KEY_HEADER, BASIC_CHALLENGE, basic_password, check_api_key, read_api_key,
)
from twotower.serve.body_limit import BodySizeLimit
from twotower.serve.manage import add_store_routes
from twotower.serve.metrics import request_metrics
from twotower.serve.models import build_models, named_errors
from twotower.serve.page import PAGE_FILES, add_search_page
from twotower.serve.state import (
    Conflict, EmbeddingFailed, NotFound, ServeLimits, ServiceState, request_documents,
)

log = logging.getLogger(__name__)

METADATA_FIELDS_READ_UP_TO = 100_000  # documents; /info lists a larger index's metadata fields once a filter read them
MAX_METADATA_FIELDS = 200


# ------------------------------------------------------------------------------------------
# the app


def check_options(*, precision: str = "auto", query_runtime: str = "auto") -> None:
    """The service's option values, checked before the port, the index or the model is touched."""
    from twotower.encoders.inference import check_precision
    from twotower.encoders.onnx_runtime import check_query_runtime

    check_precision(precision)
    check_query_runtime(query_runtime)


def leaf_paths(paths: list[str]) -> list[str]:
    """The sorted dotted ``paths`` that no other path continues: ``["a", "a.b", "c"]`` → ``["a.b", "c"]``."""
    parents = {p[:i] for p in paths for i, c in enumerate(p) if c == "."}
    return sorted(p for p in paths if p not in parents)


def check_access(api_key: str | None, open_reads: bool) -> None:
    """The key's form, and keyed reads refused without a key: checked before the index and the model are loaded."""
    key = flag("api_key", "--api-key-file")  # api_key from Python, --api-key-file on the command line
    if api_key is not None:
        check_api_key(api_key, key)
    if not open_reads and api_key is None:
        raise TwoTowerError(f"keyed reads ({switch('keyed_reads')}) need an API key ({key})")


def create_app(
    index_path,
    api_key: str | None = None,
    open_reads: bool = True,
    limits: ServeLimits | None = None,
    *,
    model: str | None = None,
    precision: str = "auto",
    query_runtime: str = "auto",
    device: str = "auto",
    compute_lock=None,
):
    """A FastAPI app serving the index at ``index_path`` (a folder; or a ``Searcher`` to share, with the lock its
    owner holds around the encoder, ``compute_lock``: :class:`~twotower.serve.state.ServiceState`).

    ``api_key``: the key writes (and, with ``open_reads=False``, reads) must send in the
    ``X-API-Key`` header; without one, writes are refused (403). ``model`` overrides the encoder
    recorded in the index manifest. ``precision`` is for encoding added documents and torch-encoded queries; ``query_runtime``
    (``auto`` | ``onnx`` | ``torch``) runs the query tower on ONNX Runtime where it can.
    """
    from fastapi import Depends, FastAPI, Path as PathParam, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from fastapi.security import APIKeyHeader, HTTPBasic
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from twotower.retrieval.store import UnknownIdError

    limits = limits or ServeLimits()
    check_options(precision=precision, query_runtime=query_runtime)
    check_access(api_key, open_reads)  # before the index and the model are loaded
    key = flag("api_key", "--api-key-file")  # api_key from Python, --api-key-file on the command line
    no_key = f"writes are disabled: start the server with {key} to allow them"  # requests run outside this context
    state = ServiceState(index_path, model=model, precision=precision, query_runtime=query_runtime, device=device,
                         compute_lock=compute_lock)

    m = build_models(limits)
    SearchRequest, BatchSearchRequest, SearchResponse, BatchSearchResponse = (
        m.SearchRequest, m.BatchSearchRequest, m.SearchResponse, m.BatchSearchResponse)
    Hit, AddRequest, DocumentOut, WriteResponse, Health, ErrorBody = (
        m.Hit, m.AddRequest, m.DocumentOut, m.WriteResponse, m.Health, m.ErrorBody)
    Highlight, Segment, Lead, Info, PassageOut = m.Highlight, m.Segment, m.Lead, m.Info, m.PassageOut

    errors = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 502, 503)}
    # Keyed reads: everything but /healthz needs the key, the schema included; the browsable docs are
    # off, since a browser loading them cannot send the key (and their page would fetch the schema without it).
    docs = {} if open_reads else {"docs_url": None, "redoc_url": None}
    app = FastAPI(title="twotower search", version="1", description=__doc__.split("\n\n")[0], **docs)
    app.state.service = state
    app.state.limits = limits

    registry, record = request_metrics(app, state)  # a registry per app: no global state

    # ---- errors as JSON -----------------------------------------------------------------
    def error(status: int, kind: str, detail) -> JSONResponse:
        return JSONResponse({"error": kind, "detail": detail}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and content_type.split(";")[0].strip().lower() != "application/json":
            # FastAPI reads a body as JSON only under this header: say so, not "Input should be a valid dictionary"
            return error(422, "invalid_request", f"send the request body as JSON with the header 'Content-Type: "
                                                 f"application/json' (this request sent {content_type or 'none'!r})")
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()]
        return error(422, "invalid_request", named_errors(detail, getattr(exc, "body", None)))  # documents named

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException):
        kinds = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
        detail = exc.detail
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # FastAPI's words for a body
            detail = "the request body is not JSON text in UTF-8: send UTF-8 encoded JSON"  # json.loads cannot decode
            if "integer string conversion" in str(exc.__cause__ or ""):  # Python's limit on digits, not bad JSON
                detail = ("the request body holds a number of more than 4,300 digits: no field takes such a number "
                          f"(k is at most {limits.max_k})")
            if isinstance(exc.__cause__, RecursionError):  # JSON nested past what Python's reader takes
                from twotower.retrieval.filters.checks import MAX_FILTER_DEPTH

                return error(422, "invalid_request", "the request body nests objects and lists deeper than JSON "
                             f"reading allows (a filter's $and / $or nest at most {MAX_FILTER_DEPTH} levels, metadata "
                             "32): flatten it")
        response = error(exc.status_code, kinds.get(exc.status_code, "http_error"), detail)
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(NotFound)
    @app.exception_handler(UnknownIdError)
    async def on_not_found(request: Request, exc: TwoTowerError):
        return error(404, "not_found", str(exc))

    @app.exception_handler(Conflict)
    async def on_conflict(request: Request, exc: TwoTowerError):
        return error(409, "conflict", str(exc))

    @app.exception_handler(MilvusError)
    async def on_store_unavailable(request: Request, exc: TwoTowerError):  # the Milvus behind the index: down, the
        return error(503, "unavailable", str(exc))  # token refused, its collection dropped; not the request's fault

    @app.exception_handler(EmbeddingFailed)
    async def on_embedding_failed(request: Request, exc: TwoTowerError):  # the index's own embedding (often a
        # remote API) raised or gave unusable vectors: the upstream's fault, not the request's; nothing was written
        log.warning("%s %s: %s", request.method, request.url.path, exc, exc_info=exc.__cause__ or exc)
        return error(502, "embedding_failed", str(exc))

    @app.exception_handler(TwoTowerError)
    async def on_twotower(request: Request, exc: TwoTowerError):  # e.g. mode bm25 on an index without BM25
        return error(400, "bad_request", str(exc))

    # ---- auth ---------------------------------------------------------------------------
    key_header = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, description="the server's API key")

    class BasicKey(HTTPBasic):  # the scheme in the schema; the password (or None), never an error of its own
        async def __call__(self, request: Request) -> str | None:
            return basic_password(request.headers.get("authorization"))

    basic_key = BasicKey(auto_error=False, description="reads only: the API key as the password, any user name (how "
                                                        "a browser sends it to the search page)")
    page_paths = {"/", *(f"/static/{name}" for name in PAGE_FILES if name != "index.html")}

    def check_key(sent: str | None) -> None:
        from fastapi import HTTPException

        if api_key is None:
            raise HTTPException(403, no_key)
        if not sent:
            raise HTTPException(401, f"missing API key: send it in the {API_KEY_HEADER} header",
                                headers={"WWW-Authenticate": "ApiKey"})
        if not hmac.compare_digest(sent.encode(), api_key.encode()):
            raise HTTPException(403, "wrong API key")

    @app.middleware("http")
    async def gate(request: Request, call_next):
        # Before the body is parsed: an unauthenticated write gets 401/403, never a validation
        # error that describes the request models. The dependencies below document the scheme.
        from fastapi import HTTPException

        path, method = request.url.path, request.method
        is_write = method not in ("GET", "HEAD", "OPTIONS") and (path == "/documents" or path.startswith("/documents/"))
        if is_write or (not open_reads and path != "/healthz"):  # keyed reads: /metrics, /openapi.json too
            sent = request.headers.get(API_KEY_HEADER)
            if not sent and not is_write:  # a read may carry the key as a Basic password (a browser's way)
                sent = basic_password(request.headers.get("authorization"))
            try:
                check_key(sent)
            except HTTPException as exc:
                if path in page_paths and request.headers.get(API_KEY_HEADER) is None:
                    # the page, opened by a browser: a Basic challenge makes it ask for the key (again, if wrong)
                    exc = HTTPException(401, f"{'wrong' if sent else 'missing'} API key: give it as the password "
                                             f"(any user name), or send it in the {API_KEY_HEADER} header",
                                        headers={"WWW-Authenticate": BASIC_CHALLENGE})
                return await on_http(request, exc)
        return await call_next(request)

    app.middleware("http")(record)

    def writer(sent: str | None = Depends(key_header)) -> None:
        check_key(sent)

    def reader(sent: str | None = Depends(key_header), password: str | None = Depends(basic_key)) -> None:
        if not open_reads:
            check_key(sent or password)

    # ---- endpoints ----------------------------------------------------------------------
    IdInPath = Annotated[str, PathParam(min_length=1, max_length=limits.max_id_chars,
                                        description="the document id, percent-encoded (`/` may be sent as is)")]

    def id_in_path(request: Request, decoded: str) -> str:
        """The id after ``/documents/`` in the raw request path, percent-decoded once. Servers decode
        the path once too (uvicorn), but Starlette's TestClient decodes it twice: "a%252F" → "a/"."""
        raw = (request.scope.get("raw_path") or b"").split(b"?", 1)[0]
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            return decoded
        at = text.find("/documents/")
        return unquote(text[at + len("/documents/"):]) if at >= 0 else decoded

    def hits_of(store, rows, query: str | None = None) -> list[Hit]:
        """The hits; with ``query``, each with its ``highlight`` (left out otherwise: the routes skip unset fields)."""
        def passages(found, text: str) -> list[PassageOut]:
            def utf16(i: int) -> int:  # code points before i, counted as JavaScript does (astral ones twice)
                return i + sum(1 for ch in text[:i] if ord(ch) > 0xFFFF)

            return [PassageOut(text=p.text, start=p.start, end=p.end, score=p.score, page=p.page,
                               start_utf16=utf16(p.start), end_utf16=utf16(p.end)) for p in found]

        if query is None:
            return [Hit(id=d, score=s, title=t, metadata=m, passages=passages(p, x)) for d, s, t, m, x, p in rows]
        from twotower.serve.highlight import highlighter_for

        marker = highlighter_for(store.manifest.get("bm25"))
        terms = marker.terms(query)

        def pieces(segments) -> list[Segment]:
            return [Segment(text=text, match=match) for text, match in segments]

        hits = []
        for d, s, t, m, text, found in rows:
            best = found[0] if found else None
            part = best.text if best is not None else text  # the matched passage of a long document, else its text
            window = marker.window(part, terms)
            extra = {}
            if not t.strip():  # untitled (a plain string): the text's start stands for the title
                lead = marker.lead(text, terms)
                extra["lead"] = Lead(text=pieces(lead.segments), cut_after=lead.cut_after)
            hits.append(Hit(id=d, score=s, title=t, metadata=m, passages=passages(found, text), highlight=Highlight(
                title=pieces(marker.title(t, terms).segments), text=pieces(window.segments),
                cut_before=window.cut_before or (best is not None and best.start > 0),
                cut_after=window.cut_after or (best is not None and best.end < len(text)), **extra)))
        return hits

    @app.post("/search", response_model=SearchResponse, responses=errors, dependencies=[Depends(reader)],
              response_model_exclude_unset=True)
    def search(req: SearchRequest) -> SearchResponse:
        """The top ``k`` documents for one query."""
        t0 = time.perf_counter()
        store, results = state.search([req.query], req.k, req.mode, req.lam, req.prf_depth, req.prf_weight,
                                      req.filter)
        hits = hits_of(store, results[0], req.query if req.highlight else None)
        return SearchResponse(version=store.version, took_ms=(time.perf_counter() - t0) * 1000, hits=hits)

    @app.post("/search/batch", response_model=BatchSearchResponse, responses=errors, dependencies=[Depends(reader)],
              response_model_exclude_unset=True)
    def search_batch(req: BatchSearchRequest) -> BatchSearchResponse:
        """The top ``k`` documents for each of several queries (all against one index version)."""
        t0 = time.perf_counter()
        store, results = state.search(req.queries, req.k, req.mode, req.lam, req.prf_depth, req.prf_weight,
                                      req.filter)
        ranked = [hits_of(store, r, q if req.highlight else None) for q, r in zip(req.queries, results)]
        return BatchSearchResponse(version=store.version, took_ms=(time.perf_counter() - t0) * 1000, results=ranked)

    @app.get("/documents/{doc_id:path}", response_model=DocumentOut, responses=errors, dependencies=[Depends(reader)])
    def get_document(doc_id: IdInPath, request: Request) -> DocumentOut:
        """One stored document."""
        doc_id = id_in_path(request, doc_id)
        store = state.snapshot()
        row = store.row_of.get(doc_id)
        if row is None:
            raise NotFound(f"document '{doc_id}' is not in the index (version {store.version})")
        d = store.document(row)
        return DocumentOut(id=d["_id"], title=d["title"], text=d["text"], metadata=d.get("metadata") or {},
                           version=store.version)

    @app.post("/documents", response_model=WriteResponse, responses=errors, dependencies=[Depends(writer)])
    def add_documents(req: AddRequest) -> WriteResponse:
        """Add documents (encoded with the index's model); with ``replace`` (default) existing ids are
        overwritten. A document is ``{"_id", "title", "text", "metadata"}`` or a plain string (its id from its
        content, as the Python API gives it); the ids written come back in ``ids``. Answered once the new index
        version is durable and live."""
        docs = request_documents(req.documents)
        ids = [d.id for d in docs]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            return error(422, "invalid_request", f"duplicate ids in the request: {', '.join(map(repr, dup[:5]))}")
        live, replaced = state.add(docs, req.replace)
        return WriteResponse(version=live.version, documents=len(live), added=len(ids) - replaced, replaced=replaced,
                             ids=ids)

    @app.delete("/documents/{doc_id:path}", response_model=WriteResponse, responses=errors,
                dependencies=[Depends(writer)])
    def delete_document(doc_id: IdInPath, request: Request) -> WriteResponse:
        """Remove one document (a new index version without it)."""
        doc_id = id_in_path(request, doc_id)
        live = state.remove(doc_id)
        return WriteResponse(version=live.version, documents=len(live), deleted=1, ids=[doc_id])

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        """Liveness and the live index version."""
        store = state.snapshot()
        return Health(status="ok", version=store.version, documents=len(store), dim=store.dim,
                      model=store.manifest["model"].get("name"))

    @app.get("/info", response_model=Info, responses=errors, dependencies=[Depends(reader)])
    def info() -> Info:
        """The index as a client needs it: the search modes it supports and the one used by default, its documents'
        metadata fields (the search page offers a filter when there are some), the request limits."""
        store = state.snapshot()
        modes = ["dense", "bm25", "hybrid", "rrf"] if store.manifest.get("bm25") else ["dense"]
        return Info(version=store.version, documents=len(store), model=store.manifest["model"].get("name"),
                    modes=modes, default_mode=state.searcher.resolve(None, None)[0],
                    metadata_fields=metadata_fields(store), max_k=limits.max_k,
                    max_query_chars=limits.max_query_chars, passages=store.manifest.get("num_passages"))

    def metadata_fields(store) -> list[str] | None:
        """The dotted paths of ``store``'s documents' leaf metadata fields (a field that holds objects shows as the paths
        inside it); None when not known without reading every document
        of a large index (or at all: Milvus)."""
        from twotower.retrieval.filters.columns import columns_of

        if hasattr(store, "filter_expression"):  # Milvus keeps the metadata
            return None
        if getattr(store, "_metadata_columns", None) is None and len(store) > METADATA_FIELDS_READ_UP_TO:
            return None
        return leaf_paths(columns_of(store).paths())[:MAX_METADATA_FIELDS]

    add_search_page(app)  # serve.page: HTML, JS and CSS at / and /static/NAME
    add_store_routes(app, state, limits, reader=reader, writer=writer, errors=errors)  # /list /count, serve.manage

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(reader)])
    def metrics() -> PlainTextResponse:
        """Prometheus metrics: requests by route and status, latency histograms, index size."""
        state.snapshot()
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    if limits.max_body_bytes:
        app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    return app
