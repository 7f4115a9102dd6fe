"""Passages without a tokenizer: how a long document is split for an embedding of your own
(:mod:`twotower.encoders.external`), whose tokenizer twotower cannot see. The same rule as the token splitter
(:mod:`twotower.encoders.passages`), counted in characters: a text longer than ``max_chars`` becomes the fewest
passages that cover it with ``overlap`` characters shared between neighbours, each aiming at an even share of the
text and ending at the sentence end nearest that aim (within a quarter below or an eighth above it, never past
``max_chars``), else at the last space before it, else at a grapheme boundary; the next passage starts at a word
boundary ``overlap`` characters back. Offsets are exact: ``text[start:end]`` is the passage. A document with page
starts (a PDF's) is split page by page, as the token splitter does: no passage crosses a page.

Example::

    from twotower.encoders.text_passages import text_spans

    spans = text_spans(long_text, max_chars=2000, overlap=200)
    passages = [long_text[a:b] for a, b in spans]
"""

from __future__ import annotations

import math
import re
import unicodedata

from twotower.errors import TwoTowerError

DEFAULT_MAX_CHARS = 2000  # ≈ 400–500 tokens of English: within any embedding API's input limit
_SENTENCE_END = re.compile(r"[.!?。！？][\"'”’)\]]*\s+")
_SPACE = re.compile(r"\s+")


def default_overlap(max_chars: int) -> int:
    return max_chars // 8


def check_sizes(max_chars, overlap) -> None:
    from twotower.checks import check_number

    check_number(max_chars, "passage_window", integer=True, minimum=16,
                 hint="with an embedding of your own it counts characters")
    check_number(overlap, "passage_overlap", integer=True, minimum=0, below=max_chars / 2,
                 hint="at most half of passage_window, so that every passage moves on")


def _grapheme_end(text: str, i: int) -> int:
    """``i`` moved back until it does not fall before a combining mark, a zero-width joiner or a variation
    selector (so no passage ends inside a grapheme)."""
    while 0 < i < len(text) and (unicodedata.combining(text[i]) or text[i] in "\u200d\ufe0f\ufe0e" or
                                 "\ufe00" <= text[i] <= "\ufe0f" or text[i - 1] == "\u200d"):
        i -= 1
    return i


def _end(text: str, start: int, aim: int, max_chars: int) -> int:
    limit = min(len(text), start + max_chars)
    target = min(start + aim, limit)
    low, high = target - aim // 4, min(limit, target + aim // 8)
    best = None
    for m in _SENTENCE_END.finditer(text, max(start + 1, low), high + 1):
        end = m.end() if m.end() <= high else m.start() + 1
        if end <= limit and (best is None or abs(end - target) < abs(best - target)):
            best = end
    if best is not None and best > start:
        return best
    spaces = [m.end() for m in _SPACE.finditer(text, start + 1, target)]
    if spaces and spaces[-1] > start + aim // 2:  # after the last space before the aim
        return spaces[-1]
    return max(start + 1, _grapheme_end(text, target))


def text_spans(text: str, max_chars: int = DEFAULT_MAX_CHARS, overlap: int | None = None) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of ``text``'s passages (module docstring); one span for a text that
    fits in ``max_chars``."""
    overlap = default_overlap(max_chars) if overlap is None else overlap
    check_sizes(max_chars, overlap)
    n = len(text)
    if n <= max_chars:
        return [(0, n)]
    spans = []
    start = 0
    while True:
        left = n - start
        if left <= max_chars:
            spans.append((start, n))
            return spans
        count = math.ceil((left - overlap) / (max_chars - overlap))
        aim = min(max_chars, math.ceil((left + (count - 1) * overlap) / count))
        end = _end(text, start, aim, max_chars)
        spans.append((start, end))
        back = max(start + 1, end - overlap)
        word = _SPACE.search(text, back, end)  # the next passage starts at a word
        nxt = word.end() if word is not None and word.end() < end else back
        start = _grapheme_end(text, nxt) if nxt > start + 1 else nxt
        if start <= spans[-1][0]:
            raise TwoTowerError("text passages: no progress (a bug); report it with the text's length")


def manifest_entry(window: int | None = None, overlap: int | None = None, max_passages: int | None = None) -> dict:
    """The index manifest's ``passages`` entry of character passages (``unit: chars``), checked."""
    from twotower.checks import check_number
    from twotower.encoders.passages import MAX_PASSAGES

    window = DEFAULT_MAX_CHARS if window is None else window
    overlap = default_overlap(window) if overlap is None else overlap
    check_sizes(window, overlap)
    limit = MAX_PASSAGES if max_passages is None else check_number(max_passages, "max_passages", integer=True,
                                                                  minimum=1)
    return {"unit": "chars", "window": int(window), "overlap": int(overlap), "max_passages": int(limit),
            "score": "max"}


def paged_spans(text: str, breaks, max_chars: int, overlap: int) -> list[tuple[int, int]]:
    """:func:`text_spans` of each part of ``text`` between two of ``breaks`` (ascending character offsets where a
    passage must start: a PDF's page starts), no passage crossing one."""
    bounds = [0, *sorted({int(c) for c in breaks or () if 0 < c < len(text)}), len(text)]
    return [(a + lo, b + lo) for lo, hi in zip(bounds, bounds[1:]) if hi > lo
            for a, b in text_spans(text[lo:hi], max_chars, overlap)]


def split_texts(ids, titles, texts, entry: dict, breaks=None):
    """``(passage texts, offsets, spans)`` of documents split by a ``unit: chars`` ``entry``: each passage's text
    behind its document's title (as the whole document was encoded: ``title text``), ``offsets`` (n + 1) the
    documents' first passage rows, ``spans`` (rows, 2) each passage's place in its document's text. A document of
    more than ``max_passages`` passages is refused, naming it. ``breaks``: per document, where a passage must start
    (:func:`paged_spans`)."""
    import numpy as np

    out, counts, spans = [], [], []
    for doc_id, title, text, cuts in zip(ids, titles, texts, breaks or [()] * len(texts)):
        mine = paged_spans(text, cuts, entry["window"], entry["overlap"])
        if len(mine) > entry["max_passages"]:
            from twotower.checks import flag

            raise TwoTowerError(f"document {doc_id!r}: {len(text):,} characters make {len(mine)} passages of "
                                f"{entry['window']} characters, over {flag('max_passages')} {entry['max_passages']}: "
                                "raise it, or split the document")
        out += [f"{title} {text[a:b]}".strip() if title else text[a:b] for a, b in mine]
        counts.append(len(mine))
        spans += mine
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return out, offsets, np.asarray(spans, dtype=np.int64).reshape(-1, 2)


__all__ = ["DEFAULT_MAX_CHARS", "check_sizes", "default_overlap", "manifest_entry", "paged_spans", "split_texts",
           "text_spans"]
