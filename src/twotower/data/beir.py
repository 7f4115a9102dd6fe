"""Load and validate BEIR-format data sets.

A BEIR directory holds ``corpus.jsonl`` (``_id``, ``title``, ``text``; any other field is the document's
metadata), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/<split>.tsv`` (header ``query-id corpus-id score``).
Files are streamed line by line; every problem is reported with file, line and field.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twotower.checks import switch
from twotower.data.ids import document_text_problem, id_problem
from twotower.data.grades import check_grade
from twotower.data.metadata import check_metadata, type_name
from twotower.errors import DataError
from twotower.io import open_input

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Document:
    """One corpus document: its ``id`` (``_id`` in corpus.jsonl), ``title`` (may be empty), ``text`` and
    ``metadata`` (every other field of its JSON object, default empty: :mod:`twotower.data.metadata`).

    Frozen; equality compares all four fields, the hash only ``id``, ``title`` and ``text`` (the metadata is a dict:
    treat it as read-only).

    Example::

        doc = tt.load_beir("my-beir-dir").corpus["d1"]
        print(doc.id, doc.title, doc.text, doc.full_text, doc.metadata)
    """

    id: str
    title: str
    text: str
    metadata: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.metadata is None:  # no metadata
            object.__setattr__(self, "metadata", {})
        elif not isinstance(self.metadata, Mapping):
            raise DataError(f"Document({self.id!r})", f"metadata must be a dict (or None), got "
                            f"{type_name(self.metadata)}", field="metadata",
                            hint='e.g. Document("d1", "Title", "Text", {"source": "wiki"})')

    @property
    def full_text(self) -> str:
        """Title and text joined by a space, as BEIR does for both BM25 and dense models."""
        return f"{self.title} {self.text}".strip() if self.title else self.text


_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, decoded line) and name the line of any non-UTF-8 bytes."""
    if not path.is_file():
        if path.exists():
            raise DataError(path, "is a directory, not a file" if path.is_dir() else "is not a regular file",
                            hint="give the path of a UTF-8 text file")
        packed = [p.name for p in (path.with_name(path.name + ext) for ext in _COMPRESSED) if p.is_file()]
        if packed:
            raise DataError(path, f"file not found; {packed[0]} is there, but twotower reads uncompressed UTF-8 "
                                  "files only", hint=f"unpack it first, e.g. gunzip -k {path.parent / packed[0]}")
        raise DataError(path, "file not found", hint="check the data directory")
    with open_input(path) as handle:  # a regular file (checked on the open descriptor), never a FIFO or device
        if handle.peek(2)[:2] == b"\x1f\x8b" if hasattr(handle, "peek") else False:
            raise DataError(path, "is gzip-compressed: twotower reads uncompressed UTF-8 files only",
                            hint=f"unpack it first: zcat {path} > unpacked.jsonl, then use that file")
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                utf16 = number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff"))
                raise DataError(
                    path,
                    f"bytes that are not UTF-8 at column {exc.start + 1} ({raw[exc.start:exc.start + 4]!r})",
                    line=number,
                    hint="the file is UTF-16 (it starts with a UTF-16 byte-order mark): save it as UTF-8" if utf16
                    else "re-encode the file as UTF-8",
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            _check_line(path, number, line)
            yield number, line


def _check_line(path: Path, number: int, line: str) -> None:
    """Name the two things that make a text file's lines unreadable, before a parser reports a symptom: a NUL byte
    (a UTF-16 or binary file; JSON would say "Extra data") and carriage returns inside a line (CR-only line
    endings: the whole file reads as one line, with a wrong column count)."""
    nul = line.find("\x00")
    if nul >= 0:
        utf16 = "\x00" in line[1::2] or "\x00" in line[0::2]
        raise DataError(path, f"a NUL byte at column {nul + 1}", line=number,
                        hint="the file looks like UTF-16: save it as UTF-8" if utf16 and line.count("\x00") > 2
                        else "a text file holds no NUL bytes: is it binary or corrupted? remove them")
    body = line.rstrip("\r\n")
    if "\r" in body:
        raise DataError(path, f"a carriage return inside the line (column {body.index(chr(13)) + 1}): the file has "
                        "CR-only (old Mac) line endings", line=number,
                        hint="convert them to newlines, e.g. tr '\\r' '\\n' < FILE > FILE.new")


def iter_json_records(path: Path) -> Iterator[tuple[int, dict]]:
    for number, line in _iter_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as exc:
            raise DataError(path, f"malformed JSON: {exc.msg} at column {exc.colno}", line=number) from None
        except RecursionError:
            raise DataError(path, "JSON nested too deeply to read", line=number,
                            hint="metadata may nest 32 levels at most: flatten the record") from None
        except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
            raise DataError(path, f"a number too long to read ({str(exc).split(';')[0]})", line=number,
                            hint="store such a number as a string") from None
        if not isinstance(record, dict):
            raise DataError(path, f"expected a JSON object, got {type(record).__name__}", line=number)
        yield number, record


def _require_id(path: Path, number: int, record: dict) -> str:
    if "_id" not in record:
        raise DataError(path, "missing id", line=number, field="_id", hint="every record needs a string '_id'")
    value = record["_id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(path, f"id must be a string, got {type(value).__name__}", line=number, field="_id")
    value = str(value)
    problem = id_problem(value)
    if problem:
        raise DataError(path, f"id {value!r} {problem}", line=number, field="_id")
    return value


def _require_text(path: Path, number: int, record: dict, name: str, *, required: bool) -> str:
    if name not in record or record[name] is None:
        if required:
            raise DataError(path, f"missing {name}", line=number, field=name)
        return ""
    value = record[name]
    if not isinstance(value, str):
        raise DataError(path, f"{name} must be a string, got {type(value).__name__}", line=number, field=name)
    problem = document_text_problem(value)
    if problem:  # here, not as a codec error from the tokenizer or the index writer after minutes of encoding
        where = f" (record '{record['_id']}')" if isinstance(record.get("_id"), (str, int)) else ""
        raise DataError(path, f"{name}{where} {problem}", line=number, field=name)
    return value


_OWN_FIELDS = ("_id", "title", "text")


def record_metadata(path: Path | str, number: int | None, record: dict, own=_OWN_FIELDS) -> dict:
    """The metadata of a flat document record: every field but ``own`` (checked: :func:`check_metadata`; an ``id``
    there clashes with the document's own id and is refused)."""
    extra = {key: value for key, value in record.items() if key not in own}
    if not extra:
        return {}
    where = f"{path}, line {number}" if number is not None else str(path)
    if "_id" in record and isinstance(record["_id"], (str, int)) and not isinstance(record["_id"], bool):
        where += f" (document '{record['_id']}')"
    return check_metadata(extra, where, flat=True)


def _iter_numbered_documents(path: Path) -> Iterator[tuple[int, Document]]:
    for number, record in iter_json_records(path):
        yield number, Document(
            id=_require_id(path, number, record),
            title=_require_text(path, number, record, "title", required=False),
            text=_require_text(path, number, record, "text", required=True),
            metadata=record_metadata(path, number, record),
        )


def iter_corpus(path: str | Path) -> Iterator[Document]:
    """Stream documents from a BEIR ``corpus.jsonl`` (no duplicate check: see :func:`load_corpus`)."""
    for _, doc in _iter_numbered_documents(Path(path)):
        yield doc


def load_corpus(path: str | Path) -> dict[str, Document]:
    """Load a corpus, rejecting duplicate ids with the lines of both occurrences."""
    path = Path(path)
    docs: dict[str, Document] = {}
    first_line: dict[str, int] = {}
    for number, doc in _iter_numbered_documents(path):
        if doc.id in docs:
            raise DataError(
                path, f"duplicate id '{doc.id}' (first seen on line {first_line[doc.id]})", line=number, field="_id"
            )
        docs[doc.id] = doc
        first_line[doc.id] = number
    if not docs:
        raise DataError(path, "no documents", hint="the corpus file is empty")
    return docs


def load_queries(path: str | Path) -> dict[str, str]:
    """Load queries as ``{id: text}``, rejecting duplicates."""
    path = Path(path)
    queries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, record in iter_json_records(path):
        qid = _require_id(path, number, record)
        if qid in queries:
            raise DataError(
                path, f"duplicate id '{qid}' (first seen on line {first_line[qid]})", line=number, field="_id"
            )
        queries[qid] = _require_text(path, number, record, "text", required=True)
        first_line[qid] = number
    return queries


_QRELS_HEADER = ("query-id", "corpus-id", "score")


def load_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Load a qrels TSV as ``{query_id: {doc_id: score}}``.

    The header row ``query-id corpus-id score`` is optional (BEIR files have it).
    """
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    for number, line in _iter_lines(path):
        stripped = line.rstrip("\r\n")
        if not stripped.strip():
            continue
        parts = stripped.split("\t")
        if number == 1 and tuple(p.strip() for p in parts) == _QRELS_HEADER:
            continue
        if number == 1 and len(parts) == 3 and not _is_number(parts[2]):
            raise DataError(path, f"the first row {stripped!r} is not a judgement (its score is not a number) nor "
                            "the header BEIR files start with", line=number,
                            hint="write the header as 'query-id\\tcorpus-id\\tscore' (hyphens, tab-separated) or "
                            "drop it")
        if len(parts) != 3:
            raise DataError(
                path,
                f"expected 3 tab-separated columns (query-id, corpus-id, score), got {len(parts)}",
                line=number,
            )
        qid, did, score_text = (p.strip() for p in parts)
        for value, column in ((qid, "query-id"), (did, "corpus-id")):
            problem = id_problem(value)
            if problem:
                raise DataError(path, f"{column} {value!r} {problem}", line=number, field=column)
        try:
            score = int(score_text)
        except ValueError:
            raise DataError(
                path, f"score must be an integer, got '{score_text}'", line=number, field="score"
            ) from None
        check_grade(score, path, number)  # 10**12 or -5e9: a wrong column, not a grade
        seen = qrels.setdefault(qid, {})
        if did in seen and seen[did] != score:  # which one holds? the last silently won
            raise DataError(path, f"query '{qid}' judges document '{did}' twice, with scores {seen[did]} and {score}",
                            line=number, field="score", hint="keep one row per (query-id, corpus-id) pair")
        seen[did] = score
    return qrels


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def beir_files(root: str | Path) -> list[Path]:
    """The files a BEIR directory's readers take as input: corpus, queries and every qrels split."""
    root = Path(root)
    qrels = sorted((root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
    return [root / "corpus.jsonl", root / "queries.jsonl", *qrels]


@dataclass
class BeirDataset:
    """A loaded BEIR split: corpus, the queries judged in the split, and its qrels."""

    root: Path
    split: str
    corpus: dict[str, Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    unknown_queries: int = 0
    unknown_docs: int = 0
    warnings: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # one line: the default would print the whole corpus
        name = Path(self.root).name if self.root is not None else "in-memory"
        judgements = sum(len(r) for r in self.qrels.values())
        return (f"{type(self).__name__}({name!r}, split={self.split!r}, documents={len(self.corpus)}, "
                f"queries={len(self.queries)}, judgements={judgements})")

    @classmethod
    def load(cls, root: str | Path, split: str = "test", *, strict: bool = False) -> "BeirDataset":
        """Load ``root`` and keep the queries that ``qrels/<split>.tsv`` judges.

        Qrels rows naming unknown queries or documents are dropped and counted (and logged as warnings,
        kept in ``warnings``); with ``strict=True`` they are an error instead. A split left without any
        judged query (an empty ``queries.jsonl`` or qrels file, or ids that match nothing) is a
        :class:`DataError` naming the file, before anyone encodes a corpus for it.
        """
        root = Path(root)
        if not root.is_dir():
            raise DataError(root, "data directory not found", hint="pass a BEIR-format directory")
        qrels_path = root / "qrels" / f"{split}.tsv"
        if not qrels_path.is_file():
            available = sorted(p.stem for p in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
            raise DataError(
                qrels_path, "qrels file not found", hint=f"available splits: {', '.join(available) or 'none'}"
            )
        corpus = load_corpus(root / "corpus.jsonl")
        queries_path = root / "queries.jsonl"
        all_queries = load_queries(queries_path)
        if not all_queries:
            raise DataError(queries_path, "no queries",
                            hint="the file holds no query: add one JSON object per line with '_id' and 'text'")
        raw_qrels = load_qrels(qrels_path)
        if not raw_qrels:
            raise DataError(qrels_path, f"no judgements in split '{split}'",
                            hint="add rows 'query-id<TAB>corpus-id<TAB>score' or choose another split")

        return cls.from_parts(root, split, corpus, all_queries, raw_qrels, strict=strict, qrels_path=qrels_path,
                              queries_path=queries_path)

    @classmethod
    def from_parts(
        cls, root: str | Path | None, split: str, corpus: dict[str, Document], all_queries: dict[str, str],
        raw_qrels: dict[str, dict[str, int]], *, strict: bool = False, qrels_path: str | Path = "qrels",
        queries_path: str | Path = "queries",
    ) -> "BeirDataset":
        """The split from loaded parts: keep the queries ``raw_qrels`` judges, drop (and count, or with ``strict``
        refuse) judgements of unknown queries or documents. ``qrels_path`` / ``queries_path`` name the sources
        in messages (files, or ``qrels`` / ``queries`` for in-memory data)."""
        qrels_path, queries_path = Path(qrels_path), Path(queries_path)
        unknown_q = [q for q in raw_qrels if q not in all_queries]
        unknown_d = sum(1 for rels in raw_qrels.values() for d in rels if d not in corpus)
        warnings = []
        if unknown_q:
            warnings.append(
                f"{qrels_path}: {len(unknown_q)} judged queries are not in queries.jsonl (e.g. '{unknown_q[0]}')"
            )
        if unknown_d:
            warnings.append(f"{qrels_path}: {unknown_d} judgements name documents not in corpus.jsonl")
        if warnings and strict:
            raise DataError(qrels_path, "; ".join(w.split(": ", 1)[1] for w in warnings),
                            hint=f"fix the qrels or drop {switch('strict')}")
        for w in warnings:  # logged here once; callers (the CLI) need not print ds.warnings again
            log.warning(w)

        qrels = {
            q: {d: s for d, s in rels.items() if d in corpus}
            for q, rels in raw_qrels.items()
            if q in all_queries
        }
        qrels = {q: rels for q, rels in qrels.items() if rels}
        queries = {q: all_queries[q] for q in qrels}
        if not queries:
            raise DataError(
                qrels_path,
                f"none of the {len(raw_qrels)} judged queries of split '{split}' is usable "
                f"({len(unknown_q)} not in {queries_path.name}, {len(raw_qrels) - len(unknown_q)} judging only "
                f"documents not in corpus.jsonl)",
                hint="the query-id and corpus-id columns must match the '_id' values of queries.jsonl and corpus.jsonl",
            )
        return cls(Path(root) if root is not None else None, split, corpus, queries, qrels, len(unknown_q), unknown_d, warnings)
