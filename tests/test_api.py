"""The public Python API (``import twotower as tt``): a new user's program, checked against the CLI and against
numpy / hand-computed references; in-memory data; the lazy import; docstrings with examples for every name."""

from __future__ import annotations

import json
import math
import pydoc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import twotower as tt
from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, subprocess_env, write_beir

WORDS = "cat dog tea rust python cell sun moon river stone tree bird fish apple music train".split()


def _data(root: Path) -> Path:
    """A BEIR folder with train and test judgements, graded (2 and 1) so that graded relevance matters."""
    corpus = [{"_id": f"d{i}", "title": w, "text": f"{w} is about {w} and {WORDS[(i + 3) % len(WORDS)]}"}
              for i, w in enumerate(WORDS)]
    queries = [{"_id": f"q{i}", "text": f"what is {w}"} for i, w in enumerate(WORDS)]
    train = [(f"q{i}", f"d{i}", 1) for i in range(len(WORDS))]
    data = write_beir(root, corpus, queries, train, split="train")
    test = "".join(f"q{i}\td{i}\t2\nq{i}\td{(i + 1) % len(WORDS)}\t1\n" for i in range(0, len(WORDS), 2))
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + test)
    return data


# The program a new user writes from the docstrings (load, fit, index, search, evaluate): at most 15 lines.
PROGRAM = """
import twotower as tt

ds = tt.load_beir(DATA, split="test")
fitted = tt.fit(DATA, OUT / "fitted", model=MODEL, epochs=1, mine=False, batch_size=4, min_dev=4,
                precision="fp32", show_progress=False)
index = tt.Index.build(OUT / "index", ds, encoder=fitted.model, bm25=True, precision="fp32", show_progress=False)
hits = index.search("what is tea", k=3)
result = tt.evaluate(index, ds, metrics=["ndcg@10", "recall@100", "map@100"], precision="fp32")
"""


def _ndcg10(qrels: dict, run: dict) -> float:
    """nDCG@10 by hand as trec_eval computes it (BEIR's convention): the grade itself as the gain, over
    log2(rank + 1), ties broken by document id descending, the query's own id left out of the run."""
    values = []
    for q, rels in qrels.items():
        docs = sorted(run.get(q, {}).items(), key=lambda kv: kv[0], reverse=True)
        ranked = [d for d, _ in sorted(docs, key=lambda kv: -kv[1]) if d != q][:10]
        dcg = sum(max(rels.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked))
        ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        values.append(dcg / idcg if idcg else 0.0)
    return float(np.mean(values))


