"""``fit`` on long documents ranks them as the index it writes does (issue #52): its dev runs, the positives' scores
behind the margin, the mined negatives and the distillation candidates score a document by its best passage.

The corpus scorer (training/fit/corpus.py) is checked against a numpy brute force; the wiring by building a real
index (FAISS, passages on by default) with each model fit made and comparing its hits with fit's dev runs: a fit that
scored documents by their first window only would rank the long documents here differently (checked below)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_beir
from twotower.training.fit import FitOptions, FitRecipe, run_fit
from twotower.retrieval import multivector
from twotower.training.fit.corpus import CorpusVectors
from twotower.training.fit.cv import pooled_run

WORDS = "cat dog tea rust python cell sun moon river stone tree bird fish apple music train".split()


def _brute(queries, vectors, offsets, k):
    docs = np.stack([(queries @ vectors[a:b].T).max(axis=1) for a, b in zip(offsets[:-1], offsets[1:])], axis=1)
    rows = np.argsort(-docs, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(docs, rows, axis=1), rows


@pytest.mark.parametrize("budget", [multivector.ENTRY_BUDGET, 30])  # 30: a query or two at a time
def test_corpus_search_scores_each_document_by_its_best_passage(monkeypatch, budget):
    monkeypatch.setattr(multivector, "ENTRY_BUDGET", budget)
    rng = np.random.default_rng(0)
    offsets = np.array([0, 1, 4, 5, 9, 10, 12])  # documents of 1, 3, 1, 4, 1 and 2 passages
    vectors = rng.normal(size=(12, 8)).astype(np.float32)
    queries = rng.normal(size=(7, 8)).astype(np.float32)
    corpus = CorpusVectors(vectors, offsets)
    assert not corpus.single and corpus.num_docs == 6
    scores, rows = corpus.search(queries, 4)
    want_scores, want_rows = _brute(queries, vectors, offsets, 4)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    assert corpus.score(queries[2], 3) == pytest.approx(float(max(vectors[j] @ queries[2] for j in range(5, 9))))


def test_a_corpus_of_one_passage_per_document_is_plain_exact_search():
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(9, 4)).astype(np.float32)
    corpus = CorpusVectors(vectors, np.arange(10))
    assert corpus.single
    scores, rows = corpus.search(vectors[:3], 9)
    want_scores, want_rows = _brute(vectors[:3], vectors, np.arange(10), 9)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


def test_pooled_run_scores_a_pooled_document_by_its_best_passage():
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    vecs = {"long": np.array([[0.1, 0.0], [0.9, 0.0]], dtype=np.float32), "short": np.array([0.5, 0.0], np.float32)}
    run = pooled_run(q, ["q"], {"q": {"long", "short"}}, vecs, 2)
    assert list(run["q"]) == ["long", "short"]
    assert run["q"]["long"] == pytest.approx(0.9) and run["q"]["short"] == pytest.approx(0.5)


def _long_data(root):
    """Documents whose subject comes only after ~150 words of text shared by all (longer than the tiny model's
    128-token window): their first windows are all alike; only a later passage tells them apart."""
    filler = " ".join(f"Section {j} lists general remarks that every report repeats." for j in range(16))
    corpus = [{"_id": f"d{i}", "title": "", "text": f"{filler} This report is about the {w}. The {w} matters here."}
              for i, w in enumerate(WORDS)]
    queries = [{"_id": f"q{i}", "text": f"the {w}"} for i, w in enumerate(WORDS)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(len(WORDS))]
    return write_beir(root, corpus, queries, qrels, split="train")


def test_fit_dev_runs_rank_long_documents_as_the_index_it_writes(tiny_bert_dir, tmp_path):
    import twotower as tt
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.retrieval.dense import exact_search

    data = _long_data(tmp_path / "data")
    recipe = FitRecipe(model=str(tiny_bert_dir), min_dev=6, batch_size=4, epochs=1, mine=False, cv_below=0)
    run_fit(data, tmp_path / "out", recipe, FitOptions(show_progress=False, precision="fp32"))
    stages = tmp_path / "out" / "stages"
    dev = json.loads((stages / "split" / "done.json").read_text())["dev"]
    assert len(dev) >= 6
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (data / "queries.jsonl").open()}
    finetuned = tmp_path / "out" / json.loads((stages / "finetune" / "done.json").read_text())["model"]
    for stage, model in (("zeroshot", tiny_bert_dir), ("finetune", finetuned)):
        run = json.loads((stages / stage / "dev_run.json").read_text())
        index = tt.Index.build(tmp_path / f"idx-{stage}", data, encoder=str(model), precision="fp32",
                               show_progress=False)
        assert index.info()["num_passages"] > len(WORDS)  # the documents were split
        hits = index.search([queries[q] for q in dev], k=len(WORDS), mode="dense")  # the dev run is dense
        for q, found in zip(dev, hits):
            # the same documents with the same scores (documents whose first passage is their best tie: the
            # shared opening; their order among themselves is each engine's own)
            assert {h.id for h in found} == set(run[q]), (stage, q)
            for h in found:
                assert run[q][h.id] == pytest.approx(h.score, abs=1e-4), (stage, q, h.id)
        # first windows alone (what fit scored before) rank these documents otherwise
        enc = DualEncoder.load(str(model))
        opts = EncodeOptions(precision="fp32", show_progress=False)
        texts = [json.loads(line) for line in (data / "corpus.jsonl").open()]
        first = enc.encode_documents([d["text"] for d in texts], opts)
        s, _ = exact_search(enc.encode_queries([queries[q] for q in dev], opts), first, 1)
        assert not np.allclose(s[:, 0], [max(run[q].values()) for q in dev], atol=1e-3), stage
