"""The service's document management without a query (:mod:`twotower.retrieval.manage` holds the semantics)::

    POST   /list              {"filter", "ids", "limit", "offset", "after", "documents"}
                              → {version, ids, total, next, documents}: a page in id order
    POST   /count             {"filter"}                         → {version, count}
    POST   /documents/delete  {"filter" (required, non-empty), "ids"}
                              → the new version, the ids deleted   (API key)
    PATCH  /documents         {"ids" and/or "filter", "metadata", "merge", "unset"}
                              → the new version, the ids updated: metadata only, no re-encoding   (API key)

Reads answer from one index version; writes run under the service's write lock as one atomic write each (one new
version; on Milvus one committed write). A delete without a non-empty ``"filter"`` is a 422, so no body deletes
everything; deleting every document is a 409; an unknown id a 404.
"""

# no `from __future__ import annotations`: pydantic resolves the models' annotations at run time.

from typing import Annotated

from twotower.serve.models import _valid_filter, _valid_id
from twotower.serve.state import Conflict


def _nonempty_filter(value):
    from twotower.retrieval.filters import parse_filter

    if value is None or parse_filter(value).empty:
        raise ValueError('a non-empty "filter" is required (an empty one would select every document)')
    return value


def add_store_routes(app, state, limits, *, reader, writer, errors) -> None:
    """Add the routes above to ``app`` (``reader`` / ``writer``: the app's key dependencies)."""
    from fastapi import Depends
    from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue

    DocId = Annotated[str, Field(min_length=1, max_length=limits.max_id_chars), BeforeValidator(_valid_id)]
    Ids = Annotated[list[DocId] | None, Field(default=None, min_length=1, max_length=limits.max_docs_per_request)]
    Metadata = dict[str, JsonValue]
    Filter = Annotated[Metadata | None, AfterValidator(_valid_filter), Field(
        default=None, description='a metadata filter, as in /search; also {"$not": {...}} and '
        '{"$text": {"$contains": "phrase"}} (an exact, case-sensitive substring of the document\'s text)')]
    Required = Annotated[Metadata, AfterValidator(_valid_filter), AfterValidator(_nonempty_filter)]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    class ListRequest(Strict):
        filter: Filter = None
        ids: Ids = None
        limit: Annotated[int, Field(ge=1, le=limits.max_k)] = 100
        offset: Annotated[int, Field(ge=0)] = 0
        after: Annotated[str | None, Field(default=None, max_length=limits.max_id_chars,
                                           description="start after this id: the previous page's next")] = None
        documents: bool = True

    class StoredDocument(BaseModel):
        id: str
        title: str
        text: str
        metadata: Metadata = Field(default_factory=dict)

    class ListResponse(BaseModel):
        version: str
        ids: list[str]
        total: int = Field(description="documents the filter lets through")
        next: str | None = Field(description='send it as "after" for the next page; null on the last')
        documents: list[StoredDocument]

    class CountRequest(Strict):
        filter: Filter = None

    class CountResponse(BaseModel):
        version: str
        count: int

    class DeleteRequest(Strict):
        filter: Required
        ids: Ids = None

    class UpdateRequest(Strict):
        ids: Ids = None
        filter: Filter = None
        metadata: Metadata | list[Metadata] | None = Field(default=None, description="set on each document (a list: "
                                                           "one per id)")
        merge: bool = Field(default=True, description="false: replace the metadata whole")
        unset: list[str] = Field(default_factory=list, description="top-level keys removed")

    class ManageResponse(BaseModel):
        version: str
        documents: int
        deleted: int = 0
        updated: int = 0
        ids: list[str]

    def records(store, ids):
        from twotower.retrieval.manage import records as read

        return [StoredDocument(id=r["_id"], title=r["title"], text=r["text"], metadata=r.get("metadata") or {})
                for r in read(store, ids)]

    @app.post("/list", response_model=ListResponse, responses=errors, dependencies=[Depends(reader)])
    def list_documents(req: ListRequest) -> ListResponse:
        """A page of the documents the filter lets through (of ``ids`` when given), in id order."""
        from twotower.retrieval.manage import page, selected_ids

        store = state.snapshot()
        if req.ids is not None:
            passing = selected_ids(store, req.filter, req.ids)  # in the order of "ids"; paged by offset alone
            chosen, total, nxt = passing[req.offset:req.offset + req.limit], len(passing), None
        else:
            chosen, total, nxt = page(store, req.filter, offset=req.offset, limit=req.limit, after=req.after)
        docs = records(store, chosen) if req.documents and chosen else []
        return ListResponse(version=store.version, ids=chosen, total=total, next=nxt, documents=docs)

    @app.post("/count", response_model=CountResponse, responses=errors, dependencies=[Depends(reader)])
    def count_documents(req: CountRequest) -> CountResponse:
        """How many documents the filter lets through."""
        from twotower.retrieval.manage import count

        store = state.snapshot()
        return CountResponse(version=store.version, count=count(store, req.filter))

    def written(operation, *args):
        from twotower.retrieval.index.errors import WouldEmptyError

        with state.write_lock:
            try:
                live, ids = operation(state.snapshot(), *args)
            except WouldEmptyError as exc:
                raise Conflict(str(exc)) from None
            with state._refresh_lock:
                state.searcher.store = live
        return live, ids

    @app.post("/documents/delete", response_model=ManageResponse, responses=errors, dependencies=[Depends(writer)])
    def delete_documents(req: DeleteRequest) -> ManageResponse:
        """Delete the documents a non-empty filter selects (of ``ids`` when given), in one atomic write."""
        from twotower.retrieval.manage import delete

        live, ids = written(delete, req.filter, req.ids)
        return ManageResponse(version=live.version, documents=len(live), deleted=len(ids), ids=ids)

    @app.patch("/documents", response_model=ManageResponse, responses=errors, dependencies=[Depends(writer)])
    def update_documents(req: UpdateRequest) -> ManageResponse:
        """Change the metadata of the documents ``ids`` and/or a non-empty filter select, and nothing else (no
        re-encoding), in one atomic write."""
        from twotower.errors import TwoTowerError
        from twotower.retrieval.filters import parse_filter
        from twotower.retrieval.manage import metadata_change, update

        if req.ids is None and parse_filter(req.filter).empty:
            raise TwoTowerError('send "ids" or a non-empty "filter": the documents to update')
        change = metadata_change(req.metadata, req.ids, req.merge, req.unset)
        live, ids = written(update, change, req.filter, req.ids)
        return ManageResponse(version=live.version, documents=len(live), updated=len(ids), ids=ids)
