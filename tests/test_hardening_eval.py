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


# ---------------------------------------------------------------- case 6 and "numbers in qrels outside any sane range"


def _eval(data, *extra):
    return runner.invoke(app, ["eval", "--data", str(data), "--no-progress", *extra])


def test_qrels_where_nothing_is_relevant_are_refused(tmp_path):
    """All grades ≤ 0: every metric is 0 whatever the retriever; said, not printed as a table of zeros."""
    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, [("q1", "d1", 0), ("q2", "d4", 0), ("q3", "d5", -1)])
    res = _eval(data)
    out = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert "test.tsv" in out and "none of the 3 judgements has a score > 0" in out and "ndcg@10" not in out, out


@pytest.mark.parametrize("grade", ["1000000000000", "-5000000000", "101", "-101"])
def test_a_grade_outside_any_sane_range_is_named_by_line(tmp_path, grade):
    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, [("q1", "d1", 1), ("q2", "d4", grade), ("q3", "d5", 1)])
    res = _eval(data)
    out = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert f"test.tsv, line 3, field 'score': relevance grade {grade} is outside any sane range" in out, out


def test_grades_at_the_edges_of_the_range_evaluate(tmp_path):
    """-100 and 100 are accepted; pytrec_eval then computes NDCG with the grade as the gain (hand-computed: q2's
    only judged document graded 100 found at rank r gives 1/log2(r+1) · 100 / 100)."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, [("q1", "d1", -100), ("q1", "d2", 1),
                                                                  ("q2", "d4", 100), ("q3", "d5", 1)])
    got = run_eval(EvalConfig(data=data, metrics=("ndcg@10",), show_progress=False))
    rank = sorted(got.run["q2"], key=lambda d: -got.run["q2"][d]).index("d4") + 1
    from twotower.evaluation.metrics import per_query

    assert per_query({"q2": {"d4": 100}}, got.run, ("ndcg@10",))["ndcg@10"]["q2"] == pytest.approx(1 / np.log2(rank + 1))


def test_in_memory_qrels_get_the_same_range_check(tmp_path):
    """qrels built in memory (no file, no line) go through the same check before any retrieval."""
    from twotower.data.beir import BeirDataset, Document
    from twotower.errors import DataError
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    corpus = {d["_id"]: Document(id=d["_id"], title=d["title"], text=d["text"]) for d in TINY_CORPUS}
    ds = BeirDataset.from_parts(None, "test", corpus, {q["_id"]: q["text"] for q in TINY_QUERIES},
                                {"q1": {"d1": 10**12}, "q2": {"d4": 1}})
    with pytest.raises(DataError, match=r"query 'q1', document 'd1': relevance grade 1000000000000 is outside"):
        run_eval(EvalConfig(data=tmp_path, show_progress=False), dataset=ds)


def test_queries_without_a_relevant_document_are_counted(tmp_path):
    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, [("q1", "d1", 1), ("q2", "d4", 0), ("q3", "d5", 1)])
    res = _eval(data)
    out = _flat(res.output)
    assert res.exit_code == 0, res.output
    assert "1 of 3 judged queries have no relevant document" in out and "'q2'" in out, out


def test_a_relevant_document_dropped_by_the_identical_id_rule_is_reported(tmp_path):
    """BEIR drops a retrieved document whose id equals the query's: a relevant one can then never be found. The
    warning counts it; the metrics show why (reference: pytrec_eval with and without the rule)."""
    from twotower.evaluation.metrics import evaluate

    corpus = TINY_CORPUS + [{"_id": "q1", "title": "Purring", "text": "which feline purrs: the cat"}]
    data = write_beir(tmp_path / "d", corpus, TINY_QUERIES, [("q1", "q1", 1), ("q2", "d4", 1), ("q3", "d5", 1)])
    res = _eval(data)
    out = _flat(res.output)
    assert res.exit_code == 0, res.output
    assert "1 relevant judgement(s) name a document with its query's own id ('q1')" in out, out
    qrels = {"q1": {"q1": 1}}
    assert evaluate(qrels, {"q1": {"q1": 1.0}}, ("recall@100",), ignore_identical_ids=False)["recall@100"] == 1.0
    assert evaluate(qrels, {"q1": {"q1": 1.0}}, ("recall@100",))["recall@100"] == 0.0


# ---------------------------------------------------------------- kind: lexical search returning documents that match nothing


def test_bm25_drops_documents_that_match_nothing_in_eval(tmp_path):
    """q1 ("which feline purrs") matches only d1 ("... felines that purr"), a query of unknown words matches no
    document: eval's BM25 run holds exactly the matching documents, not k of them."""
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    queries = TINY_QUERIES + [{"_id": "q9", "text": "quantum chromodynamics"}]
    data = write_beir(tmp_path / "d", TINY_CORPUS, queries, TINY_QRELS + [("q9", "d3", 1)])
    got = run_eval(EvalConfig(data=data, retriever="bm25", show_progress=False))
    assert got.run["q9"] == {}
    # by hand, stemmed words shared with the query: feline/purr; memory, system, programming, language; green, tea
    expected = {"q1": {"d1"}, "q2": {"d3", "d4"}, "q3": {"d5"}}
    assert {q: set(got.run[q]) for q in expected} == expected
    assert all(s > 0 for q in expected for s in got.run[q].values())


