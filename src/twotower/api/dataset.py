"""Data sets: a BEIR folder on disk, or the same built from Python lists and dicts."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from twotower.data.beir import BeirDataset, Document, _require_id, _require_text, load_qrels, record_metadata
from twotower.data.ids import document_text_problem
from twotower.data.metadata import check_metadata, document_id, flat_document
from twotower.api._errors import user_errors
from twotower.errors import DataError, TwoTowerError
from twotower.io import atomic_directory

__all__ = ["Dataset", "Document", "load_beir", "as_documents", "corpus_documents", "stored_document"]


def _records(source, what: str) -> Iterable[tuple[str, dict, dict | None]]:
    """``(where, record, metadata)`` from a list of dicts or :class:`Document` objects, or a ``{id: ...}`` mapping
    (``where`` names it in errors). A flat dict's metadata is its other keys (``metadata`` None: taken from the
    record); a :class:`Document`'s is its own ``metadata``, kept apart, so any key is allowed there."""
    if isinstance(source, Mapping):
        for key, value in source.items():
            where = f"{what}[{key!r}]"
            if isinstance(value, Document):
                if value.id != key:
                    raise DataError(where, f"the Document's id {value.id!r} is not its key {key!r}", field="_id",
                                    hint="key each Document by its own id")
                yield where, {"_id": key, "title": value.title, "text": value.text}, value.metadata
                continue
            record = {"text": value} if isinstance(value, str) else value
            if not isinstance(record, Mapping):
                raise DataError(where, f"expected a string or a dict with 'text', got {type(value).__name__}")
            for name in ("_id", "id"):
                if name in record and record[name] != key:
                    raise DataError(where, f"the document's {name} {record[name]!r} is not its key "
                                    f"{key!r}", field=name, hint="drop it: the key is the id")
            yield where, {**{k: v for k, v in record.items() if k != "id"}, "_id": key}, None
    elif isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise DataError(what, f"expected a list of dicts or a dict keyed by id, got {type(source).__name__}")
    else:
        for i, value in enumerate(source):
            if isinstance(value, Document):
                yield f"{what}[{i}]", {"_id": value.id, "title": value.title, "text": value.text}, value.metadata
                continue
            if not isinstance(value, Mapping):
                raise DataError(f"{what}[{i}]", f"expected a dict with '_id' and 'text', got {type(value).__name__}")
            yield f"{what}[{i}]", _with_id(dict(value), f"{what}[{i}]"), None


def _with_id(record: dict, where: str) -> dict:
    """A dict document with ``id`` (the LangChain / Chroma spelling) moved to ``_id`` (the BEIR one)."""
    if "id" not in record:
        return record
    doc_id = record.pop("id")
    if "_id" in record and record["_id"] != doc_id:
        raise DataError(where, f"both _id {record['_id']!r} and id {doc_id!r}", field="id", hint="give one of them")
    return {"_id": doc_id, **record}


def _string_records(texts: list, what: str, ids, metadatas) -> list[tuple[str, dict, dict | None]]:
    """``(where, record, metadata)`` for a list of plain strings, with the ``ids`` (default: content ids) and
    ``metadatas`` (each a dict or None: its own namespace, any key allowed) given beside them."""
    for name, values in (("ids", ids), ("metadatas", metadatas)):
        if values is None:
            continue
        if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
            raise DataError(name, f"expected a list, got {type(values).__name__}", hint=f"one entry per text")
        if len(values) != len(texts):
            raise DataError(name, f"{len(values)} {name} for {len(texts)} texts", hint="give one entry per text")
    out = []
    for i, text in enumerate(texts):
        where = f"{what}[{i}]"
        if not isinstance(text, str):
            raise DataError(where, f"expected a string (the list's first item is one), got {type(text).__name__}",
                            hint="give all documents as strings, or all as dicts with '_id' and 'text'")
        problem = document_text_problem(text)
        if problem:
            raise DataError(where, f"text {problem}", field="text")
        doc_id = ids[i] if ids is not None else document_id(text)
        meta = metadatas[i] if metadatas is not None else None
        if meta is not None and not isinstance(meta, Mapping):
            raise DataError(f"metadatas[{i}]", f"expected a dict or None, got {type(meta).__name__}")
        out.append((where, {"_id": doc_id, "text": text}, meta or {}))
    return out


