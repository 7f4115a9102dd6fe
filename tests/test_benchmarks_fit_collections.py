"""benchmarks/fit_collections.py: a cross-lingual XQuAD-R set is split by question, so that no test query is a
translation of a query fit trained on (each question is asked in 11 languages, with the same answer)."""

from __future__ import annotations

import pytest

from conftest import benchmark_module

LANGS = ("ar", "de", "en", "zh")


@pytest.fixture(scope="module")
def fit_collections():
    return benchmark_module("fit_collections")


def _judged(questions: int) -> dict:
    return {f"{lang}-q{n:03d}": {f"en-{n}-0": 1} for n in range(questions) for lang in LANGS}


def test_cross_lingual_split_keeps_translations_apart(fit_collections):
    judged = _judged(50)
    train, test = fit_collections.draw_questions(judged, 12, seed=13)
    train_questions = {q.split("-", 1)[1] for q in train}
    assert len(train) == 12 and len(train_questions) == 12  # one language per training question
    assert not train_questions & {q.split("-", 1)[1] for q in test}
    assert len(test) == (50 - 12) * len(LANGS)  # every language of every other question
    assert all(test[q] == judged[q] and q in judged for q in test)
    assert len({q.split("-", 1)[0] for q in train}) > 1  # languages drawn, not always the first


def test_cross_lingual_split_default_and_seed(fit_collections):
    judged = _judged(10)
    train, test = fit_collections.draw_questions(judged, None, seed=1)
    assert len(train) == 6 and len(test) == 4 * len(LANGS)  # 60% of the questions
    assert fit_collections.draw_questions(judged, None, seed=1) == (train, test)
    assert fit_collections.draw_questions(judged, None, seed=2)[0] != train
