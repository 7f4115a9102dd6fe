"""Cross-encoder re-ranking with a tiny random-weight BERT cross-encoder built from a config."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from twotower.errors import ModelError
from twotower.retrieval.rerank import Reranker, RerankerTrainConfig, mine_negatives, train_reranker


def _direct_scores(path, pairs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    enc = tok([p[0] for p in pairs], [p[1] for p in pairs], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[:, 0].numpy()


TEXTS = {"a": "cats purr softly", "b": "dogs bark loudly at night", "c": "tea leaves", "d": "rust and python",
         "e": "the mitochondria"}


def test_scores_match_the_model_and_keep_pair_order(tiny_ce_dir):
    rr = Reranker(tiny_ce_dir, precision="fp32")
    pairs = [("q one", TEXTS[d]) for d in "abcde"]
    got = rr.score(pairs)
    expected = 1 / (1 + np.exp(-_direct_scores(tiny_ce_dir, pairs)))  # CrossEncoder applies a sigmoid
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_rerank_top_n_and_keep_the_tail(tiny_ce_dir):
    rr = Reranker(tiny_ce_dir, precision="fp32")
    run = {"q": {"a": 5.0, "b": 4.0, "c": 3.0, "d": 2.0, "e": 1.0}}
    out = rr.rerank(run, {"q": "which animal purrs"}, TEXTS.__getitem__, top_n=3, show_progress=False)
    scores = rr.score([("which animal purrs", TEXTS[d]) for d in "abc"])
    head = sorted(zip("abc", scores), key=lambda kv: -kv[1])
    ranked = sorted(out["q"], key=lambda d: -out["q"][d])
    assert ranked[:3] == [d for d, _ in head]
    assert ranked[3:] == ["d", "e"]  # below the top 3, in their old order
    assert out["q"]["a"] == pytest.approx(dict(head)["a"])


def test_bad_reranker_dirs(tmp_path, tiny_bert_dir):
    with pytest.raises(ModelError, match="cross-encoder directory not found"):
        Reranker(tmp_path / "nope")


def test_mine_negatives_drops_positives():
    negs = mine_negatives({"q": "cats purr"}, {"q": {"a": 1}}, list(TEXTS), list(TEXTS.values()), depth=3,
                          show_progress=False)
    assert "a" not in negs["q"] and len(negs["q"]) == 2


def test_train_reranker_tiny(tiny_beir, tiny_bert_dir, tmp_path):
    import shutil

    # the tiny data set has only a test split: train on a copy of it named train
    shutil.copy(tiny_beir / "qrels" / "test.tsv", tiny_beir / "qrels" / "train.tsv")
    out = tmp_path / "ce"
    stats = train_reranker(tiny_beir, out, base=str(tiny_bert_dir),
                           cfg=RerankerTrainConfig(negatives=2, mine_depth=4, epochs=2, batch_queries=2,
                                                   precision="fp32", max_length=32, show_progress=False))
    assert stats["groups"] == 3 and stats["steps"] == 4
    rr = Reranker(out, precision="fp32")
    assert rr.score([("which feline purrs", "Cats are small")]).shape == (1,)


def test_train_reranker_learns_a_separable_task(tiny_beir, tiny_bert_dir, tmp_path):
    """From a random-weight backbone, 40 steps on the 3 judged queries take the group softmax loss
    from ln 3 (the positive and 2 negatives scored alike) to under 0.4, and the saved model scores
    every query's positive far above each document that is relevant to no query (d2, d3, d6)."""
    import shutil

    from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES

    shutil.copy(tiny_beir / "qrels" / "test.tsv", tiny_beir / "qrels" / "train.tsv")
    stats = train_reranker(tiny_beir, tmp_path / "ce", base=str(tiny_bert_dir),
                           cfg=RerankerTrainConfig(negatives=2, mine_depth=6, epochs=40, batch_queries=3, lr=5e-3,
                                                   warmup=0.0, precision="fp32", max_length=48, show_progress=False))
    assert stats["steps"] == 40
    assert stats["first_loss"] > 0.9 and stats["last_loss"] < 0.4, stats  # ln 3 = 1.10
    text = {d["_id"]: f"{d['title']} {d['text']}".strip() for d in TINY_CORPUS}
    irrelevant = set(text) - {d for _, d, _ in TINY_QRELS}
    assert irrelevant == {"d2", "d3", "d6"}
    rr = Reranker(tmp_path / "ce", precision="fp32")
    for (qid, positive, _), q in zip(TINY_QRELS, TINY_QUERIES):
        assert q["_id"] == qid
        scores = dict(zip(text, rr.score([(q["text"], t) for t in text.values()])))  # sigmoid: 0..1
        assert scores[positive] > max(scores[d] for d in irrelevant) + 0.3, (qid, scores)


