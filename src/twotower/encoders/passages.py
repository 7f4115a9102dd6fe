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
whatever the text's unicode or whitespace. A document with page starts (a PDF's ``page_starts`` metadata:
:func:`twotower.data.files.page_breaks`) is split page by page: no passage crosses a page, so a passage's page is the
page of all its text (a page of a few words is a passage of its own).

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
from dataclasses import asdict, dataclass, field

import numpy as np
import regex

from twotower.checks import check_number, flag
from twotower.errors import DataError, TwoTowerError

log = logging.getLogger(__name__)

OVERLAP_SHARE = 8  # by default two neighbouring passages share 1/8 of the window (32 tokens of MiniLM's 256)
MAX_PASSAGES = 1_000  # per document (≈ 200k tokens at MiniLM's 256): more is refused unless max_passages is raised
MIN_WINDOW = 16  # tokens: a smaller window leaves no room for text behind the title
SCORES = ("max", "first")  # a document scores as its best passage (MaxP) or as its first (FirstP)
MARGIN = 2  # tokens kept free in every passage: the join of title and text may tokenize a little differently
TITLE_SHARE = 2  # a title (with the prompt) takes at most 1/TITLE_SHARE of the room in the window
RESERVED = 2 + MARGIN  # what resolved() counts off the window before any tokenizer is known: two special tokens
_SENTENCE_END = re.compile(r"[.!?;。！？…]['\")\]]*$")
_GRAPHEME = regex.compile(r"\X")
_SPACE = regex.compile(r"\s")
# a place between two characters that no grapheme rule joins (both Latin letters, CJK, digits or punctuation, none a
# mark): where a text without whitespace may be cut into pieces for the tokenizer
_PLAIN_PAIR = regex.compile(r"(?<=[\p{Latin}\p{Han}\p{Hiragana}\p{Katakana}\p{N}\p{P}])"
                            r"(?=[\p{Latin}\p{Han}\p{Hiragana}\p{Katakana}\p{N}\p{P}])(?!\p{M})")
_PIECE_CHARS = 1 << 16  # a text longer than this is tokenized in pieces when it may be refused (max_passages)
_LOOK = 4096  # characters searched for a place to cut a piece
_CHARS_PER_TOKEN = 4  # the first piece of a huge text: this many characters for each token it may hold, about


