"""Positive pairs from raw text for unsupervised contrastive pre-training (Contriever).

A corpus (a BEIR ``corpus.jsonl``, other JSONL files with a ``text`` field, or plain text files
whose documents are separated by blank lines) is split into sentences, tokenized once, and cut
into *chunks* of ``chunk_tokens`` token ids (default 256; a document's last, shorter chunk is
kept when it has at least ``min_tokens``). Two *views* of a chunk form a positive pair:

- ``crop`` (independent random cropping): two spans, each of length ``int(L·r)`` with ``r``
  uniform in [``ratio_min``, ``ratio_max``] (default 5–50 %) of the chunk length ``L`` and a
  start uniform over the valid positions, drawn independently, so they may overlap;
- ``ict`` (inverse cloze task): one sentence (uniformly chosen) is the query and the rest of
  the chunk is the key; with probability ``ict_keep`` (default 0.1) the sentence stays in the
  key. A chunk with a single sentence falls back to cropping;

then, independently on each view, ``delete`` (each token dropped with probability p, default
0.1), ``replace`` (each token replaced by a uniformly drawn non-special token id) and ``mask``
(replaced by the tokenizer's mask token). Views are token-id arrays (no special tokens); every
draw comes from the ``numpy.random.Generator`` passed in, so views are a pure function of the
seed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from twotower.progress import progress_bar

from twotower.data.beir import _iter_lines, iter_json_records
from twotower.data.ids import text_problem
from twotower.errors import DataError

log = logging.getLogger(__name__)

AUGMENTS = ("crop", "ict")
CROP_OPTIONS = {"ratio_min": "--crop-min", "ratio_max": "--crop-max"}  # their flags on the command line
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")


@dataclass
class ViewConfig:
    """How two views of a chunk are made.

    Example::

        views = tt.ViewConfig(augment="crop", ratio_min=0.1, ratio_max=0.5, delete=0.1)
    """

    augment: str = "crop"
    chunk_tokens: int = 256
    min_tokens: int | None = None  # None: 10, or chunk_tokens when that is shorter
    ratio_min: float = 0.05
    ratio_max: float = 0.5
    ict_keep: float = 0.1
    delete: float = 0.1
    replace: float = 0.0
    mask: float = 0.0

    def __post_init__(self) -> None:
        if self.min_tokens is None:
            short = isinstance(self.chunk_tokens, int) and not isinstance(self.chunk_tokens, bool)
            self.min_tokens = min(10, self.chunk_tokens) if short and self.chunk_tokens >= 1 else 10

    def validate(self) -> None:
        from twotower.checks import check_number, flag, given

        check_number(self.chunk_tokens, "chunk_tokens", integer=True, minimum=2)
        check_number(self.min_tokens, "min_tokens", integer=True, minimum=1, maximum=self.chunk_tokens,
                     hint="the shortest last chunk of a document kept; at most chunk_tokens")
        for name, option in CROP_OPTIONS.items():
            if isinstance(getattr(self, name), (bool, str)) or not isinstance(getattr(self, name), (int, float)):
                check_number(getattr(self, name), name, option=option)  # names what is not a number
        if not 0 < self.ratio_min <= self.ratio_max <= 1:  # nan too
            names = ", ".join(flag(name, option) for name, option in CROP_OPTIONS.items())
            raise ValueError(f"crop ratios ({names}) must satisfy 0 < min ≤ max ≤ 1, got "
                             f"[{self.ratio_min}, {self.ratio_max}]")
        for name in ("ict_keep", "delete", "replace", "mask"):
            check_number(getattr(self, name), name, minimum=0, maximum=1, hint="a probability")
        if self.augment not in AUGMENTS:
            raise ValueError(f"unknown augment '{self.augment}': choose one of {', '.join(AUGMENTS)}")
        for name in ("ict_keep", "delete", "replace", "mask"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} is a probability: it must lie in [0, 1], got {value}")
        if self.delete + self.replace + self.mask >= 1:  # at 1 no original token is left: the two views are unrelated
            raise ValueError(f"delete + replace + mask probabilities ({self.delete} + {self.replace} + {self.mask}) must "
                             "add up to less than 1: at 1 no token of the text is kept (Contriever: "
                             f"{given('delete', 0.1)})")
        if self.chunk_tokens < 2 or not 1 <= self.min_tokens <= self.chunk_tokens:
            raise ValueError(f"need chunk_tokens ≥ 2 and 1 ≤ min_tokens ≤ chunk_tokens, got {self.chunk_tokens}, "
                             f"{self.min_tokens}")


@dataclass(frozen=True)
class Chunk:
    """``ids``: token ids without special tokens; ``starts``: offsets in ``ids`` where sentences start
    (the first is 0; a sentence cut by the chunk boundary counts as one)."""

    ids: np.ndarray
    starts: tuple[int, ...]
    doc_id: str = ""


@dataclass(frozen=True)
class Vocab:
    """What token replacement and masking need from the tokenizer."""

    size: int
    special_ids: frozenset[int] = frozenset()
    mask_id: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "Vocab":
        return cls(size=len(tokenizer), special_ids=frozenset(tokenizer.all_special_ids),
                   mask_id=tokenizer.mask_token_id)

    def random_ids(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` ids drawn uniformly from the non-special vocabulary."""
        special = np.fromiter(sorted(self.special_ids), dtype=np.int64) if self.special_ids else np.empty(0, np.int64)
        draws = rng.integers(0, self.size - len(special), size=n)
        # map [0, size - |special|) onto the ids that are not special, in order
        for s in special:
            draws = draws + (draws >= s)
        return draws


