"""Data sets: a BEIR folder on disk, or the same built from Python lists and dicts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from twotower.data.beir import BeirDataset, Document, _require_id, _require_text, load_qrels
from twotower.api._errors import user_errors
from twotower.errors import DataError
from twotower.io import atomic_directory

__all__ = ["Dataset", "Document", "load_beir", "as_documents"]


def _records(source, what: str) -> Iterable[tuple[str, dict]]:
    """``(where, record)`` pairs from a list of dicts or a ``{id: ...}`` mapping (``where`` names it in errors)."""
    if isinstance(source, Mapping):
        for key, value in source.items():
            if isinstance(value, Document):
                value = {"title": value.title, "text": value.text}
            record = {"text": value} if isinstance(value, str) else value
            if not isinstance(record, Mapping):
                raise DataError(f"{what}[{key!r}]", f"expected a string or a dict with 'text', got "
                                f"{type(value).__name__}")
            yield f"{what}[{key!r}]", {"_id": key, **record}
    elif isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise DataError(what, f"expected a list of dicts or a dict keyed by id, got {type(source).__name__}")
    else:
        for i, value in enumerate(source):
            if isinstance(value, Document):
                value = {"_id": value.id, "title": value.title, "text": value.text}
            if not isinstance(value, Mapping):
                raise DataError(f"{what}[{i}]", f"expected a dict with '_id' and 'text', got {type(value).__name__}")
            yield f"{what}[{i}]", dict(value)


def as_documents(corpus, what: str = "corpus") -> dict[str, Document]:
    """``{id: Document}`` from documents given as ``[{"_id", "title", "text"}]``, ``{id: text}``,
    ``{id: {"title", "text"}}`` or :class:`Document` objects, checked as a BEIR ``corpus.jsonl`` is (ids non-empty
    and unique, texts strings)."""
    docs: dict[str, Document] = {}
    for where, record in _records(corpus, what):
        doc_id = _require_id(Path(where), None, record)
        doc = Document(doc_id, _require_text(Path(where), None, record, "title", required=False),
                       _require_text(Path(where), None, record, "text", required=True))
        if doc_id in docs:
            raise DataError(where, f"duplicate document id '{doc_id}'", field="_id", hint="ids must be unique")
        docs[doc_id] = doc
    return docs


def _queries(queries) -> dict[str, str]:
    out: dict[str, str] = {}
    for where, record in _records(queries, "queries"):
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
        """Load one split of a BEIR folder (see :func:`load_beir`)."""
        return cls(**vars(BeirDataset.load(root, split, strict=strict)))

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
                for d in self.corpus.values():
                    f.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n")
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
    documents are dropped and counted in ``warnings`` (``strict=True``: an error instead).

    Example::

        import twotower as tt

        ds = tt.load_beir("my-beir-dir", split="test")
        print(ds.name, len(ds.corpus), "documents,", len(ds.queries), "judged queries; splits:", ds.splits())
    """
    return Dataset.load(root, split, strict=strict)