def as_documents(corpus, what: str = "corpus", *, ids=None, metadatas=None) -> dict[str, Document]:
    """``{id: Document}`` from documents given as a list of strings (ids from the content:
    :func:`~twotower.document_id`, or ``ids``; metadata from ``metadatas``), ``[{"_id" or "id", "title", "text",
    ...}]`` (the flat form: every other key is metadata, ``id`` a second spelling of ``_id``), ``{id: text}``,
    ``{id: {"title", "text", ...}}`` or :class:`Document` objects (their metadata apart: any key), checked as a BEIR ``corpus.jsonl`` is (ids non-empty and unique, texts strings, metadata JSON:
    :mod:`twotower.data.metadata`)."""
    if isinstance(corpus, (set, frozenset)):
        if not all(isinstance(t, str) for t in corpus) or ids is not None or metadatas is not None:
            raise DataError(what, "a set has no order, so nothing in it can be paired with ids, metadatas or a "
                            "position", hint="give a list")
        corpus = sorted(corpus)  # a text's id comes from its content; sorted: the same order on every run
    elif isinstance(corpus, Iterable) and not isinstance(corpus, (Sequence, Mapping, str, bytes)):
        corpus = list(corpus)  # a generator or another iterator: read once, then as a list
    items = list(corpus) if isinstance(corpus, Sequence) and not isinstance(corpus, (str, bytes)) else None
    if items and isinstance(items[0], str):
        records = _string_records(items, what, ids, metadatas)
    else:
        if ids is not None or metadatas is not None:
            raise DataError("ids" if ids is not None else "metadatas", "goes with a list of strings; these documents "
                            "carry their own ids and metadata", hint="put the id and the metadata keys into each "
                            "document's dict, or give the texts as strings")
        records = _records(corpus, what)
    docs: dict[str, Document] = {}
    first: dict[str, str] = {}
    for where, record, meta in records:
        doc_id = _require_id(Path(where), None, record)
        doc = Document(doc_id, _require_text(Path(where), None, record, "title", required=False),
                       _require_text(Path(where), None, record, "text", required=True),
                       record_metadata(where, None, record) if meta is None else check_metadata(meta, where))
        if doc_id in docs:
            raise DataError(where, f"duplicate document id '{doc_id}' (first: {first[doc_id]})", field="_id",
                            hint="ids must be unique" + ("; a text's id comes from its content: the same text twice?"
                                                         if ids is None and items and isinstance(items[0], str)
                                                         else ""))
        docs[doc_id] = doc
        first[doc_id] = where
    return docs


def corpus_documents(corpus, *, ids=None, metadatas=None) -> list:
    """The documents of ``corpus``: a :class:`~twotower.Dataset`, a BEIR folder or ``corpus.jsonl`` path, or Python
    documents: a list of strings (ids from the content, :func:`~twotower.document_id`, unless ``ids`` are given;
    ``metadatas``: one dict or None per text), ``[{"_id" or "id", "title", "text", ...}]`` (every other key is
    metadata), ``{id: text}``, ``{id: {"title", "text", ...}}`` or :class:`~twotower.Document` objects."""
    from twotower.data.beir import load_corpus

    if isinstance(corpus, (BeirDataset, str, Path)) and (ids is not None or metadatas is not None):
        raise DataError("ids" if ids is not None else "metadatas", "goes with a list of strings, not a data set or "
                        "a file", hint="put extra fields into the corpus file's records: they become metadata")
    if isinstance(corpus, BeirDataset):
        return list(corpus.corpus.values())
    if isinstance(corpus, (str, Path)):
        path = Path(corpus)
        return list(load_corpus(path / "corpus.jsonl" if path.is_dir() else path).values())
    return list(as_documents(corpus, ids=ids, metadatas=metadatas).values())


