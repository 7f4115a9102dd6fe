"""Cross-encoder re-ranking with a tiny random-weight BERT cross-encoder built from a config."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from twotower.errors import ModelError
from twotower.retrieval.rerank import Reranker, RerankerTrainConfig, mine_negatives, train_reranker


@pytest.fixture(scope="session")
def tiny_ce_dir(tmp_path_factory):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from twotower.encoders.backbone import default_model_path

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-ce")
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


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


def test_eval_with_rerank(tiny_beir, tiny_bert_dir, tiny_ce_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "bm25", "--rerank", str(tiny_ce_dir),
                                   "--rerank-depth", "2", "--precision", "fp32", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert "rerank_s" in payload["timings"]
