"""The query's terms marked in a hit's title and in a window of its text, for the search page (``"highlight": true``
in a search request).

A word is marked when it gives one of the query's terms as the index's BM25 part analyses text (its language,
stopwords and stemmer, :mod:`twotower.retrieval.analyzers`): "purrs" in a query marks "purring" and "Purr" in English,
and a stopword marks nothing. An index without BM25 is analysed as English. The result is plain text cut into
segments ``{"text", "match"}`` whose texts, joined, give the title, or the window of the text, unchanged: no markup
is produced, so nothing needs escaping, and a client builds its display from text nodes alone.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from dataclasses import dataclass

import regex

from twotower.retrieval.analyzers import (
    _GRAPHEME, _RUNS, AUTO, BY_SCRIPT, EN_PATTERN, WORD, ScriptStemmer, analyzer_for, normalize,
)

WINDOW_CHARS = 280  # the text shown for a hit: about three lines of the page
LEAD_CHARS = 120  # the start of the text shown in place of a missing title: about one line
CONTEXT_CHARS = 60  # at most this much text before the window's first match
SCAN_CHARS = 50_000  # the part of a long text searched for matches (the window comes from it)
MEMORY = 200_000  # words whose terms a highlighter remembers

_EN_WORD = re.compile(EN_PATTERN)
_SPACE = regex.compile(r"\s")


@dataclass(frozen=True)
class Highlighted:
    """A title's or text window's segments ``[(text, is_match), ...]``; ``cut_before`` / ``cut_after``: text left
    out before / after the window (a client shows an ellipsis)."""

    segments: list[tuple[str, bool]]
    cut_before: bool = False
    cut_after: bool = False


@functools.lru_cache(maxsize=8)
def _highlighter(bm25: str) -> "Highlighter":
    return Highlighter(json.loads(bm25))


def highlighter_for(bm25: dict | None) -> "Highlighter":
    """The (shared) :class:`Highlighter` of an index manifest's ``"bm25"`` entry: its memory of the terms words give
    serves every request."""
    return _highlighter(json.dumps(bm25, sort_keys=True))


class Highlighter:
    """Marks the terms of queries in texts, analysed as an index's BM25 part analyses them; safe to share between
    threads (the Snowball stemmer, which is not, runs under a lock)."""

    def __init__(self, bm25: dict | None = None) -> None:
        """``bm25``: the index manifest's ``"bm25"`` entry (its :class:`~twotower.retrieval.bm25.BM25Params`), or
        None for an index without BM25 (English)."""
        from twotower.retrieval.bm25 import BM25Params

        params = BM25Params.from_dict(bm25) if bm25 else BM25Params()
        language = "en" if params.language == AUTO else params.language  # auto is resolved when indexing
        self.analyzer = analyzer_for(language, stopwords=params.stopwords, stemmer=params.stemmer)
        if self.analyzer.stemmer == BY_SCRIPT:
            self._stem = ScriptStemmer()
        elif self.analyzer.stemmer:
            import Stemmer

            self._stem = Stemmer.Stemmer(self.analyzer.stemmer).stemWord
        else:
            self._stem = str
        self._stopwords = frozenset(self.analyzer.stopwords)
        self._terms: dict[str, str | None] = {}  # word -> term, up to MEMORY words
        self._lock = threading.Lock()

    # ---- words and their terms ---------------------------------------------------------

    def _term(self, word: str) -> str | None:
        """The term BM25 makes of one word (None for a stopword)."""
        term = self._terms.get(word)
        if term is None and word not in self._terms:
            folded = word.lower() if self.analyzer.split == "en" else normalize(word)
            if folded not in self._stopwords:
                with self._lock:
                    term = self._stem(folded)
            if len(self._terms) < MEMORY:
                self._terms[word] = term
        return term

    def _units(self, text: str):
        """``(start, end, term)`` for each unit of ``text`` that BM25 makes a term of: words; characters of Chinese,
        Japanese and Korean; grapheme pairs of Thai-like scripts."""
        split = self.analyzer.split
        if split == "en":
            for m in _EN_WORD.finditer(text):
                yield m.start(), m.end(), self._term(m.group())
            return
        if split == "words":
            for m in WORD.finditer(text):
                yield m.start(), m.end(), self._term(m.group())
            return
        for m in _RUNS.finditer(text):
            if m["word"]:
                yield m.start(), m.end(), self._term(m["word"])
            elif m["cjk"]:
                for i in range(m.start(), m.end()):
                    yield i, i + 1, normalize(text[i])
            else:
                at, graphemes = m.start(), _GRAPHEME.findall(m["sea"])
                bounds = [at]
                for g in graphemes:
                    bounds.append(bounds[-1] + len(g))
                if len(graphemes) == 1:
                    yield bounds[0], bounds[1], normalize(graphemes[0])
                for i in range(len(graphemes) - 1):
                    yield bounds[i], bounds[i + 2], normalize(graphemes[i] + graphemes[i + 1])

    def terms(self, query: str) -> frozenset[str]:
        """The query's terms."""
        return frozenset(term for _, _, term in self._units(query) if term)

    def matches(self, text: str, terms: frozenset[str]) -> list[tuple[int, int, str]]:
        """``(start, end, term)`` of the units of ``text`` that give one of ``terms``, in order; overlapping and
        touching ones (characters of a CJK word, grapheme pairs) merged into one."""
        split = self.analyzer.split
        if split in ("en", "words"):  # the words that match, then their places, in C-speed passes
            words = _EN_WORD if split == "en" else WORD
            found = [w for w in set(words.findall(text)) if self._term(w) in terms]
            if not found:
                return []
            alternatives = "|".join(map(re.escape, sorted(found, key=len, reverse=True)))
            if split == "en":  # a \b-delimited run of \w is a whole word of EN_PATTERN's, as WORD's below
                where = re.compile(rf"\b(?:{alternatives})\b")
            else:
                where = regex.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")
            return [(m.start(), m.end(), self._term(m.group())) for m in where.finditer(text)]
        spans: list[tuple[int, int, str]] = []
        for start, end, term in self._units(text):
            if term in terms:
                if spans and start <= spans[-1][1]:
                    spans[-1] = (spans[-1][0], max(end, spans[-1][1]), spans[-1][2])
                else:
                    spans.append((start, end, term))
        return spans

    # ---- titles and text windows -------------------------------------------------------

    def title(self, title: str, terms: frozenset[str]) -> Highlighted:
        """The whole title, its matches marked."""
        return Highlighted(segments(title, self.matches(title, terms), 0, len(title)))

    def window(self, text: str, terms: frozenset[str], width: int = WINDOW_CHARS) -> Highlighted:
        """About ``width`` characters of ``text`` around its densest run of matches (the most distinct terms, then
        the most matches; the first such), cut at spaces, its matches marked; the text's start when nothing
        matches (only its first :data:`SCAN_CHARS` characters are searched)."""
        spans = self.matches(text[:SCAN_CHARS], terms)
        start, end = choose_window(text, spans, width)
        return Highlighted(segments(text, spans, start, end), cut_before=start > 0, cut_after=end < len(text))


    def lead(self, text: str, terms: frozenset[str], width: int = LEAD_CHARS) -> Highlighted:
        """The start of ``text`` (about ``width`` characters, cut at a space), its matches marked: what stands for the
        title of a document that has none (a plain-string document)."""
        end = _cut_end(text, width)
        return Highlighted(segments(text, self.matches(text[:end], terms), 0, end), cut_before=False,
                           cut_after=end < len(text))