def stored_document(store, row: int) -> dict:
    """The document in ``row`` in the flat form: ``{"_id", "title", "text", **metadata}`` (a
    :class:`~twotower.DataError` naming the key when its metadata holds ``_id``, ``id``, ``title`` or ``text``:
    :func:`~twotower.data.metadata.flat_document`)."""
    doc = store.document(row)
    return flat_document(doc["_id"], doc["title"], doc["text"], doc.get("metadata"), f"document {doc['_id']!r}")


def _queries(queries) -> dict[str, str]:
    out: dict[str, str] = {}
    for where, record, _ in _records(queries, "queries"):
        qid = _require_id(Path(where), None, record)
        if qid in out:
            raise DataError(where, f"duplicate query id '{qid}'", field="_id", hint="ids must be unique")
        out[qid] = _require_text(Path(where), None, record, "text", required=True)
    return out


def _qrels(qrels) -> dict[str, dict[str, int]]:
    if not isinstance(qrels, Mapping):
        raise DataError("qrels", f"expected {{query_id: {{doc_id: grade}}}}, got {type(qrels).__name__}")
    out: dict[str, dict[str, int]] = {}
    for qid, rels in qrels.items():
        if not isinstance(rels, Mapping):
            raise DataError(f"qrels[{qid!r}]", f"expected {{doc_id: grade}}, got {type(rels).__name__}")
        for did, grade in rels.items():
            if isinstance(grade, bool) or not isinstance(grade, int):
                raise DataError(f"qrels[{qid!r}][{did!r}]", f"grade must be an integer, got {grade!r}")
        out[str(qid)] = {str(d): int(g) for d, g in rels.items()}
    return out


