"""Passage geometry (issue #71, item 4) and the best passage of a ``bm25`` search (item 12): the overlap checked
against the room a passage has for text (not the window), a title cut to half the window so that text always has
room and passages stay within the window, passage ends between grapheme clusters, a huge document refused before it
is tokenized whole; and query words matched after case folding when a passage is chosen without a query vector."""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np
import pytest
import regex

import twotower as tt
from twotower.encoders import passages as passages_module
from twotower.encoders.passages import PassageSpec, _Tokens, split_documents
from twotower.errors import DataError, TwoTowerError

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "sigma", "omega", "tea", "cat", "purr", "bone", "heart", "gene", "cell", "virus"]
TITLE = "A fairly long title about zebrafish heart regeneration"


@pytest.fixture(scope="module")
def tokenizer(tiny_bert_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert_dir)


def _abstracts(n: int = 10, sentences: int = 30) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(" ".join(rng.choice(WORDS, size=8)).capitalize() + "." for _ in range(sentences))
            for _ in range(n)]


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])  # special tokens included, as the encoder reads it


# ---------------------------------------------------------------------------------------------- the overlap


@pytest.mark.parametrize("window, overlap", [(32, 15), (32, 14), (64, 31), (16, 6)])
def test_an_explicit_overlap_is_checked_against_the_room_for_text_not_the_window(window, overlap):
    """Less than half the window, but not less than half of what the window leaves for text: refused, naming the
    option and the room."""
    room = window - 4
    with pytest.raises(TwoTowerError, match=rf"passage_overlap {overlap} .*{room} tokens"):
        PassageSpec(window=window, overlap=overlap).resolved(128)
    assert PassageSpec(window=window, overlap=(room - 1) // 2).resolved(128).overlap == (room - 1) // 2


def test_the_spec_of_an_existing_index_is_not_refused_and_not_written_as_stored():
    stored = PassageSpec.from_manifest({"window": 32, "overlap": 15, "max_passages": 1000, "score": "max"})
    spec = stored.resolved(128)
    assert spec.overlap == 15 and "stored" not in spec.manifest()
    assert spec == PassageSpec(window=32, overlap=15, max_passages=1000)  # stored does not count in equality


@pytest.mark.parametrize("overlap", [None, 13, "stored 15"])
def test_a_title_does_not_make_passages_crawl(tokenizer, overlap, caplog):
    """Window 32 with a title: passages used to move on by 1-2 tokens (1,071 passages for ten abstracts against 281
    without a title at overlap 15). Each passage now moves on by at least half of its room for text."""
    if overlap == "stored 15":
        spec = PassageSpec.from_manifest({"window": 32, "overlap": 15}).resolved(128)
    else:
        spec = PassageSpec(window=32, overlap=overlap).resolved(128)
    texts = _abstracts()
    plain = split_documents(tokenizer, [""] * 10, texts, spec)
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.passages"):
        titled = split_documents(tokenizer, [TITLE] * 10, texts, spec)
    head = len(tokenizer(TITLE + " ", add_special_tokens=False)["input_ids"])
    budget = 32 - 2 - head - 2  # what a passage has for text behind the title
    assert titled.num_passages <= 1.5 * plain.num_passages * (32 - 4) / budget
    for d in range(10):  # in tokens, a passage starts about half a budget or more after the one before
        spans = titled.spans[titled.offsets[d]:titled.offsets[d + 1]]
        moved = [len(tokenizer(texts[d][a0:a1], add_special_tokens=False)["input_ids"])
                 for (a0, _), (a1, _) in itertools.pairwise(spans)]
        assert np.median(moved) >= budget // 2 - 1 and min(moved) >= 2, (d, moved, budget)
        total = len(tokenizer(texts[d], add_special_tokens=False)["input_ids"])
        assert len(spans) <= total / (budget // 2) + 3, (d, len(spans), total, budget)
    if spec.overlap > (budget - 1) // 2:  # cut, and said so
        assert "passage_overlap" in caplog.text and "overlap by less" in caplog.text


# ---------------------------------------------------------------------------------------------- the title


@pytest.mark.parametrize("window", [None, 32])
@pytest.mark.parametrize("prompt", ["", "passage: "])
def test_a_title_longer_than_the_window_is_cut_so_that_text_has_room(tokenizer, window, prompt, caplog):
    """A title as long as the encoder's whole document length left every passage encoded as the title alone, and
    passages longer than the window. The title now takes at most half of the window's room, in the passages only."""
    spec = PassageSpec(window=window).resolved(128)
    title = " ".join(f"title{i}" for i in range(300))
    texts = _abstracts(3, 12) + ["a short text about zebrafish"]
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.passages"):
        split = split_documents(tokenizer, [title] * 4, texts, spec, prompt=prompt)
    assert "title" in caplog.text and "first tokens" in caplog.text
    for p, (a, b) in enumerate(split.spans):
        d = int(np.searchsorted(split.offsets, p, side="right")) - 1
        piece = texts[d][a:b]
        assert split.texts[p].endswith(" " + piece) and split.texts[p].startswith("title0 title1")
        n = _tokens(tokenizer, prompt + split.texts[p])
        assert n <= spec.window, (p, n)  # within the window: the encoder reads the text, not the title alone
        title_part = _tokens(tokenizer, prompt + split.texts[p][: -len(piece) - 1]) - 2
        assert title_part <= (spec.window - 2) // 2
    covered = {d: np.zeros(len(t), dtype=bool) for d, t in enumerate(texts)}
    for d in range(4):
        for a, b in split.spans[split.offsets[d]:split.offsets[d + 1]]:
            covered[d][a:b] = True
        assert covered[d][[i for i, c in enumerate(texts[d]) if not c.isspace()]].all()  # every word in a passage
    assert split.offsets[4] - split.offsets[3] == 1  # the short text: one passage, behind the cut title


def test_a_title_longer_than_the_window_is_searched_by_its_text(tmp_path, tiny_bert_dir):
    """Through the index: a document whose title is longer than the encoder's document length is found by its
    text's passage (before: every passage encoded as the title alone, so all passages had one vector)."""
    title = " ".join(f"title{i}" for i in range(300))
    text = " ".join(_abstracts(1, 20))
    index = tt.Index.build(tmp_path / "ix", [{"_id": "d", "title": title, "text": text},
                                             {"_id": "e", "title": "", "text": "other words"}],
                           encoder=str(tiny_bert_dir), precision="fp32", show_progress=False)
    store = index.store
    vectors = store.float_vectors(np.arange(int(store.offsets[0]), int(store.offsets[1])))
    assert len(vectors) > 1 and not np.allclose(vectors[0], vectors[1], atol=1e-4)


# ---------------------------------------------------------------------------------------------- graphemes


def _boundaries(text: str) -> set[int]:
    return {0} | {m.end() for m in regex.finditer(r"\X", text)}


GRAPHEME_TEXTS = {
    "combining marks": " ".join(["re\u0301sume\u0301 cafe\u0301 nai\u0308ve"] * 80),
    "stacked marks": " ".join(["a\u0301\u0323\u0308b o\u0302\u0303"] * 100),
    "emoji ZWJ and flags": " ".join(["👩\u200d💻 👨\u200d👩\u200d👧 ❤\ufe0f 🇩🇪🇫🇷 👍🏽 tea"] * 60),
    "Hangul jamo": " ".join(["\u1112\u1161\u11ab\u1100\u1173\u11af \u1100\u1161"] * 120),
    "Devanagari": " ".join(["क्षत्रिय हिन्दी"] * 120),
    # words of more tokens than a passage holds (under the tokenizer's 100 characters a word), cut inside
    "long words": " ".join(["cafe\u0301" * 24, "\u1112\u1161\u11ab" * 30, "क्षत्रियहिन्दी" * 6,
                            "a\u0301b\u0302" * 30] * 6),
}


@pytest.mark.parametrize("name", list(GRAPHEME_TEXTS))
def test_passages_start_and_end_between_grapheme_clusters(tokenizer, name):
    """A passage ended between a letter and its combining mark (16 of 32 ends in the issue's example); none now
    starts or ends inside a grapheme cluster: marks, emoji ZWJ sequences and flags, Hangul jamo, Indic conjuncts."""
    text = GRAPHEME_TEXTS[name]
    split = split_documents(tokenizer, [""], [text], PassageSpec(window=32, overlap=4).resolved(128))
    assert split.num_passages > 3
    bounds = _boundaries(text)
    bad = [(a, b) for a, b in split.spans.tolist() if a not in bounds or b not in bounds]
    assert not bad, (name, bad[:3], [text[b - 1:b + 2] for _, b in bad[:3]])
    for a, b in split.spans.tolist():
        assert text[a:b] == text[a:b].strip()
    tokens = _Tokens(tokenizer).offsets([text])[0]
    assert all(a in bounds and b in bounds for a, b in tokens)


# ---------------------------------------------------------------------------------------------- huge documents


def _counting(monkeypatch) -> list[int]:
    """The characters the splitter gives the tokenizer, call by call."""
    seen: list[int] = []
    counts, offsets = _Tokens.counts, _Tokens.offsets

    def counted_counts(self, texts):
        seen.extend(len(t) for t in texts)
        return counts(self, texts)

    def counted_offsets(self, texts):
        seen.extend(len(t) for t in texts)
        return offsets(self, texts)

    monkeypatch.setattr(_Tokens, "counts", counted_counts)
    monkeypatch.setattr(_Tokens, "offsets", counted_offsets)
    return seen


HUGE = {
    "words": "word " * 2_000_000,  # 10 MB
    "CJK without spaces": "末尾の文字列" * 400_000,  # cut into pieces between two characters, not before a space
    "accented words": "re\u0301sume\u0301 " * 1_000_000,
}


@pytest.mark.parametrize("name", list(HUGE))
def test_a_huge_document_is_refused_before_it_is_tokenized_whole(tokenizer, monkeypatch, name):
    """A 10 MB document was refused by max_passages only after it was tokenized whole, twice (58.7 s, 2.7 GB): the
    splitter now reads it in pieces, and stops as soon as more tokens than max_passages passages can hold are read."""
    text = HUGE[name]
    small = "word " * 2000
    seen = _counting(monkeypatch)
    spec = PassageSpec(window=32).resolved(128)
    t0 = time.perf_counter()
    split_documents(tokenizer, [""], [small], spec)
    baseline = time.perf_counter() - t0
    seen.clear()
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=r"'huge'.*more than 1,000 passages.*max_passages"):
        split_documents(tokenizer, [""], [text], spec, ids=["huge"])
    took = time.perf_counter() - t0
    assert sum(seen) < len(text) / 10, (sum(seen), len(text))  # the tokenizer never saw the whole text
    assert took < 60 * baseline + 2.0, (took, baseline)


def test_a_huge_title_is_not_tokenized_whole(tokenizer, monkeypatch):
    title = "title " * 1_000_000
    seen = _counting(monkeypatch)
    split = split_documents(tokenizer, [title], ["a short text"], PassageSpec(window=32).resolved(128))
    assert sum(seen) < len(title) / 10
    assert split.num_passages == 1 and split.texts[0].endswith(" a short text")
    assert _tokens(tokenizer, split.texts[0]) <= 32


@pytest.mark.parametrize("name", ["words", "combining marks", "long words"])
def test_a_long_document_read_in_pieces_splits_as_read_whole(tokenizer, monkeypatch, name):
    """A document within max_passages but long enough to be read in pieces makes exactly the passages it makes
    read whole (the pieces are cut before a whitespace character, where every tokenizer splits)."""
    text = {"words": " ".join(_abstracts(4, 40)), "combining marks": GRAPHEME_TEXTS["combining marks"],
            "long words": GRAPHEME_TEXTS["long words"]}[name]
    whole = split_documents(tokenizer, ["T"], [text], PassageSpec(window=32, max_passages=10_000).resolved(128))
    seen = _counting(monkeypatch)
    monkeypatch.setattr(passages_module, "_PIECE_CHARS", 300)
    monkeypatch.setattr(passages_module, "_LOOK", 200)  # a space is found: words are never cut
    monkeypatch.setattr(passages_module, "_CHARS_PER_TOKEN", 0)  # pieces of _PIECE_CHARS, doubling
    limit = whole.num_passages  # just enough: more characters than that many passages' tokens, so read in pieces
    assert len(text) > limit * 32
    pieces = split_documents(tokenizer, ["T"], [text], PassageSpec(window=32, max_passages=limit).resolved(128))
    assert max(seen) < len(text) and len(seen) > 3  # read in pieces
    assert pieces.spans.tolist() == whole.spans.tolist() and pieces.texts == whole.texts
    with pytest.raises(DataError, match="max_passages"):  # and one passage fewer is refused, as read whole
        split_documents(tokenizer, ["T"], [text], PassageSpec(window=32, max_passages=limit - 1).resolved(128))


# ---------------------------------------------------------------------------------------------- bm25 best passage


@pytest.mark.parametrize("query, words", [("zebrafish heart", "ZEBRAFISH Heart"),
                                          ("Zebrafish HEART", "zebrafish heart")])
def test_bm25_best_passage_matches_query_words_whatever_their_case(tmp_path, tiny_bert_dir, query, words):
    """In bm25 mode (no query vector) the best passage is the one the query's BM25 over the document's passages
    ranks first, whatever the words' case; its score is that BM25 score (a Lucene BM25 written out in conftest)."""
    from conftest import lucene_bm25

    from twotower.retrieval.analyzers import analyzer_for

    text = "Alpha beta gamma. " * 30 + f"The {words} sentence here. " + "Delta epsilon. " * 30
    index = tt.Index.build(tmp_path / "ix", [{"_id": "a", "title": "", "text": text},
                                             {"_id": "b", "title": "", "text": "other words"}],
                           encoder=str(tiny_bert_dir), precision="fp32", show_progress=False, passage_window=32,
                           bm25=True)
    assert index.info()["num_passages"] > 3
    hit = index.search(query, k=1, mode="bm25", passages=2)[0]
    assert hit.id == "a"
    best = hit.passage
    assert words in best.text and hit.text[best.start:best.end] == best.text
    store = index.store
    spans = store.spans[store.offsets[0] : store.offsets[1]]
    terms = analyzer_for(store.manifest["bm25"]["language"]).analyze([text[a:b] for a, b in spans] + [query])
    want = lucene_bm25(terms[-1], terms[:-1])
    assert best.score == pytest.approx(max(want), rel=1e-5)
    assert best.start == int(spans[want.index(max(want)), 0])


@pytest.mark.parametrize("query, words", [
    ("straße", "STRASSE"),  # case folding, not lower()
    ("café", "CAFE\u0301"),  # one character in the query, a letter and a combining mark in the text
    ("tea", "ＴＥＡ"),  # full-width letters (NFKC)
    ("file", "ﬁle"),  # a ligature (NFKC)
    ("ΟΔΟΣ", "οδος"),
    ("Heart heart", "HEART"),
])
def test_best_passage_by_query_words_folds_case_as_the_analyzers_do(query, words):
    """The passage choice without a query vector matches words after NFKC and case folding (the BM25 analyzers'
    first steps), on every index (a store with spans: local or not)."""
    from types import SimpleNamespace

    from twotower.retrieval.passages import best_passages

    parts = ["alpha beta gamma", f"the {words} here", "delta epsilon", f"{words} and {words}"]
    text, spans = "", []
    for p in parts:
        spans.append((len(text), len(text) + len(p)))
        text += p + " "
    store = SimpleNamespace(spans=np.asarray(spans, dtype=np.int64), offsets=np.array([0, len(parts)]))
    [ranked] = best_passages(store, [0], [text], query_texts=[query], n=4)
    assert [p.text for p in ranked[:2]] == [parts[3], parts[1]]  # two occurrences, then one
    assert ranked[0].score > ranked[1].score > 0 and ranked[2].score == ranked[3].score == 0.0