@dataclass(frozen=True)
class PassageSpec:
    """How documents are split: ``window`` tokens at most per passage (None: the encoder's document length),
    ``overlap`` tokens shared by neighbours (None: an eighth of the window), at most ``max_passages`` passages per
    document; ``score``: how a document scores, ``"max"`` (its best passage, MaxP) or ``"first"`` (its first passage,
    FirstP: close to the ranking of truncation, which ``passages=False`` gives exactly; hits still carry their best
    passages). ``stored`` (set by :meth:`from_manifest`, never written): the spec of an existing index, whose overlap
    was checked when it was built."""

    window: int | None = None
    overlap: int | None = None
    max_passages: int = MAX_PASSAGES
    score: str = "max"
    stored: bool = field(default=False, repr=False, compare=False)

    def resolved(self, doc_max_length: int) -> "PassageSpec":
        """This spec checked against an encoder whose document tower reads ``doc_max_length`` tokens, with the
        window filled in. Out-of-range numbers are refused here, before any encoding: an overlap given explicitly
        must be less than half of the room the window leaves for text without a title (the window less
        :data:`RESERVED` tokens: two special tokens and the margin), so that a passage moves on by more than it
        repeats; the default (an eighth of the window) is cut where a document's title leaves less room
        (:func:`split_documents`)."""
        window = doc_max_length if self.window is None else check_number(
            self.window, "passage_window", integer=True, minimum=MIN_WINDOW, maximum=doc_max_length,
            hint=f"the encoder reads at most {doc_max_length} tokens of a document")
        overlap = window // OVERLAP_SHARE if self.overlap is None else check_number(
            self.overlap, "passage_overlap", integer=True, minimum=0)
        if overlap >= window // 2:
            raise TwoTowerError(f"{flag('passage_overlap')} {overlap} must be less than half of the passage window "
                                f"({window} tokens), so that each passage moves on by more than it repeats")
        room = window - RESERVED
        if self.overlap is not None and not self.stored and overlap >= room / 2:
            raise TwoTowerError(f"{flag('passage_overlap')} {overlap} must be less than half of the {room} tokens a "
                                f"passage of the {window}-token window has for text (less two special tokens and a "
                                f"margin of {MARGIN}; a title takes more), so that each passage moves on by more "
                                f"than it repeats: give at most {max(0, (room - 1) // 2)}, or a larger "
                                f"{flag('passage_window')}")
        limit = check_number(self.max_passages, "max_passages", integer=True, minimum=1)
        if self.score not in SCORES:
            raise TwoTowerError(f"{flag('passage_score')} is one of {', '.join(SCORES)}, not {self.score!r}")
        return PassageSpec(window=int(window), overlap=int(overlap), max_passages=int(limit), score=self.score,
                           stored=self.stored)

    def manifest(self) -> dict:
        entry = asdict(self)
        entry.pop("stored")
        return entry

    @classmethod
    def from_manifest(cls, entry: dict | None) -> "PassageSpec | None":
        return None if not entry else cls(**{k: entry[k] for k in ("window", "overlap", "max_passages", "score")
                                                    if k in entry}, stored=True)


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

    def count(self, text: str, more_than: int) -> int:
        """The tokens of ``text``, or, for a long text, of a first piece of it when that already holds more than
        ``more_than`` (then a number above ``more_than``, not the text's count)."""
        if len(text) > _PIECE_CHARS:
            cut = _cut(text, _PIECE_CHARS)
            head = self.counts([text[:cut]])[0]
            if head > more_than + MARGIN:  # MARGIN: a piece cut inside a word may hold a token more
                return head
        return self.counts([text])[0]

    def raw_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as ``(start, end)`` character offsets, as the tokenizer gives them (empty ones
        dropped)."""
        if self.fast is not None:
            return [[(int(a), int(b)) for a, b in enc.offsets if b > a]
                    for enc in self.fast.encode_batch(texts, add_special_tokens=False)]
        return [self._slow_offsets(t) for t in texts]

    def offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as ``(start, end)`` character offsets, widened to whole grapheme clusters and merged
        where they share one (:func:`_whole_graphemes`)."""
        return [_whole_graphemes(t, o) for t, o in zip(texts, self.raw_offsets(texts))]

    def offsets_until(self, text: str, most: int) -> tuple[list[tuple[int, int]], bool]:
        """``(offsets, whole)``: the tokens of ``text`` (as :meth:`offsets`), read in growing pieces cut before a
        whitespace (where the tokenizer splits anyway), and only as far as needed to see more than ``most``
        tokens; ``whole`` is False when the reading stopped there (then ``offsets`` holds the tokens read)."""
        if len(text) <= max(most, _PIECE_CHARS):  # short, or it cannot hold more than ``most`` tokens: at once
            return self.offsets([text])[0], True
        out: list[tuple[int, int]] = []
        start, size, cuts = 0, max(_CHARS_PER_TOKEN * most, _PIECE_CHARS), 0
        while start < len(text):
            stop = len(text) if len(text) - start <= size + size // 2 else _cut(text, start + size)
            piece = text[start:stop]
            out.extend((a + start, b + start) for a, b in self.offsets([piece])[0])
            start, size = stop, size * 2
            if start < len(text):
                cuts += 1
                if len(out) > most + MARGIN * cuts:  # MARGIN a cut: a cut inside a word may add a token
                    return out, False
        return _whole_graphemes(text, out), True  # again over the whole: a cut is a boundary, but be exact

    def _slow_offsets(self, text: str) -> list[tuple[int, int]]:
        """A tokenizer without offsets: each word (a run of non-space characters) gives as many token slots as it
        has tokens, all spanning the word (a passage then ends between words)."""
        out: list[tuple[int, int]] = []
        for m in re.finditer(r"\S+", text):
            out.extend([(m.start(), m.end())] * max(1, len(self.tokenizer.tokenize(m.group()))))
        return out