def test_bm25_search_and_the_service_agree(tmp_path, tiny_bert_dir):
    """The index's BM25 (search, the service, eval --index) leaves them out alike."""
    from fastapi.testclient import TestClient

    from conftest import flat_index
    from twotower.retrieval.searcher import Searcher
    from twotower.serve.app import create_app

    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    index = flat_index(data, tiny_bert_dir, tmp_path / "idx")
    searcher = Searcher(index, precision="fp32")
    assert searcher.search("quantum chromodynamics", k=5, mode="bm25") == []
    hits = searcher.search("green tea leaves", k=5, mode="bm25")
    assert [h.doc_id for h in hits] == ["d5"]
    client = TestClient(create_app(index, precision="fp32", api_key=None))
    res = client.post("/search", json={"query": "quantum chromodynamics", "k": 5, "mode": "bm25"})
    assert res.status_code == 200 and res.json()["hits"] == [], res.json()
    res = client.post("/search", json={"query": "green tea leaves", "k": 5, "mode": "bm25"})
    assert [h["id"] for h in res.json()["hits"]] == ["d5"]
    # hybrid: the documents BM25 does not match get its minimum (0 after min-max), as a missing document always did
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    got = run_eval(EvalConfig(data=data, index=index, retriever="bm25", show_progress=False))
    assert set(got.run["q3"]) == {"d5"}


# ---------------------------------------------------------------- kind: an index fed vectors of a different encoder


@pytest.fixture(scope="module")
def other_models(tmp_path_factory):
    """Two more tiny BERTs with the fixture's tokenizer: one of the same size (32-d) and other weights, one 48-d."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from twotower.encoders.backbone import default_model_path

    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    out = {}
    for name, hidden in (("same-size", 32), ("wider", 48)):
        torch.manual_seed(7)
        path = tmp_path_factory.mktemp(name)
        cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)
        BertModel(cfg, add_pooling_layer=False).save_pretrained(path)
        tok.save_pretrained(path)
        out[name] = path
    return out


@pytest.fixture()
def built(tmp_path, tiny_bert_dir):
    from conftest import flat_index

    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    return data, flat_index(data, tiny_bert_dir, tmp_path / "idx")


@pytest.mark.parametrize("which", ["same-size", "wider"])
def test_eval_and_search_refuse_another_encoder_for_an_index(built, other_models, which):
    """Another model's query vectors against the stored ones: eval --index reported NDCG under the index's model name
    for a search that ranked by another encoder's vectors. Refused, naming the index's model."""
    from twotower.retrieval.searcher import Searcher

    data, index = built
    res = runner.invoke(app, ["eval", "--data", str(data), "--index", str(index), "--model", str(other_models[which]),
                              "--no-progress"])
    out = _flat(res.output)
    assert res.exit_code == 2, res.output
    assert "its documents were encoded by" in out and "is another encoder" in out and "ndcg@10" not in out, out
    with pytest.raises(TwoTowerError, match="is another encoder"):
        Searcher(index, model=str(other_models[which]))


def test_index_add_refuses_another_encoder_and_keeps_the_index(built, other_models, tmp_path):
    data, index = built
    docs = tmp_path / "new.jsonl"
    docs.write_text('{"_id": "n1", "title": "Coffee", "text": "Coffee is brewed from roasted beans."}\n')
    before = (index / "CURRENT").read_text()
    for which in ("same-size", "wider"):
        res = runner.invoke(app, ["index", "add", "--index", str(index), "--docs", str(docs), "--model",
                                  str(other_models[which]), "--no-progress"])
        assert res.exit_code == 2 and "is another encoder" in _flat(res.output), res.output
    assert (index / "CURRENT").read_text() == before


def test_a_loaded_encoder_of_another_size_is_refused_by_add(built, other_models):
    """The Python path: add with an encoder object whose vectors are 48-d into a 32-d index."""
    from twotower.data.beir import Document
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.indexing import EncodeConfig, add_documents_from

    _, index = built
    wide = DualEncoder.load(str(other_models["wider"]))
    wide.name = ""  # nameless: only its size tells
    with pytest.raises(TwoTowerError, match=r"holds 32-d vectors .* gives 48-d vectors"):
        add_documents_from(index, [Document(id="n1", title="", text="coffee")], encoder=wide,
                           cfg=EncodeConfig(precision="fp32", show_progress=False))


def test_the_index_model_under_another_spelling_is_accepted(built, tiny_bert_dir, monkeypatch):
    """The same directory named relatively: accepted (and searches the same as without --model)."""
    from twotower.retrieval.searcher import Searcher

    data, index = built
    monkeypatch.chdir(tiny_bert_dir.parent)
    own = Searcher(index, precision="fp32").search("green tea", k=3)
    same = Searcher(index, model=f"./{tiny_bert_dir.name}", precision="fp32").search("green tea", k=3)
    assert [(h.doc_id, round(h.score, 5)) for h in own] == [(h.doc_id, round(h.score, 5)) for h in same]


def test_pretrain_refuses_a_length_below_the_minimum_before_writing(tmp_path, tiny_bert_dir):
    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    out = tmp_path / "run"
    res = runner.invoke(app, ["pretrain", "--corpus", str(data / "corpus.jsonl"), "--model", str(tiny_bert_dir),
                              "--out", str(out), "--steps", "1", "--batch-size", "4", "--max-length", "2",
                              "--no-progress"])
    assert res.exit_code == 2 and "at least 3" in _flat(res.output), res.output
    assert not out.exists()
