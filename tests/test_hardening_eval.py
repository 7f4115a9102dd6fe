"""Issue 35 (hardening B), evaluation and retrieval side: length settings at their minimum, qrels with nothing
relevant or absurd grades, lexical search returning documents that match nothing, an index fed another encoder."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir
from twotower.cli import app
from twotower.errors import TwoTowerError

runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


LONG_DOC = {"_id": "long", "title": "Long", "text": " ".join(["mitochondria"] * 400)}  # past 128 positions


# ---------------------------------------------------------------- case 3: length settings at their minimum


@pytest.mark.parametrize("option, value, role", [
    ("--query-max-length", "1", "query"), ("--doc-max-length", "1", "document"),
    ("--query-max-length", "2", "query"), ("--doc-max-length", "2", "document"),
])
def test_eval_refuses_a_length_that_holds_no_text_token(tmp_path, tiny_bert_dir, option, value, role):
    """BERT puts [CLS] and [SEP] around every text: 1 or 2 tokens leave no room for the text, and the tokenizer then
    truncates nothing (the option was silently ignored, and a long document crashed past the positions)."""
    data = write_beir(tmp_path / "d", TINY_CORPUS + [LONG_DOC], TINY_QUERIES, TINY_QRELS)
    res = runner.invoke(app, ["eval", "--data", str(data), "--model", str(tiny_bert_dir), "--precision", "fp32",
                              "--no-progress", option, value])
    out = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in out and f"{value}:" in out and f"every {role}" in out and "at least 3" in out, out


def test_the_minimum_length_is_honoured(tiny_bert_dir):
    """At the minimum (3 for BERT) a document is cut to its first token: its vector is that of the first word
    alone; the query length likewise (independent reference: the word encoded without any cut)."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    opts = EncodeOptions(precision="fp32", show_progress=False)
    cut = DualEncoder.load(str(tiny_bert_dir), query_max_length=3, doc_max_length=3)
    whole = DualEncoder.load(str(tiny_bert_dir))
    assert (cut.query_max_length, cut.doc_max_length) == (3, 3)
    np.testing.assert_allclose(cut.encode_documents(["cats are small domesticated felines"], opts),
                               whole.encode_documents(["cats"], opts), atol=1e-5)
    np.testing.assert_allclose(cut.encode_queries(["tea leaves brewed"], opts),
                               whole.encode_queries(["tea"], opts), atol=1e-5)
    assert not np.allclose(whole.encode_documents(["cats are small domesticated felines"], opts),
                           whole.encode_documents(["cats"], opts), atol=1e-5)


def test_a_prompt_raises_the_minimum(tiny_bert_dir, tmp_path):
    """A model with a query prompt ("query: ": 2 tokens) needs 2 + 2 + 1 tokens for a query."""
    import shutil

    from twotower.encoders.io import min_length, write_prompts
    from twotower.encoders.towers import DualEncoder

    model = tmp_path / "prompted"
    shutil.copytree(tiny_bert_dir, model)
    write_prompts(model, {"query": "query: "})
    assert min_length(DualEncoder.load(str(model)).query_tower, "query") == 5
    with pytest.raises(TwoTowerError, match=r"--query-max-length 4: .*prompt 'query: '.*at least 5"):
        DualEncoder.load(str(model), query_max_length=4)
    assert DualEncoder.load(str(model), query_max_length=5).query_max_length == 5


def test_train_refuses_it_before_writing(tmp_path, tiny_bert_dir):
    data = write_beir(tmp_path / "d", TINY_CORPUS + [LONG_DOC], TINY_QUERIES, TINY_QRELS, split="train")
    for option in ("--max-length", "--query-max-length"):
        out = tmp_path / f"run{option}"
        res = runner.invoke(app, ["train", "--data", str(data), "--model", str(tiny_bert_dir), "--out", str(out),
                                  "--steps", "1", "--batch-size", "2", "--no-progress", option, "2"])
        assert res.exit_code == 2 and "at least 3" in _flat(res.output), res.output
        assert not (out / "model").exists() and not (out / "train_config.json").exists()