@dataclass(repr=False)  # BeirDataset's one-line repr
class Dataset(BeirDataset):
    """One split of a retrieval data set: ``corpus`` (``{id: Document}``, each with ``title`` and ``text``),
    ``queries`` (``{id: text}``, the queries the split judges) and ``qrels`` (``{query_id: {doc_id: grade}}``).

    Load one from a BEIR folder with :func:`load_beir`, or build one in memory with :meth:`from_lists`; either
    goes to :meth:`Index.build <twotower.Index.build>` and :func:`evaluate <twotower.evaluate>`.

    Example::

        import twotower as tt

        ds = tt.Dataset.from_lists(
            corpus=[{"_id": "d1", "title": "Tea", "text": "Green tea is steamed."},
                    {"_id": "d2", "text": "Coffee beans are roasted."}],
            queries={"q1": "how is green tea made"},
            qrels={"q1": {"d1": 1}},
        )
        print(len(ds.corpus), ds.queries["q1"], ds.splits())
    """

    @classmethod
    @user_errors
    def from_lists(cls, corpus, queries, qrels, *, split: str = "test", strict: bool = False) -> "Dataset":
        """A data set from Python objects, checked as :func:`load_beir` checks files.

        ``corpus``: ``[{"_id", "title", "text"}, ...]``, ``{id: text}`` or ``{id: {"title", "text"}}``;
        ``queries``: ``{id: text}`` or ``[{"_id", "text"}, ...]``; ``qrels``: ``{query_id: {doc_id: grade}}``
        (grade > 0: relevant). Judgements of unknown queries or documents are dropped and counted in
        ``warnings`` (``strict=True``: a :class:`~twotower.DataError`).

        Example::

            ds = tt.Dataset.from_lists({"d1": "Green tea is steamed."}, {"q1": "green tea"}, {"q1": {"d1": 1}})
            assert ds.qrels == {"q1": {"d1": 1}}
        """
        docs, all_queries, raw = as_documents(corpus), _queries(queries), _qrels(qrels)
        if not all_queries:
            raise DataError("queries", "no queries", hint="give at least one query")
        if not raw:
            raise DataError("qrels", "no judgements", hint="give {query_id: {doc_id: grade}} for at least one query")
        base = BeirDataset.from_parts(None, split, docs, all_queries, raw, strict=strict)
        return cls(**vars(base))

    @classmethod
    def load(cls, root: str | Path, split: str = "test", *, strict: bool = False) -> "Dataset":
        """Load one split of a BEIR folder (see :func:`load_beir`; ``root`` may be a loaded Dataset: its folder)."""
        return cls(**vars(BeirDataset.load(data_folder(root, "root"), split, strict=strict)))

    @property
    def name(self) -> str:
        """The folder's name for a loaded data set, ``in-memory`` for one built from lists."""
        return Path(self.root).name if self.root is not None else "in-memory"

    def splits(self) -> list[str]:
        """The qrels splits of the folder this data set was loaded from (just its own split when in memory)."""
        if self.root is None or not (Path(self.root) / "qrels").is_dir():
            return [self.split]
        return sorted(p.stem for p in (Path(self.root) / "qrels").glob("*.tsv"))

    def with_split(self, split: str) -> "Dataset":
        """The same folder's ``split`` (a loaded data set only)."""
        if self.root is None:
            raise DataError("dataset", f"an in-memory data set has only its split '{self.split}'",
                            hint="build another with Dataset.from_lists(..., split=...)")
        return Dataset.load(self.root, split)

    def save(self, root: str | Path) -> Path:
        """Write the data set as a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``), atomically;
        every command and :func:`twotower.fit` read such folders.

        Example::

            folder = ds.save("my-beir-dir")
            assert tt.load_beir(folder).qrels == ds.qrels
        """
        import json

        root = Path(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise DataError(root, "exists and is not an empty folder", hint="save to a new folder: nothing is replaced")
        with atomic_directory(root) as tmp:
            with (tmp / "corpus.jsonl").open("w", encoding="utf-8") as f:
                for d in self.corpus.values():  # the flat form: metadata holding _id, id, title or text is refused
                    record = flat_document(d.id, d.title, d.text, d.metadata, f"corpus[{d.id!r}]")
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
            with (tmp / "queries.jsonl").open("w", encoding="utf-8") as f:
                for qid, text in self.queries.items():
                    f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
            (tmp / "qrels").mkdir()
            with (tmp / "qrels" / f"{self.split}.tsv").open("w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                for qid, rels in self.qrels.items():
                    for did, grade in rels.items():
                        f.write(f"{qid}\t{did}\t{grade}\n")
        load_qrels(root / "qrels" / f"{self.split}.tsv")  # what was written reads back
        return root


@user_errors
def load_beir(root: str | Path, split: str = "test", *, strict: bool = False) -> Dataset:
    """Load one split of a BEIR-format folder: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
    (``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``, ``score``).

    Every problem is a :class:`~twotower.DataError` naming the file, line and field. Judgements of unknown queries or
    documents are dropped and counted in ``warnings`` (``strict=True``: an error instead). ``root`` may be a loaded
    :class:`Dataset`: ``split`` of its folder.

    Example::

        import twotower as tt

        ds = tt.load_beir("my-beir-dir", split="test")
        print(ds.name, len(ds.corpus), "documents,", len(ds.queries), "judged queries; splits:", ds.splits())
    """
    return Dataset.load(root, split, strict=strict)


def data_folder(value, name: str, *, split: str | None = None) -> Path:
    """A data parameter's BEIR folder: a str or path as given; a loaded Dataset's folder, when the split it holds is
    the one the function reads (``split``; None: any). An in-memory Dataset (``Dataset.from_lists``) is refused:
    it has no folder until ``ds.save(folder)``."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    if not isinstance(value, BeirDataset):
        raise TwoTowerError(f"{name}: a BEIR folder (a str or pathlib.Path) or a tt.Dataset loaded from one, not "
                            f"{type(value).__name__}")
    if value.root is None:
        raise TwoTowerError(f"{name}: this Dataset was made in memory and has no folder: save it first "
                            "(ds.save(folder)) and give the folder")
    if split is not None and value.split != split:
        raise TwoTowerError(f"{name}: the Dataset holds split '{value.split}' but split is '{split}': give "
                            f"split='{value.split}', or load split '{split}' (tt.load_beir(folder, split='{split}'))")
    return Path(value.root)