# ---------------------------------------------------------------- reading a corpus
def _doc_text(record: dict, path: Path, number: int) -> str:
    text = record.get("text")
    if not isinstance(text, str):
        raise DataError(path, "missing text" if text is None else f"text must be a string, got {type(text).__name__}",
                        line=number, field="text", hint="every record needs a string 'text'")
    title = record.get("title")
    for name, value in (("text", text), ("title", title)):
        problem = text_problem(value) if isinstance(value, str) else None
        if problem:  # before chunking, not as a tokenizer's codec error
            raise DataError(path, f"{name} {problem}", line=number, field=name)
    return f"{title} {text}".strip() if isinstance(title, str) and title else text


def _iter_file(path: Path) -> Iterator[tuple[str, str]]:
    if path.suffix == ".jsonl":
        for number, record in iter_json_records(path):
            doc_id = str(record.get("_id", f"{path.name}:{number}"))
            yield doc_id, _doc_text(record, path, number)
        return
    lines: list[str] = []
    first = 0
    for number, line in _iter_lines(path):
        if line.strip():
            if not lines:
                first = number
            lines.append(line.strip())
        elif lines:
            yield f"{path.name}:{first}", "\n".join(lines)
            lines = []
    if lines:
        yield f"{path.name}:{first}", "\n".join(lines)


