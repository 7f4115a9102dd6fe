"""The tokenizer-free splitter for embeddings of your own (encoders/text_passages.py): spans cover the text, stay
within the window, overlap by at most the overlap, share the text evenly, end at sentences where they can and never
inside a grapheme."""

from __future__ import annotations

import random

import pytest

import twotower as tt
from twotower.encoders.text_passages import text_spans

WORDS = "alpha beta gamma delta. epsilon zeta! eta theta iota? kappa lambda mu nu xi omicron".split()


def _texts():
    rng = random.Random(0)
    for _ in range(200):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 900)))
        if rng.random() < 0.3:
            text = text.replace("a", "a\u0301")  # a combining acute after every a
        yield text, rng.choice([100, 500, 2000])


def test_spans_cover_the_text_within_the_window_evenly():
    for text, window in _texts():
        overlap = window // 8
        spans = text_spans(text, window, overlap)
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        for (a, b), (c, d) in zip(spans, spans[1:]):
            assert a < c <= b and b - c <= overlap + 1  # each moves on; the shared part at most the overlap
        lengths = [b - a for a, b in spans]
        assert max(lengths) <= window
        if len(spans) > 2:
            assert min(lengths[:-1]) >= 0.5 * max(lengths)
        for _, b in spans:
            assert b == len(text) or text[b] != "\u0301"  # no end between a letter and its mark


def test_passages_end_at_sentence_ends_where_there_are_some():
    text = " ".join(f"Sentence number {i} says something about topic {i % 7}." for i in range(200))
    spans = text_spans(text, 400, 50)
    ends = [text[:b].rstrip()[-1] for _, b in spans[:-1]]
    assert sum(e == "." for e in ends) >= 0.9 * len(ends)


def test_a_short_text_is_one_passage_and_bad_sizes_are_refused():
    assert text_spans("short", 100, 10) == [(0, 5)]
    with pytest.raises(tt.TwoTowerError, match="passage_overlap"):
        text_spans("x" * 500, 100, 60)
    with pytest.raises(tt.TwoTowerError, match="passage_window"):
        text_spans("x" * 500, 4, 0)