def _cut(text: str, at: int) -> int:
    """A place at or after ``at`` (and before ``len(text)``, or at it) to cut ``text`` into pieces for the
    tokenizer: before a whitespace character; else between two characters no grapheme rule joins; else after the
    second grapheme cluster from ``at``."""
    if at >= len(text):
        return len(text)
    m = _SPACE.search(text, at, at + _LOOK) or _PLAIN_PAIR.search(text, max(at, 1), at + _LOOK)
    if m:
        return max(m.start(), 1)
    pos = at
    for _ in range(2):
        if pos < len(text):
            pos = _GRAPHEME.match(text, pos).end()
    return pos


def _plain_boundary(text: str, pos: int) -> bool:
    """Whether ``pos`` is plainly between two grapheme clusters: at an end of ``text``, or between two characters
    below U+0300 (no combining mark, joiner, prepended, Hangul or regional-indicator character lies there) other
    than CR LF."""
    if pos <= 0 or pos >= len(text):
        return True
    before, after = text[pos - 1], text[pos]
    return before < "\u0300" and after < "\u0300" and not (before == "\r" and after == "\n")


def _whole_graphemes(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token offsets widened so that each starts and ends between grapheme clusters (``regex``'s ``\\X``: a letter
    with its combining marks, an emoji ZWJ sequence, a Hangul syllable of jamo, an Indic conjunct), and merged where
    they then overlap (byte-level pieces of one character, a letter and a mark the tokenizer read apart): no span
    ever cuts a character or a cluster in two."""
    out: list[tuple[int, int]] = []
    boundary = 0  # a grapheme boundary at or before the next token's start
    for a, b in offsets:
        if out and a < out[-1][1]:  # starts inside the token before: one token
            a, b = out[-1][0], max(b, out.pop()[1])
        elif a > boundary and not _plain_boundary(text, a):  # the cluster that holds a, walked from the boundary
            pos = boundary
            while True:
                nxt = _GRAPHEME.match(text, pos).end()
                if nxt > a:
                    break
                pos = nxt
            a = pos
        if not _plain_boundary(text, b):
            pos = a
            while pos < b:
                pos = _GRAPHEME.match(text, pos).end()
            b = pos
        out.append((a, b))
        boundary = b
    return out


def _passage_ends(tokens: list[tuple[int, int]], text: str, budget: int, overlap: int,
                  breaks: Sequence[int] = ()) -> list[tuple[int, int]]:
    """``(first, last + 1)`` token ranges of the passages of one text: ``budget`` tokens at most each, each starting
    ``overlap`` tokens before the one before it ended, and of even lengths: each passage aims at the length that
    shares what is left of the text evenly among the fewest passages that cover it, so that no passage is a short
    remnant of the text's end. A passage ends at the sentence end nearest its aim when one lies within a quarter of
    the aim below it or an eighth above it (never past ``budget``), otherwise at the last word boundary before it.
    ``breaks``: token indices where a passage must start (a page's first token): each part between two is split
    alone, no passage crossing one."""
    if breaks:
        bounds = [0, *breaks, len(tokens)]
        return [(a + lo, b + lo) for lo, hi in zip(bounds, bounds[1:]) if hi > lo
                for a, b in _passage_ends(tokens[lo:hi], text, budget, overlap)]
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
                    prompt: str = "", ids: Sequence[str] | None = None,
                    breaks: Sequence[Sequence[int]] | None = None) -> Split:
    """``texts`` (with their ``titles``) as passages for an encoder with ``tokenizer`` (see the module's docstring).
    ``spec`` must be resolved (:meth:`PassageSpec.resolved`); ``prompt``: the document prefix the encoder puts in
    front of every text (it takes room in the window); ``ids`` name documents in errors; ``breaks``: per document,
    the ascending character offsets inside its text where a passage must start (its pages': no passage crosses
    one; empty: none)."""
    return _Splitter(_Tokens(tokenizer), spec, prompt, ids).split(titles, texts, breaks)


def _token_breaks(offs: list[tuple[int, int]], breaks: Sequence[int]) -> list[int]:
    """The token indices where the character offsets ``breaks`` start a part: the first token at or after each
    (none at the text's first or past its last token)."""
    from bisect import bisect_left

    starts = [a for a, _ in offs]
    return sorted({i for i in (bisect_left(starts, c) for c in breaks) if 0 < i < len(offs)})


class _Splitter:
    """:func:`split_documents`'s work for one call: the tokenizer (``tok``), the resolved ``spec``, the ``prompt``,
    the documents' ``ids``, and what was cut (titles, overlaps), logged once at the end."""

    def __init__(self, tok: _Tokens, spec: PassageSpec, prompt: str, ids: Sequence[str] | None) -> None:
        if spec.window is None:
            raise ValueError("resolve the PassageSpec against the encoder first")
        self.tok, self.spec, self.prompt, self.ids = tok, spec, prompt, ids
        self.room = spec.window - tok.specials
        self.head_most = self.room // TITLE_SHARE  # the prompt and the title together, in a passage
        self.prompt_tokens = tok.counts([prompt])[0] if prompt else 0
        self.cut_titles = self.cut_overlaps = 0
        self.least_overlap = spec.overlap

    def split(self, titles: Sequence[str], texts: Sequence[str], breaks: Sequence[Sequence[int]] | None = None) -> Split:
        tok, spec, prompt, room = self.tok, self.spec, self.prompt, self.room
        full = [f"{t} {x}".strip() if t else x for t, x in zip(titles, texts)]
        # a document of several pages is split page by page, whatever its length
        paged = {i: list(b) for i, b in enumerate(breaks or ()) if b and any(0 < c < len(texts[i]) for c in b)}
        # whether a document fits the window whole: the short ones counted together, a long one by a first piece
        short = [i for i, f in enumerate(full) if len(prompt) + len(f) <= _PIECE_CHARS and i not in paged]
        fits = dict(zip(short, (c <= room for c in tok.counts([prompt + full[i] for i in short]))))
        fits.update({i: i not in paged and tok.count(prompt + full[i], room) <= room
                     for i in range(len(full)) if i not in fits})
        long_rows = [i for i in range(len(full)) if not fits[i]]
        heads = {i: self._head(titles[i]) for i in long_rows}
        budgets = {i: max(1, room - heads[i][1] - MARGIN) for i in long_rows}
        # the texts too short to make more than max_passages passages are tokenized together, the others alone
        at_once = [i for i in long_rows if len(texts[i]) <= spec.max_passages * budgets[i]]
        token_offsets = dict(zip(at_once, tok.offsets([texts[i] for i in at_once])))
        out_texts: list[str] = []
        spans: list[tuple[int, int]] = []
        counts = np.zeros(len(full), dtype=np.int64)
        for i, text in enumerate(texts):
            offs: list[tuple[int, int]] = []
            if not fits[i]:
                offs = token_offsets.pop(i, None)
                if offs is None:  # a huge text: read only as far as max_passages passages can hold
                    offs, whole = tok.offsets_until(text, spec.max_passages * budgets[i])
                    if not whole:
                        raise self._too_many(i, f"more than {spec.max_passages:,}", f" (its first "
                                             f"{offs[-1][1]:,} characters hold {len(offs):,} tokens)")
            if not offs:
                out_texts.append(full[i])
                spans.append((0, len(text)))
                counts[i] = 1
                continue
            budget = budgets[i]
            ranges = _passage_ends(offs, text, budget, self._overlap(budget),
                                   _token_breaks(offs, paged[i]) if i in paged else ())
            if len(ranges) > spec.max_passages:
                raise self._too_many(i, f"{len(ranges):,}")
            title = heads[i][0]
            for first, stop in ranges:
                a, b = offs[first][0], offs[stop - 1][1]
                spans.append((a, b))
                out_texts.append(f"{title} {text[a:b]}" if title else text[a:b])
            counts[i] = len(ranges)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        split = Split(out_texts, offsets, np.asarray(spans, dtype=np.int64).reshape(-1, 2))
        self._log(len(long_rows), len(full), split.num_passages)
        return split

    def _head(self, title: str) -> tuple[str, int]:
        """``(title as the passages carry it, tokens of prompt and title)``: a title whose tokens (with the prompt's
        and the join's) are more than half the room is cut to the tokens that fit there, so that text always has
        room and no passage is longer than the window."""
        head = self.prompt + (title + " " if title else "")
        n = self.tok.count(head, self.head_most)
        if n <= self.head_most:
            return title, n
        offs, _ = self.tok.offsets_until(title, max(self.head_most, 0))
        keep = min(self.head_most - self.prompt_tokens - 1, len(offs))  # 1: the join
        while keep > 0:
            cut = title[:offs[keep - 1][1]]
            n = self.tok.counts([f"{self.prompt}{cut} "])[0]
            if n <= self.head_most:
                break
            keep -= 1
        else:
            cut, n = "", self.prompt_tokens
        self.cut_titles += 1
        return cut, n

    def _overlap(self, budget: int) -> int:
        """The overlap for a document whose passages have ``budget`` tokens for text: the spec's, cut to less than
        half of the budget (each passage moves on by more than it repeats)."""
        most = max(0, (budget - 1) // 2)
        if self.spec.overlap <= most:
            return self.spec.overlap
        self.cut_overlaps += 1
        self.least_overlap = min(self.least_overlap, most)
        return most

    def _too_many(self, i: int, how_many: str, why: str = "") -> DataError:
        name = f"document {self.ids[i]!r}" if self.ids is not None else f"document {i}"
        return DataError(name, f"makes {how_many} passages of {self.spec.window} tokens{why}, more than "
                         f"{flag('max_passages')} {self.spec.max_passages}: raise {flag('max_passages')} to index it "
                         f"whole, or split the document before indexing", field="text")

    def _log(self, long_docs: int, docs: int, passages: int) -> None:
        if long_docs:
            log.info("%d of %d documents are longer than the %d-token window: %d passages in all", long_docs, docs,
                     self.spec.window, passages)
        if self.cut_titles:
            log.warning("%d document title(s) take more than half of the %d-token passage window: their passages "
                        "carry only the title's first tokens, so that the text has room", self.cut_titles,
                        self.spec.window)
        if self.cut_overlaps:
            log.warning("%d document(s) have less room for text behind their title than twice %s %d: their "
                        "passages overlap by less (down to %d tokens), so that each moves on by more than it "
                        "repeats", self.cut_overlaps, flag("passage_overlap"), self.spec.overlap, self.least_overlap)


def default_split(model, docs: Sequence, ids: Sequence[str] | None = None) -> Split:
    """``docs`` (objects with ``title`` and ``text``: :class:`twotower.data.beir.Document`) split as an index with
    the default options splits them for ``model`` (a :class:`twotower.encoders.towers.DualEncoder`): its document
    window, the default overlap, its document prompt counted. ``twotower eval`` and ``fit`` score documents on it."""
    return split_documents(model.doc_tower.tokenizer, [d.title for d in docs], [d.text for d in docs],
                           PassageSpec().resolved(model.doc_max_length), prompt=model.prompts.get("document", ""),
                           ids=ids)