def test_eval_with_rerank_puts_the_top_in_the_cross_encoders_order(tiny_beir, tiny_bert_dir, tiny_ce_dir, tmp_path):
    """``eval --rerank``: each query's first-stage top ``depth`` comes back in the order of the cross-encoder's
    own scores (transformers, not sentence-transformers), the rest below in the first stage's order, and the
    metrics are those of the re-ranked run. The first stage is dense (every document ranked: BM25 ranks only the
    documents that match a query, one or two of these tiny ones)."""
    from typer.testing import CliRunner

    from conftest import TINY_CORPUS, TINY_QUERIES
    from twotower.cli import app
    from twotower.evaluation.metrics import evaluate
    from twotower.evaluation.runs import read_run

    def ranking(docs):
        return [d for d, _ in sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))]

    base = ["eval", "--data", str(tiny_beir), "--retriever", "dense", "--model", str(tiny_bert_dir), "--precision",
            "fp32", "--no-progress"]
    res = CliRunner().invoke(app, [*base, "--run", str(tmp_path / "bm25.trec")])
    assert res.exit_code == 0, res.output
    depth = 3
    res = CliRunner().invoke(app, [*base, "--rerank", str(tiny_ce_dir), "--rerank-depth", str(depth),
                                   "--out", str(tmp_path / "r.json"), "--run", str(tmp_path / "rr.trec")])
    assert res.exit_code == 0, res.output
    bm25, reranked = read_run(tmp_path / "bm25.trec"), read_run(tmp_path / "rr.trec")
    text = {d["_id"]: f"{d['title']} {d['text']}".strip() for d in TINY_CORPUS}
    query = {q["_id"]: q["text"] for q in TINY_QUERIES}
    changed = 0
    for q in query:
        before, after = ranking(bm25[q]), ranking(reranked[q])
        head = before[:depth]
        logits = _direct_scores(tiny_ce_dir, [(query[q], text[d]) for d in head])
        assert after[:depth] == [head[i] for i in np.argsort(-logits, kind="stable")], q
        assert after[depth:] == before[depth:], q
        changed += after != before
    assert changed, "the cross-encoder agreed with the first stage everywhere: this data cannot show a re-ranking"
    payload = json.loads((tmp_path / "r.json").read_text())
    assert "rerank_s" in payload["timings"]
    from twotower.data.beir import BeirDataset

    expected = evaluate(BeirDataset.load(tiny_beir, "test").qrels, reranked, tuple(payload["metrics"]))
    assert payload["metrics"] == pytest.approx(expected, abs=1e-4)


def test_blend_by_hand_and_against_scipy():
    """blend = w·z(cross-encoder) + (1 − w)·z(first stage) over the re-scored documents (scipy's population z)."""
    from scipy.stats import zscore

    from twotower.retrieval.rerank import blend

    first, ce = {"a": 3.0, "b": 2.0, "c": 1.0, "x": 9.0}, {"a": 0.0, "b": 1.0, "c": 5.0}  # x: not re-scored
    zf, zc = zscore([3.0, 2.0, 1.0]), zscore([0.0, 1.0, 5.0])
    got = blend(first, ce, 0.5)
    assert list(got) == ["a", "b", "c"]
    assert [got[d] for d in "abc"] == pytest.approx(list(0.5 * zc + 0.5 * zf))
    assert got["a"] == pytest.approx(0.5 * (-2 / 14 ** 0.5 * 3 ** 0.5) + 0.5 * 1.5 ** 0.5)  # by hand
    assert sorted(got, key=lambda d: -got[d]) == ["a", "c", "b"]
    assert blend(first, ce, 1.0) == ce
    zero = blend(first, ce, 0.0)
    assert sorted(zero, key=lambda d: -zero[d]) == ["a", "b", "c"]  # the first stage's order
    with pytest.raises(ValueError, match="weight must be in"):
        blend(first, ce, 1.5)


