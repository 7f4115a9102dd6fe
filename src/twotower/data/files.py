"""Files in: a folder, one file or a glob of ``.txt``, ``.md``, ``.html``, ``.pdf`` and ``.docx`` files read as
:class:`~twotower.Document` objects, one per file, by well-kept parsers (pypdf for PDF pages, trafilatura for an
HTML page's main text, markdown-it for a Markdown file's first heading, python-docx for Word files).

A document's ``id`` is its path relative to the folder (POSIX style: ``guides/intro.md``; a single file: its name;
a glob: relative to the folder before its first wildcard). Its ``title``: HTML ``<title>``, the first Markdown
heading, the PDF's or Word file's title, else the file name. Its ``metadata``: ``source`` (the same relative path),
``format`` (``text`` ``markdown`` ``html`` ``pdf`` ``docx``), ``size`` (bytes), ``mtime`` (seconds since the epoch)
and ``sha256`` (of the file's bytes: what :meth:`Index.sync <twotower.Index.sync>` compares); a PDF's also
``pages`` and ``page_starts`` (the character offset where each page's text starts, so that a passage knows its
page). Text files are read as UTF-8 (a byte-order mark dropped; another encoding only where charset-normalizer
recognises it), with line ends made ``\\n``.

A file that cannot be read never stops the rest: binary files, unknown extensions, undecodable bytes, encrypted or
corrupt PDFs, files without text, files over ``max_bytes``, broken links and symbolic-link loops are each skipped
with their reason (:class:`Skipped`). Hidden files and folders (a name starting with ``.``) are left out.

Example::

    from twotower.data.files import load_files

    loaded = load_files("my-notes")          # a folder, a file, or a glob such as "docs/**/*.md"
    print(len(loaded.documents), loaded.summary())
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import stat
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from twotower.checks import flag
from twotower.data.beir import Document
from twotower.errors import DataError

log = logging.getLogger(__name__)

FORMATS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
           ".htm": "html", ".pdf": "pdf", ".docx": "docx"}
MAX_FILE_BYTES = 64 * 2**20  # one file's size limit by default (64 MiB)
_MAGIC = re.compile(r"[*?\[]")


class FileSkip(Exception):
    """One file cannot be read as a document; the message is the reason."""


@dataclass(frozen=True)
class Skipped:
    """A file left out: its ``path`` (relative, POSIX) and the ``reason``."""

    path: str
    reason: str

    def to_dict(self) -> dict:
        return {"path": self.path, "reason": self.reason}


@dataclass
class FileCorpus:
    """What :func:`load_files` read: ``documents`` (in id order), ``skipped`` files with their reasons, and the
    ``root`` folder the ids are relative to."""

    documents: list[Document]
    skipped: list[Skipped] = field(default_factory=list)
    root: Path = Path(".")

    def summary(self) -> str:
        """One line: how many files became documents, how many were skipped and why (counts per reason kind)."""
        from collections import Counter

        kinds = Counter(s.reason.split(":")[0].split(" (")[0] for s in self.skipped)  # the reason's kind, not details
        why = "; ".join(f"{n} {reason}" for reason, n in kinds.most_common())
        return f"{len(self.documents)} files read, {len(self.skipped)} skipped" + (f" ({why})" if why else "")


def is_file_source(source) -> bool:
    """Whether ``source`` names files to read (a folder without ``corpus.jsonl``, a file of a format in
    :data:`FORMATS`, or a glob) rather than a BEIR folder or a corpus ``.jsonl`` file."""
    if not isinstance(source, (str, Path)):
        return False
    path = Path(source)
    if path.is_dir():
        return not (path / "corpus.jsonl").exists()
    if path.suffix.lower() in FORMATS:
        return True
    return not path.exists() and bool(_MAGIC.search(str(source)))


def page_of(page_starts, offset: int) -> int | None:
    """The 1-based page a character ``offset`` falls on, from a PDF document's ``page_starts`` metadata (None:
    no page starts, or not a list of numbers)."""
    if not isinstance(page_starts, list) or not page_starts or \
            not all(isinstance(p, int) and not isinstance(p, bool) for p in page_starts):
        return None
    return max(1, bisect_right(page_starts, offset))


def page_breaks(metadata) -> list[int]:
    """Where a document's passages must start so that none crosses a page: the character offsets of its pages after
    the first, from a PDF document's ``page_starts`` metadata (``[]``: no pages, or not an ascending list of
    numbers)."""
    starts = (metadata or {}).get("page_starts") if isinstance(metadata, dict) else None
    if page_of(starts, 0) is None or any(b < a for a, b in zip(starts, starts[1:])):
        return []
    return [int(c) for c in starts[1:]]


# ---------------------------------------------------------------------------------------------------- readers
def _decode(raw: bytes) -> str:
    if b"\x00" in raw[:8192] and not raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise FileSkip("binary file (NUL bytes): not text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = raw.decode("utf-16", errors="strict")
        else:
            from charset_normalizer import from_bytes

            matches = [m for m in from_bytes(raw[: 1 << 20]) if m.encoding != "utf_8" and m.chaos <= 0.2]
            # short Western texts fit several single-byte code pages equally: Windows-1252 (Latin-1's superset) first
            chosen = next((m for m in matches if m.encoding in ("cp1252", "latin_1")), matches[0] if matches else None)
            if chosen is None:
                raise FileSkip("undecodable bytes: not UTF-8 text and no other encoding recognised; save it as UTF-8")
            try:
                text = raw.decode(chosen.encoding, errors="strict")
            except UnicodeDecodeError:  # recognised on the first MiB only
                raise FileSkip(f"undecodable bytes: not UTF-8, and not {chosen.encoding} throughout") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _markdown_title(text: str) -> str:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(text)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and i + 1 < len(tokens) and tokens[i + 1].content.strip():
            return tokens[i + 1].content.strip()
    return ""


def _html(raw: bytes) -> tuple[str, str]:
    import lxml.html
    import trafilatura

    try:
        tree = lxml.html.fromstring(raw)
    except (ValueError, lxml.etree.ParserError) as exc:
        raise FileSkip(f"unreadable HTML: {exc}") from None
    title = " ".join(" ".join(tree.xpath("//title//text()")).split())
    text = trafilatura.extract(raw, include_comments=False, include_tables=True, favor_recall=True)
    if not text or not text.strip():  # a page trafilatura finds no main text in: the body without scripts/menus
        for bad in tree.xpath("//script|//style|//nav|//header|//footer|//noscript|//template"):
            bad.drop_tree()
        body = tree.find("body")
        text = "\n".join(line.strip() for line in (body if body is not None else tree).text_content().splitlines()
                         if line.strip())
    return title, text


def _pdf(path: Path) -> tuple[str, str, dict]:
    import pypdf

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # pypdf warns on every odd object; the skip says enough
    try:
        reader = pypdf.PdfReader(str(path))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileSkip("encrypted PDF: it needs a password; decrypt it first (for example with qpdf)")
        pages = [page.extract_text() or "" for page in reader.pages]
        info = reader.metadata
        title = str(info.title).strip() if info is not None and info.title else ""
    except FileSkip:
        raise
    except Exception as exc:  # pypdf raises many kinds on broken files (PdfReadError, KeyError, ValueError, ...)
        reason = "encrypted PDF" if "decrypt" in str(exc).lower() or "encrypt" in str(exc).lower() else "corrupt PDF"
        raise FileSkip(f"{reason}: {type(exc).__name__}: {str(exc)[:120]}") from None
    starts, parts, at = [], [], 0
    for text in pages:
        text = text.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
        starts.append(at)
        parts.append(text)
        at += len(text) + 2  # the pages joined by a blank line
    return title, "\n\n".join(parts), {"pages": len(pages), "page_starts": starts}


def _docx(path: Path) -> tuple[str, str]:
    import docx

    try:
        document = docx.Document(str(path))
    except Exception as exc:  # python-docx: PackageNotFoundError, BadZipFile, KeyError on broken packages
        raise FileSkip(f"corrupt Word file: {type(exc).__name__}: {str(exc)[:120]}") from None
    paragraphs = [p for p in document.paragraphs if p.text.strip()]
    title = (document.core_properties.title or "").strip()
    if not title:
        title = next((p.text.strip() for p in paragraphs if p.style is not None and
                      (p.style.name or "").lower().startswith(("title", "heading"))), "")
    return title, "\n".join(p.text for p in paragraphs)


def _size_option() -> str:
    """The size limit as the caller names it: ``max_file_bytes`` in Python, ``--max-file-mb`` on the command line."""
    return flag("max_file_bytes", "--max-file-mb")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def read_file(path: str | Path, doc_id: str | None = None, *, max_bytes: int = MAX_FILE_BYTES) -> Document:
    """The document one file makes (module docstring), its id ``doc_id`` (default: the file's name); a
    :class:`FileSkip` saying why when it makes none."""
    path = Path(path)
    doc_id = doc_id or path.name
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise FileSkip(f"unknown kind of file ({path.suffix or 'no extension'}): read are "
                       f"{', '.join(sorted(set(FORMATS)))}")
    try:
        st = path.stat()
    except OSError as exc:
        raise FileSkip(f"unreadable: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileSkip("not a regular file")
    if st.st_size > max_bytes:
        raise FileSkip(f"over the size limit ({_size(st.st_size)} > {_size(max_bytes)}): raise {_size_option()} to "
                       "read it")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise FileSkip(f"unreadable: {exc.strerror or exc}") from None
    extra: dict = {}
    if fmt == "pdf":
        if not raw.startswith(b"%PDF"):
            raise FileSkip("corrupt PDF: the file does not start with %PDF")
        title, text, extra = _pdf(path)
    elif fmt == "docx":
        title, text = _docx(path)
    elif fmt == "html":
        if b"\x00" in raw[:8192]:
            raise FileSkip("binary file (NUL bytes): not HTML")
        title, text = _html(raw)
    else:
        text = _decode(raw)
        title = _markdown_title(text) if fmt == "markdown" else ""
    if not text.strip():
        raise FileSkip("no text" + (" (a scanned PDF without a text layer? OCR it first)" if fmt == "pdf" else ""))
    metadata = {"source": doc_id, "format": fmt, "size": st.st_size, "mtime": round(st.st_mtime, 3),
                "sha256": hashlib.sha256(raw).hexdigest(), **extra}
    return Document(doc_id, title or path.name, text, metadata)


# ---------------------------------------------------------------------------------------------------- walking
def _walk(root: Path, exclude: set[Path]):
    """``(path, relative id, reason or None)`` for every file under ``root`` (symbolic links followed once; a
    link loop or a broken link reported), hidden names and ``exclude``'d folders left out."""
    seen: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        here = Path(folder)
        st = here.stat()
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            yield here, here.relative_to(root).as_posix(), "symbolic link loop: a folder already read"
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (here / d).resolve() not in exclude)
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = here / name
            rel = path.relative_to(root).as_posix()
            yield path, rel, "broken symbolic link" if path.is_symlink() and not path.exists() else None