def test_a_new_users_program_runs_and_matches_the_cli(tiny_bert_dir, tmp_path):
    assert len(PROGRAM.strip().splitlines()) <= 15
    data = _data(tmp_path / "data")
    scope = {"DATA": data, "OUT": tmp_path, "MODEL": str(tiny_bert_dir)}
    exec(PROGRAM, scope)
    result, hits, fitted = scope["result"], scope["hits"], scope["fitted"]
    assert fitted.model == tmp_path / "fitted" / "model" and fitted.choices["mode"] in ("dense", "hybrid", "rrf", "bm25")
    assert 1 <= len(hits) <= 3 and all(isinstance(h, tt.Hit) for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    # the same inputs through the CLI give the same numbers
    from twotower.cli import app

    out = tmp_path / "cli.json"
    res = CliRunner().invoke(app, ["eval", "--data", str(data), "--index", str(tmp_path / "index"), "--metrics",
                                   "ndcg@10,recall@100,map@100", "--precision", "fp32", "--out", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["metrics"] == result.metrics
    # and the metrics are those of the run, computed by hand with graded gains (not via pytrec_eval)
    qrels = tt.load_beir(data).qrels
    assert result.metrics["ndcg@10"] == pytest.approx(_ndcg10(qrels, result.run), abs=1e-6)
    assert np.mean(list(result.per_query["ndcg@10"].values())) == pytest.approx(result.metrics["ndcg@10"])
    assert set(result.per_query["ndcg@10"]) == set(qrels)


def test_index_search_equals_brute_force_over_the_encoders_vectors(tiny_bert_dir, tmp_path):
    enc = tt.Encoder.load(str(tiny_bert_dir), device="cpu", precision="fp32")
    index = tt.Index.build(tmp_path / "idx", TINY_CORPUS, encoder=enc, bm25=True, precision="fp32",
                           show_progress=False)
    docs = enc.encode_documents([{"title": d["title"], "text": d["text"]} for d in TINY_CORPUS])
    texts = [q["text"] for q in TINY_QUERIES]
    scores = enc.encode_queries(texts) @ docs.T
    got = index.search(texts, k=4, mode="dense")
    for row, hits in zip(scores, got):
        order = np.argsort(-row)[:4]
        assert [h.id for h in hits] == [TINY_CORPUS[i]["_id"] for i in order]
        assert [h.score for h in hits] == pytest.approx(row[order].tolist(), abs=1e-5)
    first = got[0][0]
    source = next(d for d in TINY_CORPUS if d["_id"] == first.id)
    assert (first.title, first.text) == (source["title"], source["text"])
    assert first.document == {"_id": first.id, "title": source["title"], "text": source["text"]}
    alone = index.search(texts[0], k=4, mode="dense")  # one query: one list (encoded alone: float noise only)
    assert [h.id for h in alone] == [h.id for h in got[0]]
    assert [h.score for h in alone] == pytest.approx([h.score for h in got[0]], abs=1e-5)


def test_index_add_remove_and_reopen(tiny_bert_dir, tmp_path):
    index = tt.Index.build(tmp_path / "idx", {d["_id"]: d["text"] for d in TINY_CORPUS}, encoder=str(tiny_bert_dir),
                           precision="fp32", show_progress=False)
    index.add([{"_id": "new", "title": "Oolong", "text": "Oolong tea is partly oxidised."}])
    again = tt.Index.open(tmp_path / "idx", precision="fp32")
    assert len(again) == len(TINY_CORPUS) + 1 and again.documents(["new"])[0]["title"] == "Oolong"
    vec = tt.Encoder.load(str(tiny_bert_dir), precision="fp32").encode_documents(["Oolong Oolong tea is partly oxidised."])
    hit = again.search("anything", k=len(again), mode="dense")
    assert "new" in [h.id for h in hit]
    stored = np.asarray(again.store.vectors)[again.store.row_of["new"]]
    assert np.allclose(stored, vec[0], atol=1e-5)  # the title and text joined as the corpus loader joins them
    with pytest.raises(tt.TwoTowerError, match="already in the index"):
        again.add({"new": "again"})
    again.remove(["new"])
    assert len(tt.Index.open(tmp_path / "idx")) == len(TINY_CORPUS)
    assert again.info()["num_docs"] == len(TINY_CORPUS)


def test_in_memory_dataset_equals_the_same_files(tmp_path):
    folder = write_beir(tmp_path / "beir", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    from_files = tt.load_beir(folder)
    in_memory = tt.Dataset.from_lists(TINY_CORPUS, {q["_id"]: q["text"] for q in TINY_QUERIES},
                                      {q: {d: s} for q, d, s in TINY_QRELS})
    assert (in_memory.corpus, in_memory.queries, in_memory.qrels) == (from_files.corpus, from_files.queries,
                                                                     from_files.qrels)
    a = tt.evaluate("bm25", in_memory, metrics=["ndcg@10", "recall@100"])
    b = tt.evaluate("bm25", folder, metrics=["ndcg@10", "recall@100"])
    assert a.metrics == b.metrics and a.run == b.run and a.dataset == "in-memory" and b.dataset == "beir"
    saved = tt.load_beir(in_memory.save(tmp_path / "saved"))
    assert (saved.corpus, saved.queries, saved.qrels) == (from_files.corpus, from_files.queries, from_files.qrels)
    with pytest.raises(tt.DataError, match="not an empty folder"):
        in_memory.save(tmp_path / "saved")  # nothing is replaced


def test_in_memory_dataset_is_checked_like_files():
    ds = tt.Dataset.from_lists({"d1": "tea", "d2": {"title": "T", "text": "coffee"}}, {"q1": "tea", "q2": "x"},
                               {"q1": {"d1": 1, "nope": 1}, "ghost": {"d1": 1}})
    assert ds.qrels == {"q1": {"d1": 1}} and ds.unknown_queries == 1 and ds.unknown_docs == 1 and ds.warnings
    with pytest.raises(tt.DataError):
        tt.Dataset.from_lists({"d1": "tea"}, {"q1": "tea"}, {"q1": {"nope": 1}}, strict=True)
    with pytest.raises(tt.DataError, match=r"corpus\[1\].*'_id'"):
        tt.Dataset.from_lists([{"_id": "d1", "text": "a"}, {"text": "no id"}], {"q1": "a"}, {"q1": {"d1": 1}})
    with pytest.raises(tt.DataError, match="duplicate document id 'd1'"):
        tt.Dataset.from_lists([{"_id": "d1", "text": "a"}, {"_id": "d1", "text": "b"}], {"q1": "a"}, {"q1": {"d1": 1}})
    with pytest.raises(tt.DataError, match="grade"):
        tt.Dataset.from_lists({"d1": "a"}, {"q1": "a"}, {"q1": {"d1": "1"}})
    with pytest.raises(tt.DataError, match="text"):
        tt.Dataset.from_lists({"d1": 3}, {"q1": "a"}, {"q1": {"d1": 1}})


def test_encoder_handles_titles_prefixes_and_bad_input(tiny_bert_dir):
    enc = tt.Encoder.load(str(tiny_bert_dir), device="cpu", precision="fp32")
    joined = enc.encode_documents(["Title and the text"])
    as_dict = enc.encode_documents([{"title": "Title", "text": "and the text"}])
    assert np.allclose(joined, as_dict, atol=1e-6) and joined.dtype == np.float32
    assert np.allclose(np.linalg.norm(joined, axis=1), 1.0, atol=1e-5)  # cosine model: unit vectors
    per_doc = enc.encode_multivector(["a longer document about tea and coffee", "short"], m=3)
    assert [len(v) for v in per_doc] == [3, 3] and per_doc[0].shape[1] == enc.dim
    with pytest.raises(tt.TwoTowerError, match="list"):
        enc.encode_queries("a single string")
    with pytest.raises(tt.TwoTowerError, match=r"queries\[1\]"):
        enc.encode_queries(["ok", 5])
    with pytest.raises(tt.TwoTowerError, match="precision"):
        tt.Encoder.load(str(tiny_bert_dir), precision="fp8")


def test_encoder_save_round_trip(tiny_bert_dir, tmp_path):
    enc = tt.Encoder.load(str(tiny_bert_dir), precision="fp32")
    again = tt.Encoder.load(enc.save(tmp_path / "saved"), precision="fp32")
    texts = ["what is tea", "rust memory safety"]
    assert np.allclose(enc.encode_queries(texts), again.encode_queries(texts), atol=1e-6)


def test_evaluate_refuses_what_it_cannot_mean(tmp_path):
    folder = write_beir(tmp_path / "beir", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    with pytest.raises(tt.TwoTowerError, match="retriever"):
        tt.evaluate(42, folder)
    with pytest.raises(tt.TwoTowerError, match="disagree"):
        tt.evaluate("bm25", folder, mode="dense")
    with pytest.raises(tt.TwoTowerError, match="metric"):
        tt.evaluate("bm25", folder, metrics=["ndcg@ten"])


def test_import_twotower_loads_no_torch():
    code = "import sys, twotower; assert 'torch' not in sys.modules and 'numpy' not in sys.modules; print(len(twotower.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env())
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(tt.__all__) >= 40


def test_every_public_name_resolves_and_has_a_docstring_with_an_example():
    missing = []
    for name in tt.__all__:
        obj = getattr(tt, name)
        doc = obj.__doc__ or ""
        if "Example" not in doc:
            missing.append(name)
    assert missing == []


def test_help_lists_the_api():
    text = pydoc.render_doc(tt, renderer=pydoc.plaintext)
    for name in ("Encoder", "Index", "Dataset", "evaluate", "fit", "train", "load_beir", "TwoTowerError"):
        assert name in text


def test_evaluate_an_encoder_is_dense_retrieval_over_its_own_vectors(tiny_bert_dir, tmp_path):
    data = _data(tmp_path / "data")
    enc = tt.Encoder.load(str(tiny_bert_dir), precision="fp32")
    res = tt.evaluate(enc, data, metrics=["ndcg@10"])
    assert res.retriever == "dense" and res.metrics == tt.evaluate(str(tiny_bert_dir), data, metrics=["ndcg@10"],
                                                                   precision="fp32").metrics
    ds = tt.load_beir(data)
    ids = list(ds.corpus)
    scores = enc.encode_queries(list(ds.queries.values())) @ enc.encode_documents(list(ds.corpus.values())).T
    run = {q: {ids[j]: float(row[j]) for j in np.argsort(-row)[:10]} for q, row in zip(ds.queries, scores)}
    assert res.metrics["ndcg@10"] == pytest.approx(_ndcg10(ds.qrels, run), abs=1e-5)


def test_one_index_shared_by_threads_gives_the_sequential_answers(tiny_bert_dir, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    index = tt.Index.build(tmp_path / "idx", TINY_CORPUS, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False)
    queries = [q["text"] for q in TINY_QUERIES] * 6
    expected = [[h.id for h in index.search(q, k=4, mode="hybrid")] for q in queries]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda q: [h.id for h in index.search(q, k=4, mode="hybrid")], queries))
    assert got == expected


@pytest.mark.parametrize("perplexity", [0, -1.0, float("nan")])
def test_towers_perplexity_outside_tsnes_range_names_the_option(tmp_path, perplexity):
    from twotower.cli import app

    folder = write_beir(tmp_path / "beir", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    res = CliRunner().invoke(app, ["analyze", "towers", "--data", str(folder), "--perplexity", str(perplexity),
                                   "--out", str(tmp_path / "an"), "--no-progress"])
    assert res.exit_code == 2 and "--perplexity" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "an" / "towers.json").exists()