def test_eval_and_search_use_a_fitted_rerank_weight(tiny_beir, tiny_bert_dir, tiny_ce_dir, tmp_path):
    """A model fitted with a re-ranker at weight 0.3: eval re-ranks by blend(…, 0.3) — the same as Reranker.rerank
    with weight 0.3 on the dense run, not the cross-encoder alone — and --rerank-weight overrides it."""
    import shutil

    from twotower.encoders.towers import DualEncoder
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval.defaults import RetrievalDefaults, write_defaults
    from twotower.data.beir import BeirDataset

    model = tmp_path / "model"
    DualEncoder.load(str(tiny_bert_dir)).save(model)
    shutil.copytree(tiny_ce_dir, model / "reranker")
    write_defaults(model, RetrievalDefaults(mode="dense", rerank="reranker", rerank_depth=4, rerank_weight=0.3))
    base = dict(data=tiny_beir, split="test", top_k=10, show_progress=False, precision="fp32")
    got = run_eval(EvalConfig(model=str(model), **base))
    dense = run_eval(EvalConfig(model=str(model), retriever="dense", **base)).run
    ds = BeirDataset.load(tiny_beir, "test")
    rr = Reranker(model / "reranker", precision="fp32")
    text = lambda d: ds.corpus[d].full_text  # noqa: E731
    want = rr.rerank(dense, ds.queries, text, top_n=4, show_progress=False, weight=0.3)
    alone = rr.rerank(dense, ds.queries, text, top_n=4, show_progress=False)
    for q in want:
        assert got.run[q] == pytest.approx(want[q])
    assert any(got.run[q] != pytest.approx(alone[q]) for q in want)
    other = run_eval(EvalConfig(model=str(model), rerank_weight=1.0, **base))
    for q in alone:
        assert other.run[q] == pytest.approx(alone[q])


def test_search_uses_a_fitted_rerank_weight(tiny_beir, tiny_bert_dir, tiny_ce_dir, tmp_path):
    """``twotower search`` on an index of a model fitted with a re-ranker at weight 0.3: the hits come in the order
    of blend(first-stage scores, cross-encoder scores, 0.3) over the retriever's top rerank_depth."""
    import shutil

    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.defaults import RetrievalDefaults, write_defaults
    from twotower.retrieval.rerank import blend
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    model = tmp_path / "model"
    DualEncoder.load(str(tiny_bert_dir)).save(model)
    shutil.copytree(tiny_ce_dir, model / "reranker")
    write_defaults(model, RetrievalDefaults(mode="dense", rerank="reranker", rerank_depth=5, rerank_weight=0.3))
    build_index(tiny_beir, tmp_path / "idx", model=str(model), cfg=EncodeConfig(show_progress=False))
    query = "which animal purrs"
    res = CliRunner().invoke(app, ["search", query, "--index", str(tmp_path / "idx"), "-k", "5", "--json"])
    assert res.exit_code == 0, res.output
    got = [json.loads(m)["id"] for m in re.findall(r'\{"rank".*\}$', res.output, re.M)]  # stderr shares the output
    assert len(got) == 5, res.output
    searcher = Searcher(tmp_path / "idx", query_runtime="auto")  # the query runtime tt.Index.open uses by default
    hits = searcher.search(query, 5, mode="dense")
    store = searcher.store
    texts = [f"{store.document(store.row_of[h.doc_id])['title']} {store.document(store.row_of[h.doc_id])['text']}".strip()
             for h in hits]
    ce = Reranker(model / "reranker").score([(query, t) for t in texts])
    want = blend({h.doc_id: h.score for h in hits}, {h.doc_id: float(s) for h, s in zip(hits, ce)}, 0.3)
    assert got == sorted(want, key=lambda d: -want[d])
    alone = [h.doc_id for _, h in sorted(zip(ce, hits), key=lambda sh: -sh[0])]
    assert got != alone  # the cross-encoder alone would order them otherwise: the weight was applied