def iter_documents(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield ``(doc_id, text)`` from a BEIR directory, a JSONL file, a plain text file, or a folder
    of ``*.jsonl`` / ``*.txt`` files (in name order). JSONL records need ``text``; ``title`` is
    prepended as BEIR does; plain text documents are separated by blank lines."""
    path = Path(path)
    if path.is_dir():
        files = [path / "corpus.jsonl"] if (path / "corpus.jsonl").is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".txt"))
        if not files:
            raise DataError(path, "no corpus.jsonl, *.jsonl or *.txt files in this directory",
                            hint="pass a BEIR directory, a JSONL file or a text file")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(path, "corpus not found", hint="pass a BEIR directory, a JSONL file or a text file")
    for f in files:
        yield from _iter_file(f)


def split_sentences(text: str) -> list[str]:
    """Sentences: text split after ``.``, ``!``, ``?`` followed by white space, and at line breaks."""
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text)) if s]


def chunk_document(sentence_ids: Sequence[Sequence[int]], chunk_tokens: int, min_tokens: int,
                   doc_id: str = "") -> list[Chunk]:
    """Concatenate a document's tokenized sentences and cut it into chunks of ``chunk_tokens``."""
    ids = np.fromiter((t for s in sentence_ids for t in s), dtype=np.int64)
    bounds = np.cumsum([0] + [len(s) for s in sentence_ids])[:-1]
    out = []
    for lo in range(0, len(ids), chunk_tokens):
        hi = min(lo + chunk_tokens, len(ids))
        if hi - lo < min_tokens:
            continue
        starts = tuple(sorted({0, *(int(b - lo) for b in bounds if lo < b < hi)}))
        out.append(Chunk(ids[lo:hi].copy(), starts, doc_id))
    return out


def load_chunks(path: str | Path, tokenizer, cfg: ViewConfig | None = None, *, limit_docs: int | None = None,
                show_progress: bool = True) -> list[Chunk]:
    """Read, sentence-split, tokenize (no special tokens) and chunk a corpus."""
    cfg = cfg or ViewConfig()
    cfg.validate()
    chunks: list[Chunk] = []
    docs = iter_documents(path)
    bar = progress_bar(desc="chunking corpus", unit="doc", disable=not show_progress)
    batch: list[tuple[str, list[str]]] = []

    def flush() -> None:
        flat = [s for _, sents in batch for s in sents]
        encoded = tokenizer(flat, add_special_tokens=False, truncation=False)["input_ids"] if flat else []
        pos = 0
        for doc_id, sents in batch:
            chunks.extend(chunk_document(encoded[pos : pos + len(sents)], cfg.chunk_tokens, cfg.min_tokens, doc_id))
            pos += len(sents)
        bar.update(len(batch))
        batch.clear()

    for n, (doc_id, text) in enumerate(docs):
        if limit_docs is not None and n >= limit_docs:
            break
        batch.append((doc_id, split_sentences(text)))
        if len(batch) >= 256:
            flush()
    flush()
    bar.close()
    if not chunks:
        raise DataError(path, f"no chunk of at least {cfg.min_tokens} tokens in this corpus",
                        hint=f"pre-training cuts documents into chunks and keeps those of {cfg.min_tokens} tokens or "
                        "more: check the file format (a 'text' field per line), or give longer documents")
    log.info("%s: %d chunks of ≤ %d tokens", path, len(chunks), cfg.chunk_tokens)
    return chunks


# ---------------------------------------------------------------- views
def random_crop(ids: np.ndarray, rng: np.random.Generator, ratio_min: float = 0.05,
                ratio_max: float = 0.5) -> np.ndarray:
    """A contiguous span of ``max(1, int(len·r))`` tokens, ``r ~ U[ratio_min, ratio_max]``, uniform start."""
    length = max(1, int(len(ids) * rng.uniform(ratio_min, ratio_max)))
    start = int(rng.integers(0, len(ids) - length + 1))
    return ids[start : start + length]


def inverse_cloze(chunk: Chunk, rng: np.random.Generator, keep: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(sentence, rest of the chunk); the sentence stays in the key with probability ``keep``."""
    bounds = (*chunk.starts, len(chunk.ids))
    i = int(rng.integers(0, len(chunk.starts)))
    lo, hi = bounds[i], bounds[i + 1]
    query = chunk.ids[lo:hi]
    if rng.random() < keep:
        return query, chunk.ids
    return query, np.concatenate([chunk.ids[:lo], chunk.ids[hi:]])


def delete_tokens(ids: np.ndarray, rng: np.random.Generator, p: float) -> np.ndarray:
    """Drop each token with probability ``p``; at least one token survives."""
    if p <= 0 or not len(ids):
        return ids
    keep = rng.random(len(ids)) >= p
    if not keep.any():
        keep[int(rng.integers(0, len(ids)))] = True
    return ids[keep]


def replace_tokens(ids: np.ndarray, rng: np.random.Generator, vocab: Vocab, replace: float,
                   mask: float = 0.0) -> np.ndarray:
    """Replace each token by a random non-special id with probability ``replace``, or by the mask
    token with probability ``mask``."""
    if (replace <= 0 and mask <= 0) or not len(ids):
        return ids
    u = rng.random(len(ids))
    out = ids.copy()
    swap = u < replace
    out[swap] = vocab.random_ids(rng, int(swap.sum()))
    if mask > 0:
        if vocab.mask_id is None:
            raise ValueError("mask > 0 needs a tokenizer with a mask token")
        out[(u >= replace) & (u < replace + mask)] = vocab.mask_id
    return out


def make_views(chunk: Chunk, cfg: ViewConfig, rng: np.random.Generator,
               vocab: Vocab | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A positive pair (query view, key view) of ``chunk``."""
    if cfg.augment == "ict" and len(chunk.starts) >= 2:
        a, b = inverse_cloze(chunk, rng, cfg.ict_keep)
    elif cfg.augment in AUGMENTS:
        a = random_crop(chunk.ids, rng, cfg.ratio_min, cfg.ratio_max)
        b = random_crop(chunk.ids, rng, cfg.ratio_min, cfg.ratio_max)
    else:
        raise ValueError(f"unknown augment '{cfg.augment}': choose one of {', '.join(AUGMENTS)}")
    views = []
    for v in (a, b):
        v = delete_tokens(v, rng, cfg.delete)
        if cfg.replace > 0 or cfg.mask > 0:
            if vocab is None:
                raise ValueError("token replacement and masking need a Vocab")
            v = replace_tokens(v, rng, vocab, cfg.replace, cfg.mask)
        views.append(v)
    return views[0], views[1]
