"""Long documents split into passages on the encoder's own token boundaries, so that dense retrieval sees all of a
document, not only its first window.

A document whose title and text fit in the document tower's window (its ``doc_max_length``, special tokens and the
model's document prompt counted) stays one passage, encoded exactly as before (its ``full_text``). A longer one is cut
into passages of at most ``window`` tokens of the encoder (title and prompt included: every passage is encoded behind
the document's title, so it keeps its context), each overlapping the one before by ``overlap`` tokens (an eighth of
the window by default). The passages of a document are of even length: a document of 1.2 windows makes two passages of
~0.6 window each, not a full one and a short remnant that would score on little text. A passage prefers to end at a
sentence end (``.``, ``!``, ``?`` …) near that length, so that passages read as whole sentences. Each passage is a
span ``(start, end)`` of character offsets into the document's ``text``: ``text[start:end]`` is the passage, exactly,
whatever the text's unicode or whitespace.

The index keeps a vector per passage and scores a document by its best passage (MaxP: Dai & Callan 2019);
:mod:`twotower.retrieval.passages` groups passages back into documents.

Example::

    from twotower.encoders.passages import PassageSpec, split_documents

    split = split_documents(tokenizer, ["Title"], ["A long text. " * 200], PassageSpec(window=64, overlap=8))
    print(split.offsets, split.spans[:2], split.texts[0][:40])
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from twotower.checks import check_number, flag
from twotower.errors import DataError, TwoTowerError

log = logging.getLogger(__name__)

OVERLAP_SHARE = 8  # by default two neighbouring passages share 1/8 of the window (32 tokens of MiniLM's 256)
MAX_PASSAGES = 1_000  # per document (≈ 200k tokens at MiniLM's 256): more is refused unless max_passages is raised
MIN_WINDOW = 16  # tokens: a smaller window leaves no room for text behind the title
SCORES = ("max", "first")  # a document scores as its best passage (MaxP) or as its first (FirstP)
_SENTENCE_END = re.compile(r"[.!?;。！？…]['\")\]]*$")


@dataclass(frozen=True)
class PassageSpec:
    """How documents are split: ``window`` tokens at most per passage (None: the encoder's document length),
    ``overlap`` tokens shared by neighbours (None: an eighth of the window), at most ``max_passages`` passages per
    document; ``score``: how a document scores, ``"max"`` (its best passage, MaxP) or ``"first"`` (its first passage,
    FirstP: close to the ranking of truncation, which ``passages=False`` gives exactly; hits still carry their best
    passages)."""

    window: int | None = None
    overlap: int | None = None
    max_passages: int = MAX_PASSAGES
    score: str = "max"

    def resolved(self, doc_max_length: int) -> "PassageSpec":
        """This spec checked against an encoder whose document tower reads ``doc_max_length`` tokens, with the
        window filled in. Out-of-range numbers are refused here, before any encoding."""
        window = doc_max_length if self.window is None else check_number(
            self.window, "passage_window", integer=True, minimum=MIN_WINDOW, maximum=doc_max_length,
            hint=f"the encoder reads at most {doc_max_length} tokens of a document")
        overlap = window // OVERLAP_SHARE if self.overlap is None else check_number(
            self.overlap, "passage_overlap", integer=True, minimum=0)
        if overlap >= window // 2:
            raise TwoTowerError(f"{flag('passage_overlap')} {overlap} must be less than half of the passage window "
                                f"({window} tokens), so that each passage moves on by more than it repeats")
        limit = check_number(self.max_passages, "max_passages", integer=True, minimum=1)
        if self.score not in SCORES:
            raise TwoTowerError(f"{flag('passage_score')} is one of {', '.join(SCORES)}, not {self.score!r}")
        return PassageSpec(window=int(window), overlap=int(overlap), max_passages=int(limit), score=self.score)

    def manifest(self) -> dict:
        return asdict(self)

    @classmethod
    def from_manifest(cls, entry: dict | None) -> "PassageSpec | None":
        return None if not entry else cls(**{k: entry[k] for k in ("window", "overlap", "max_passages", "score")
                                                    if k in entry})


@dataclass
class Split:
    """Documents as passages: passage ``p`` is ``texts[p]`` (what the encoder reads: title and passage) and covers
    ``text[spans[p, 0]:spans[p, 1]]`` of its document; document ``i`` owns passages ``offsets[i]:offsets[i+1]``."""

    texts: list[str]
    offsets: np.ndarray
    spans: np.ndarray

    @property
    def num_passages(self) -> int:
        return len(self.texts)


class _Tokens:
    """Token counts and character offsets from the encoder's tokenizer, without special tokens or truncation."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.specials = int(tokenizer.num_special_tokens_to_add(pair=False)) if hasattr(
            tokenizer, "num_special_tokens_to_add") else 2
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.fast = None
        if backend is not None:
            from tokenizers import Tokenizer

            self.fast = Tokenizer.from_str(backend.to_str())
            self.fast.no_truncation()
            self.fast.no_padding()

    def counts(self, texts: list[str]) -> list[int]:
        if self.fast is not None:
            return [len(e.ids) for e in self.fast.encode_batch(texts, add_special_tokens=False)]
        return [len(self.tokenizer.tokenize(t)) for t in texts]

    def offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as ``(start, end)`` character offsets (empty tokens dropped)."""
        if self.fast is not None:
            out = []
            for enc in self.fast.encode_batch(texts, add_special_tokens=False):
                out.append(_merge_pieces([(int(a), int(b)) for a, b in enc.offsets if b > a]))
            return out
        return [self._slow_offsets(t) for t in texts]

    def _slow_offsets(self, text: str) -> list[tuple[int, int]]:
        """A tokenizer without offsets: each word (a run of non-space characters) gives as many token slots as it
        has tokens, all spanning the word (a passage then ends between words)."""
        out: list[tuple[int, int]] = []
        for m in re.finditer(r"\S+", text):
            out.extend([(m.start(), m.end())] * max(1, len(self.tokenizer.tokenize(m.group()))))
        return out


def _merge_pieces(offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token offsets where a token starting inside the one before (byte-level pieces of one character) is merged, so
    that no span ever cuts a character in two."""
    out: list[tuple[int, int]] = []
    for a, b in offsets:
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _passage_ends(tokens: list[tuple[int, int]], text: str, budget: int, overlap: int) -> list[tuple[int, int]]:
    """``(first, last + 1)`` token ranges of the passages of one text: ``budget`` tokens at most each, each starting
    ``overlap`` tokens before the one before it ended, and of even lengths: each passage aims at the length that
    shares what is left of the text evenly among the fewest passages that cover it, so that no passage is a short
    remnant of the text's end. A passage ends at the sentence end nearest its aim when one lies within a quarter of
    the aim below it or an eighth above it (never past ``budget``), otherwise at the last word boundary before it."""
    n = len(tokens)
    # a passage starts and ends only between words (where whitespace separates two tokens), never inside one
    word_start = [i == 0 or tokens[i][0] > tokens[i - 1][1] for i in range(n)] + [True]
    ranges = []
    start = 0
    while start < n:
        rest = n - start
        if rest <= budget:
            ranges.append((start, n))
            break
        fewest = max(2, -(-(rest - overlap) // max(1, budget - overlap)))  # passages that cover the rest
        aim = start + min(budget, -(-(rest + (fewest - 1) * overlap) // fewest))
        lo = max(start + 1, aim - (aim - start) // 4)
        hi = min(start + budget, aim + (aim - start) // 8, n - 1)
        sentences = [i + 1 for i in range(lo - 1, hi) if word_start[i + 1]
                     and _SENTENCE_END.search(text[tokens[i][0]:tokens[i][1]])]
        if sentences:
            end = min(sentences, key=lambda e: (abs(e - aim), e))
        else:
            end = next((i for i in range(aim, start + (aim - start) // 2, -1) if word_start[i]), aim)
        ranges.append((start, end))
        nxt = max(end - overlap, start + 1)  # back to a word's first token: at least the overlap, if one is there
        start = next((i for i in range(nxt, start, -1) if word_start[i]), None) or \
            next((i for i in range(nxt, end) if word_start[i]), end)
    return ranges


def split_documents(tokenizer, titles: Sequence[str], texts: Sequence[str], spec: PassageSpec, *,
                    prompt: str = "", ids: Sequence[str] | None = None) -> Split:
    """``texts`` (with their ``titles``) as passages for an encoder with ``tokenizer`` (see the module's docstring).
    ``spec`` must be resolved (:meth:`PassageSpec.resolved`); ``prompt``: the document prefix the encoder puts in
    front of every text (it takes room in the window); ``ids`` name documents in errors."""
    if spec.window is None:
        raise ValueError("resolve the PassageSpec against the encoder first")
    tok = _Tokens(tokenizer)
    full = [f"{t} {x}".strip() if t else x for t, x in zip(titles, texts)]
    room = spec.window - tok.specials
    fits = [c <= room for c in tok.counts([prompt + f for f in full])]
    long_rows = [i for i, ok in enumerate(fits) if not ok]
    head_tokens = dict(zip(long_rows, tok.counts([prompt + (titles[i] + " " if titles[i] else "") for i in long_rows])))
    token_offsets = dict(zip(long_rows, tok.offsets([texts[i] for i in long_rows])))
    out_texts: list[str] = []
    spans: list[tuple[int, int]] = []
    counts = np.zeros(len(full), dtype=np.int64)
    for i, text in enumerate(texts):
        if fits[i] or not token_offsets.get(i):
            out_texts.append(full[i])
            spans.append((0, len(text)))
            counts[i] = 1
            continue
        budget = max(room - head_tokens[i] - 2, room // 2)  # 2: the join may tokenize a little differently  # a title longer than half the window is cut by the encoder
        ranges = _passage_ends(token_offsets[i], text, budget, spec.overlap)
        if len(ranges) > spec.max_passages:
            name = f"document {ids[i]!r}" if ids is not None else f"document {i}"
            raise DataError(name, f"makes {len(ranges)} passages of {spec.window} tokens, more than "
                            f"{flag('max_passages')} {spec.max_passages}: raise {flag('max_passages')} to index it "
                            f"whole, or split the document before indexing", field="text")
        offs = token_offsets[i]
        for first, stop in ranges:
            a, b = offs[first][0], offs[stop - 1][1]
            spans.append((a, b))
            out_texts.append(f"{titles[i]} {text[a:b]}" if titles[i] else text[a:b])
        counts[i] = len(ranges)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    split = Split(out_texts, offsets, np.asarray(spans, dtype=np.int64).reshape(-1, 2))
    if len(long_rows):
        log.info("%d of %d documents are longer than the %d-token window: %d passages in all", len(long_rows),
                 len(full), spec.window, split.num_passages)
    return split


def default_split(model, docs: Sequence, ids: Sequence[str] | None = None) -> Split:
    """``docs`` (objects with ``title`` and ``text``: :class:`twotower.data.beir.Document`) split as an index with
    the default options splits them for ``model`` (a :class:`twotower.encoders.towers.DualEncoder`): its document
    window, the default overlap, its document prompt counted. ``twotower eval`` and ``fit`` score documents on it."""
    return split_documents(model.doc_tower.tokenizer, [d.title for d in docs], [d.text for d in docs],
                           PassageSpec().resolved(model.doc_max_length), prompt=model.prompts.get("document", ""),
                           ids=ids)
