"""What ``eval --index`` checks before scoring a stored index against a BEIR corpus: that the index was
built from that very corpus, which model it holds (the result's label), and whether its search is
approximate (a warning: ANN metrics can be lower than exact ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from twotower.checks import flag, given, naming
from twotower.retrieval.index import fingerprint
from twotower.retrieval.index.errors import IndexStoreError


@dataclass
class IndexForEval:
    model: str | None  # the name of the model that encoded the index's documents
    warnings: list[str] = field(default_factory=list)


def _stored_fingerprint(store) -> int:
    value = fingerprint.parse(store.manifest.get("corpus"))
    if value is None:  # written before indexes recorded it: compute it from the stored documents
        value = fingerprint.combine(store.document_fields(r) for r in range(len(store)))
    return value


def _differences(store, corpus: dict) -> str:
    """Which documents set the index and the corpus apart, in words."""
    in_index = set(store.row_of)
    missing = [d for d in corpus if d not in in_index]
    extra = [d for d in store.doc_ids if d not in corpus]
    changed = [
        d for d in corpus if d in in_index
        and store.document_fields(store.row_of[d]) != (corpus[d].id, corpus[d].title, corpus[d].text)
    ]
    parts = []
    for items, what in ((missing, "of the corpus are not in the index"), (extra, "of the index are not in the corpus"),
                        (changed, "differ in title or text")):
        if items:
            parts.append(f"{len(items)} document(s) {what} (e.g. '{items[0]}')")
    return "; ".join(parts) or "the documents differ"


def check_index_for_eval(
    index: str | Path | None, dataset, *, retriever: str, model: str | None = None
) -> IndexForEval:
    """Refuse an index built from another corpus than ``dataset``'s (a :class:`twotower.data.beir.BeirDataset`);
    otherwise return the index's model name and the warnings to show once with the result. Without an
    index (``None``) there is nothing to check: no model, no warnings."""
    if index is None:
        return IndexForEval(model=None)
    from twotower.retrieval.index.kinds import is_exact
    from twotower.retrieval.backends import open_store

    store = open_store(index)
    try:
        corpus = dataset.corpus
        if len(store) != len(corpus) or _stored_fingerprint(store) != fingerprint.of_corpus(corpus):
            raise IndexStoreError(
                f"{index}: built from a different corpus than "
                f"{Path(dataset.root) / 'corpus.jsonl' if dataset.root is not None else 'the data set given'}: "
                f"{_differences(store, corpus)}. Scores against it would rank other documents than the qrels "
                f"judge (rebuild the index from this corpus with {_rebuild(dataset.root)}, or evaluate without "
                f"{_the_index()})"
            )
        info = store.manifest.get("model") or {}
        result = IndexForEval(model=info.get("name") if retriever != "bm25" else None)
        if retriever == "bm25":
            return result
        factory = store.manifest["factory"]
        if not is_exact(factory) and (store.manifest.get("milvus") or {}).get("index_type") != "FLAT":
            result.warnings.append(
                f"{index} is a {factory} index, so the search is approximate (ANN) and its metrics can be lower "
                f"than exact search's; for exact metrics build the index with {given('kind', 'flat')} or run eval "
                f"without {_the_index()}"
            )
        if model is not None and not _same_model(model, info):
            result.warnings.append(
                f"queries are encoded with {given('model', model)} but the documents in {index} were encoded with "
                f"{info.get('name')} ({info.get('path')}); their vectors are comparable only if the two are the "
                f"same model"
            )
        return result
    finally:
        store.close()


def _rebuild(root) -> str:
    """How to index ``root``'s corpus anew, as the caller would: the command under the CLI's names, else
    ``tt.Index.build``."""
    if naming() == "cli":
        return f"'twotower index build --data {root} --out INDEX'"
    return f"tt.Index.build(path, {str(root)!r})" if root is not None else "tt.Index.build(path, dataset)"


def _the_index() -> str:
    """The stored index evaluated: eval's ``--index``; from Python the Index given as ``retriever``."""
    return f"the stored index ({flag('retriever', '--index')})"


def _same_model(model: str, info: dict) -> bool:
    path = Path(model).expanduser()
    if path.exists() and info.get("path") and Path(info["path"]).exists():
        return path.resolve() == Path(info["path"]).resolve()
    return model in (info.get("name"), info.get("path"))
