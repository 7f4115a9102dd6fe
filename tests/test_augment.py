"""Views from raw text: cropping, inverse cloze, deletion, replacement, chunking, corpus reading."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twotower.data.augment import (
    Chunk,
    ViewConfig,
    Vocab,
    chunk_document,
    delete_tokens,
    iter_documents,
    load_chunks,
    make_views,
    random_crop,
    replace_tokens,
    split_sentences,
)
from twotower.errors import DataError


def _crop_reference(L: int, lo: float, hi: float) -> tuple[dict[int, float], float]:
    """Exact distribution of a span length int(L·r), r ~ U[lo, hi], and the exact probability
    that two independent spans (uniform starts) share at least one token."""
    lengths = {}
    for k in range(L + 1):
        a, b = max(lo, k / L), min(hi, (k + 1) / L)
        if b > a:
            lengths[max(1, k)] = lengths.get(max(1, k), 0.0) + (b - a) / (hi - lo)
    overlap = 0.0
    for l1, p1 in lengths.items():
        for l2, p2 in lengths.items():
            s1 = np.arange(L - l1 + 1)[:, None]
            s2 = np.arange(L - l2 + 1)[None, :]
            overlap += p1 * p2 * ((s1 < s2 + l2) & (s2 < s1 + l1)).mean()
    return lengths, overlap


def test_crop_lengths_and_overlap_match_the_exact_distribution():
    L, n = 40, 20000
    chunk = Chunk(np.arange(L), (0,))
    cfg = ViewConfig(delete=0.0)
    rng = np.random.default_rng(0)
    lens, overlaps = [], 0
    for _ in range(n):
        a, b = make_views(chunk, cfg, rng)
        for v in (a, b):  # a contiguous span of the chunk
            assert np.array_equal(v, np.arange(v[0], v[0] + len(v)))
            lens.append(len(v))
        overlaps += bool(set(a.tolist()) & set(b.tolist()))
    expected, p_overlap = _crop_reference(L, 0.05, 0.5)
    assert min(lens) == min(expected) == 2 and max(lens) == max(expected) == 19  # int(40·r), r < 0.5
    counts = np.bincount(lens, minlength=L + 1)
    for k, p in expected.items():  # every length within 5 standard deviations of its exact frequency
        sd = np.sqrt(2 * n * p * (1 - p))
        assert abs(counts[k] - 2 * n * p) < 5 * sd, (k, counts[k], 2 * n * p)
    sd = np.sqrt(p_overlap * (1 - p_overlap) / n)
    assert 0.2 < p_overlap < 0.9 and abs(overlaps / n - p_overlap) < 5 * sd


def test_crop_ratio_bounds_are_configurable():
    chunk = Chunk(np.arange(200), (0,))
    rng = np.random.default_rng(1)
    lens = [len(random_crop(chunk.ids, rng, 0.2, 0.3)) for _ in range(2000)]
    assert min(lens) >= 40 and max(lens) <= 60 and abs(np.mean(lens) - 49.5) < 1.0


def _ict_chunk(rng, n_sent=6):
    sizes = rng.integers(3, 12, size=n_sent)
    starts = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    return Chunk(np.arange(int(sizes.sum())), starts)


@pytest.mark.parametrize("keep", [0.1, 0.3])
def test_ict_keeps_the_sentence_with_probability_keep(keep):
    rng = np.random.default_rng(2)
    cfg = ViewConfig(augment="ict", ict_keep=keep, delete=0.0)
    n, kept = 6000, 0
    picked = []
    for _ in range(n):
        chunk = _ict_chunk(rng)
        q, k = make_views(chunk, cfg, rng)
        bounds = (*chunk.starts, len(chunk.ids))
        i = chunk.starts.index(int(q[0]))
        assert np.array_equal(q, chunk.ids[bounds[i] : bounds[i + 1]])  # the query is exactly one sentence
        picked.append(i)
        if len(k) == len(chunk.ids):
            assert np.array_equal(k, chunk.ids)
            kept += 1
        else:  # the key is the rest of the chunk, in order
            assert np.array_equal(k, np.setdiff1d(chunk.ids, q)) and not set(q.tolist()) & set(k.tolist())
    sd = np.sqrt(keep * (1 - keep) / n)
    assert abs(kept / n - keep) < 4 * sd
    assert np.bincount(picked, minlength=6).min() > n / 6 * 0.85  # sentences chosen uniformly


def test_ict_single_sentence_falls_back_to_cropping():
    chunk = Chunk(np.arange(50), (0,))
    q, k = make_views(chunk, ViewConfig(augment="ict", delete=0.0), np.random.default_rng(0))
    assert 2 <= len(q) <= 25 and 2 <= len(k) <= 25


def test_deletion_rate_and_order():
    ids = np.arange(100_000)
    out = delete_tokens(ids, np.random.default_rng(3), 0.1)
    assert abs(1 - len(out) / len(ids) - 0.1) < 0.005
    assert np.all(np.diff(out) > 0)  # a subsequence: order kept
    assert len(delete_tokens(np.arange(3), np.random.default_rng(0), 1.0)) == 1  # never empty


def test_replacement_rate_and_vocabulary():
    vocab = Vocab(size=50, special_ids=frozenset({0, 1, 2, 49}), mask_id=3)
    ids = np.full(50_000, 10)
    out = replace_tokens(ids, np.random.default_rng(4), vocab, 0.2)
    changed = out != 10
    assert abs(changed.mean() - 0.2 * 45 / 46) < 0.01  # 1 in 46 replacements draws the same id
    assert set(np.unique(out).tolist()) == set(range(3, 49))  # every non-special id, no special one
    masked = replace_tokens(ids, np.random.default_rng(5), vocab, 0.0, mask=0.15)
    assert abs((masked == 3).mean() - 0.15) < 0.01 and set(np.unique(masked).tolist()) == {3, 10}


def test_views_are_deterministic_under_a_seed():
    rng = np.random.default_rng(9)
    chunks = [_ict_chunk(rng) for _ in range(20)]
    vocab = Vocab(size=1000, special_ids=frozenset({0}))
    for augment in ("crop", "ict"):
        cfg = ViewConfig(augment=augment, delete=0.1, replace=0.1)

        def run(seed):
            g = np.random.default_rng(seed)
            return [v.tolist() for c in chunks for v in make_views(c, cfg, g, vocab)]

        assert run(5) == run(5) and run(5) != run(6)


def test_chunking_and_sentence_offsets():
    sentences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    chunks = chunk_document(sentences, chunk_tokens=4, min_tokens=2, doc_id="d")
    assert [c.ids.tolist() for c in chunks] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert [c.starts for c in chunks] == [(0, 3), (0, 1), (0, 1)] and chunks[0].doc_id == "d"
    chunks = chunk_document(sentences, chunk_tokens=4, min_tokens=3)
    assert [c.ids.tolist() for c in chunks] == [[1, 2, 3, 4], [5, 6, 7, 8]]  # the 2-token tail is dropped
    assert chunk_document([[1, 2], [], [3, 4]], chunk_tokens=8, min_tokens=1)[0].starts == (0, 2)  # empty sentence
    assert split_sentences("One. Two!  Three?\nFour\n\nfive e.g") == ["One.", "Two!", "Three?", "Four", "five e.g"]


def test_corpus_formats_and_errors(tmp_path, tiny_bert_dir):
    from transformers import AutoTokenizer

    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text(json.dumps({"_id": "a", "title": "Cats", "text": "Cats purr. Dogs bark."}) + "\n")
    assert list(iter_documents(beir)) == [("a", "Cats Cats purr. Dogs bark.")]
    txt = tmp_path / "plain.txt"
    txt.write_text("First doc line one.\nline two.\n\n\nSecond doc.\n")
    assert list(iter_documents(txt)) == [("plain.txt:1", "First doc line one.\nline two."), ("plain.txt:5", "Second doc.")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl, line 2, field 'text': missing text"):
        list(iter_documents(bad))
    with pytest.raises(DataError, match="corpus not found"):
        list(iter_documents(tmp_path / "nope"))
    tok = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    (tmp_path / "long.txt").write_text(" ".join(f"Sentence number {i} is here." for i in range(60)))
    chunks = load_chunks(tmp_path / "long.txt", tok, ViewConfig(chunk_tokens=32), show_progress=False)
    assert all(len(c.ids) <= 32 for c in chunks) and len(chunks) >= 8 and all(len(c.starts) >= 4 for c in chunks[:-1])
    text = tok.decode(np.concatenate([c.ids for c in chunks]).tolist())
    assert text.startswith("sentence number 0 is here. sentence number 1")
    with pytest.raises(DataError, match="no chunk of at least"):
        load_chunks(txt, tok, ViewConfig(chunk_tokens=64, min_tokens=64), show_progress=False)