def _sources(source: str | Path, exclude: set[Path]):
    """``(root, [(path, id, reason or None)])`` for a folder, a file or a glob."""
    path = Path(source)
    if path.is_dir():
        return path, list(_walk(path, exclude))
    if path.exists() or path.is_symlink():
        return path.parent, [(path, path.name, None if path.exists() else "broken symbolic link")]
    text = str(source)
    if not _MAGIC.search(text):
        raise DataError(text, "no such file or folder", hint="give a folder, a file (.txt .md .html .pdf .docx) or a "
                        "glob such as 'docs/**/*.md'")
    parts = Path(text).parts
    fixed = next((i for i, p in enumerate(parts) if _MAGIC.search(p)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    found = sorted(Path(p) for p in glob.glob(text, recursive=True))
    return root, [(p, p.relative_to(root).as_posix(), None) for p in found
                  if not p.is_dir() and not any(part.startswith(".") for part in p.relative_to(root).parts)]


def load_files(source: str | Path, *, max_bytes: int = MAX_FILE_BYTES, exclude=(), show_progress: bool = False
               ) -> FileCorpus:
    """Read ``source`` (a folder, read recursively; one file; or a glob, ``**`` for any depth) into documents, one
    per file (module docstring). ``exclude``: folders to leave out (an index written inside the folder).
    Raises a :class:`~twotower.DataError` when ``source`` names nothing, or when no file in it could be read (with
    the reasons)."""
    from twotower.checks import check_number
    from twotower.progress import progress_bar

    check_number(max_bytes, "max_file_bytes", integer=True, minimum=1)
    excluded = {Path(e).resolve() for e in exclude}
    root, found = _sources(source, excluded)
    documents, skipped = [], []
    for path, rel, reason in progress_bar(found, desc="reading files", unit="file", disable=not show_progress):
        if reason is None:
            try:
                documents.append(read_file(path, rel, max_bytes=max_bytes))
                continue
            except FileSkip as exc:
                reason = str(exc)
            except (RecursionError, MemoryError, UnicodeError, ValueError) as exc:  # a parser's limits on odd input
                reason = f"unreadable: {type(exc).__name__}: {str(exc)[:120]}"
        skipped.append(Skipped(rel, reason))
        log.info("skipped %s: %s", rel, reason)
    if not documents:
        shown = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:5]) + (" …" if len(skipped) > 5 else "")
        raise DataError(str(source), "no file in it could be read as a document" + (f" ({shown})" if shown else
                        " (it holds no files)"), hint="give files of a kind read here: .txt .md .html .pdf .docx")
    return FileCorpus(sorted(documents, key=lambda d: d.id), sorted(skipped, key=lambda s: s.path), root)


__all__ = ["FORMATS", "FileCorpus", "FileSkip", "MAX_FILE_BYTES", "Skipped", "is_file_source", "load_files",
           "page_breaks", "page_of", "read_file"]
