"""How a document of several passages scores (issue #52): ``passage_score="max"`` (MaxP, the default) or ``"first"``
(FirstP: a document by its first passage) on every index kind and with filters, against a numpy brute force; hits carry
their best passage either way; the choice is kept by the manifest across writes; bad values are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import twotower as tt
from twotower.cli import app
from twotower.errors import TwoTowerError

WORDS = "alpha beta gamma delta epsilon zeta theta kappa sigma omega tea cat purr bone heart gene cell virus".split()


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(5)

    def text(n):
        return " ".join(" ".join(rng.choice(WORDS, size=int(rng.integers(5, 10)))).capitalize() + "." for _ in range(n))

    out = [{"_id": f"long{i}", "title": f"Doc {i}", "text": text(25 + 4 * i), "year": 2000 + i} for i in range(6)]
    return out + [{"_id": f"short{i}", "title": "", "text": text(1), "year": 2010 + i} for i in range(6)]


def _build(tmp_path, tiny_bert_dir, docs, name, **options):
    return tt.Index.build(tmp_path / name, docs, encoder=str(tiny_bert_dir), precision="fp32", show_progress=False,
                          passage_window=32, **options)


def _reference(index, query: str, how: str, allowed=None) -> list[tuple[str, float]]:
    """Every passage vector scored with numpy; a document by its best passage ("max") or its first ("first")."""
    store = index.store
    q = store.project_queries(index._searcher.encode_queries([query]))[0]
    scores = store.float_vectors(np.arange(store.manifest["num_vectors"])) @ q
    out = []
    for row, doc_id in enumerate(store.doc_ids):
        own = scores[store.offsets[row]:store.offsets[row + 1]]
        if allowed is None or doc_id in allowed:
            out.append((doc_id, float(own.max() if how == "max" else own[0])))
    return sorted(out, key=lambda kv: (-kv[1], store.row_of[kv[0]]))


def test_first_scores_each_document_by_its_first_passage_and_hits_keep_their_best(tmp_path, tiny_bert_dir, docs):
    first = _build(tmp_path, tiny_bert_dir, docs, "first", passage_score="first")
    assert first.store.passages["score"] == "first"
    for query in ("tea cat purr", "gene virus heart", docs[2]["text"][200:320]):
        hits = first.search(query, k=6, passages=3, mode="dense")
        ref = _reference(first, query, "first")[:6]
        assert [h.id for h in hits] == [d for d, _ in ref]
        np.testing.assert_allclose([h.score for h in hits], [s for _, s in ref], rtol=1e-5, atol=1e-5)
        for h in hits:  # the passage shown is the best one, whatever ranked the document
            best = dict(_reference(first, query, "max"))[h.id]
            if h.id.startswith("short"):  # one passage: the whole text, no score of its own
                assert h.passage.score is None and h.score == pytest.approx(best, abs=1e-5)
            else:
                assert h.passage.score == pytest.approx(best, abs=1e-5) and h.passage.score >= h.score - 1e-6
            assert h.text[h.passage.start:h.passage.end] == h.passage.text


def test_a_later_passage_ranks_its_document_under_max_but_not_under_first(tmp_path, tiny_bert_dir, docs):
    best = _build(tmp_path, tiny_bert_dir, docs, "max")
    first = _build(tmp_path, tiny_bert_dir, docs, "first", passage_score="first")
    store = best.store
    row = store.row_of["long5"]
    a, b = store.spans[int(store.offsets[row]) + 4]  # a passage far beyond the first window
    query = f"Doc 5 {docs[5]['text'][a:b]}"
    assert best.search(query, k=1, mode="dense")[0].id == "long5"
    ranked = [h.id for h in first.search(query, k=12, mode="dense")]
    assert ranked == [d for d, _ in _reference(first, query, "first")]
    assert ranked[0] != "long5" or _reference(first, query, "first")[0][0] == "long5"
    assert [h.id for h in first.search(query, k=12, mode="dense")] != [h.id for h in best.search(query, k=12, mode="dense")]


@pytest.mark.parametrize("options", [
    {"kind": "hnsw"}, {"kind": "ivf", "nlist": 4}, {"vectors": "int8"}, {"vectors": "binary"},
])
def test_first_on_every_index_kind(tmp_path, tiny_bert_dir, docs, options):
    index = _build(tmp_path, tiny_bert_dir, docs, "ix", passage_score="first", **options)
    exact = _build(tmp_path, tiny_bert_dir, docs, "exact", passage_score="first")
    for query in ("tea cat purr", "omega sigma kappa"):
        hits = index.search(query, k=8, mode="dense", **({"nprobe": 4} if options.get("kind") == "ivf" else {}))
        assert len({h.id for h in hits}) == len(hits) == 8
        top = [d for d, _ in _reference(exact, query, "first")[:8]]
        assert len(set(top) & {h.id for h in hits}) >= 6


def test_first_with_a_filter_and_after_writes(tmp_path, tiny_bert_dir, docs):
    index = _build(tmp_path, tiny_bert_dir, docs, "first", passage_score="first")
    allowed = {d["_id"] for d in docs if 2002 <= d["year"] <= 2012}
    hits = index.search("tea heart cell", k=10, filter={"year": {"$gte": 2002, "$lte": 2012}}, mode="dense")
    assert [h.id for h in hits] == [d for d, _ in _reference(index, "tea heart cell", "first", allowed)][:10]
    index.add([{"_id": "new", "title": "New", "text": docs[0]["text"] + " " + docs[1]["text"]}])
    reopened = tt.Index.open(tmp_path / "first")
    assert reopened.store.passages["score"] == "first"
    hits = reopened.search("purr bone", k=13, mode="dense")
    assert [h.id for h in hits] == [d for d, _ in _reference(reopened, "purr bone", "first")]


def test_bad_scores_are_refused_by_name(tmp_path, tiny_bert_dir):
    with pytest.raises(TwoTowerError, match="passage_score.*max, first"):
        tt.Index.build(tmp_path / "a", ["x"], encoder=str(tiny_bert_dir), passage_score="sum")
    with pytest.raises(TwoTowerError, match="passage_score.*passages=False"):
        tt.Index.build(tmp_path / "b", ["x"], encoder=str(tiny_bert_dir), passages=False, passage_score="first")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "d", "title": "", "text": "tea"}\n')
    result = CliRunner().invoke(app, ["index", "build", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out",
                                      str(tmp_path / "c"), "--no-progress", "--passage-score", "mean"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--passage-score is one of max, first" in " ".join(result.output.split())
    assert not (tmp_path / "c").exists()


def test_first_is_refused_on_milvus_before_any_work(tmp_path, tiny_bert_dir):
    pytest.importorskip("milvus_lite")
    with pytest.raises(TwoTowerError, match="passage_score='first'.*Milvus.*backend='faiss'"):
        tt.Index.build(tmp_path / "m", ["x"], encoder=str(tiny_bert_dir), backend="milvus",
                       uri=str(tmp_path / "m.db"), passage_score="first")
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.db").exists()