def choose_window(text: str, spans: list[tuple[int, int, str]], width: int) -> tuple[int, int]:
    """``(start, end)`` of the window :meth:`Highlighter.window` shows."""
    if len(text) <= width:
        return 0, len(text)
    best, best_score = 0, (-1, -1)
    j = 0
    for i, (first, _, _) in enumerate(spans):
        j = max(j, i)
        while j + 1 < len(spans) and spans[j + 1][1] <= first + width - CONTEXT_CHARS:
            j += 1
        inside = spans[i:j + 1]
        score = (len({t for _, _, t in inside}), len(inside))
        if score > best_score:
            best, best_score = i, score
    if not spans:
        return 0, _cut_end(text, width)
    first, last = spans[best][0], max(end for _, end, _ in spans[best:best + best_score[1]])
    slack = max(0, width - (last - first))
    start = max(0, first - min(CONTEXT_CHARS, slack // 2))
    start = min(start, max(0, len(text) - width))
    if start > 0:  # begin at a word: after the first space in the window's first stretch, if the match allows
        space = _SPACE.search(text, start, min(first, start + 40))
        if space:
            start = space.end()
    return start, min(len(text), _cut_end(text, start + width, floor=last))


def _cut_end(text: str, end: int, floor: int = 0) -> int:
    """``end`` moved back to the last space before it (not before ``floor``, nor more than 40 characters)."""
    if end >= len(text):
        return len(text)
    for i in range(end, max(floor, end - 40), -1):
        if text[i].isspace():
            return i
    return end


def segments(text: str, spans: list[tuple[int, int, str]], start: int, end: int) -> list[tuple[str, bool]]:
    """``text[start:end]`` cut into ``(text, is_match)`` pieces by the ``spans`` (matches) inside it."""
    out: list[tuple[str, bool]] = []
    at = start
    for s, e, _ in spans:
        if e <= start or s >= end:
            continue
        s, e = max(s, start), min(e, end)
        if s > at:
            out.append((text[at:s], False))
        out.append((text[s:e], True))
        at = e
    if at < end:
        out.append((text[at:end], False))
    return out
