"""Hardening, round 6 (issue #71, items 3 and 5): no bound on ``k`` and the search breadths (a ``k`` of 2**31 - 1
asked numpy for 8 GiB, an ``ef_search`` as large ran for tens of seconds), and raw errors or silent readings from the
store methods: whole floats for counts, non-bools for flags, ``unset`` keys that are not strings, ids given twice
to one write, an empty ``passage_score``, complex vectors, and ``--metadata`` JSON too deep or with too long a
number. Each on every surface that takes it: Python, the command line, the HTTP service."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
from typer.testing import CliRunner

import twotower as tt
from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, flat_index, serve_client, write_beir
from surfaces import cli_message
from twotower.cli import app

KEY = "0123456789abcdef0123"
BIG = 2**31 - 1
FAST_S = 10.0  # a search cut to 6 documents answers in well under a second; unbounded, these took 40 s or more


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert_dir):
    """The tiny corpus with metadata (year, tag), a flat index with BM25, built once."""
    root = tmp_path_factory.mktemp("round6")
    corpus = [dict(d, year=2018 + i, tag=["tea", "coffee"][i % 2]) for i, d in enumerate(TINY_CORPUS)]
    data = write_beir(root / "tiny", corpus, TINY_QUERIES, TINY_QRELS)
    return flat_index(data, tiny_bert_dir, root / "index")


@pytest.fixture()
def index(built, tmp_path):
    shutil.copytree(built, tmp_path / "index")
    return tt.Index.open(tmp_path / "index", precision="fp32")


def _vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def _quick(call):
    start = time.perf_counter()
    out = call()
    assert time.perf_counter() - start < FAST_S
    return out


# ------------------------------------------------------------------------------------------------ item 3: k


@pytest.mark.parametrize("k", [BIG, 10**8])
def test_a_huge_k_is_cut_to_the_documents_on_every_python_path(index, k):
    for mode in ("dense", "bm25", "hybrid", "rrf"):
        hits = _quick(lambda mode=mode: index.search("green tea leaves", k=k, mode=mode))
        assert 1 <= len(hits) <= 6 and len({h.id for h in hits}) == len(hits), mode
    assert len(_quick(lambda: index.search("tea", k=k))) == 6
    assert [h.id for h in _quick(lambda: index.search("tea", k=k, filter={"tag": "tea"}))] != []
    assert len(_quick(lambda: index.search(["tea", "dogs"], k=np.int64(k)))) == 2
    run = _quick(lambda: index.run({"q1": "green tea", "q2": "cats"}, k=k))
    assert [len(v) for v in run.values()] == [6, 6]
    # below the API: the searcher and the store
    store = index.store
    scores, rows = _quick(lambda: store.search(np.ones((1, store.dim), dtype=np.float32), k))
    assert scores.shape == rows.shape == (1, 6) and sorted(rows[0].tolist()) == list(range(6))
    assert len(_quick(lambda: index._searcher.search("tea", k))) == 6


def test_a_huge_k_and_rerank_depth_with_a_reranker(index, tiny_ce_dir):
    hits = _quick(lambda: index.search("green tea", k=BIG, rerank=str(tiny_ce_dir), rerank_depth=BIG))
    assert len(hits) == 6


def test_a_huge_top_k_on_the_command_line_and_over_http(built):
    res = CliRunner().invoke(app, ["search", "green tea", "--index", str(built), "--top-k", str(BIG), "--json"])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert len([line for line in res.output.splitlines() if line.startswith("{")]) == 6
    printed = cli_message("search", "green tea", "--index", built, "--top-k", str(2**63))  # past any count
    assert "--top-k" in printed and "at most 2147483647" in printed
    client = serve_client(built, KEY)
    answer = client.post("/search", json={"query": "green tea", "k": 1000})  # the service's own limit, max_k
    assert answer.status_code == 200 and len(answer.json()["hits"]) == 6
    assert client.post("/search", json={"query": "green tea", "k": BIG}).status_code == 422


def test_a_huge_prf_depth_is_refused_before_any_search(index):
    with pytest.raises(tt.TwoTowerError, match=r"^prf_depth=2147483647: the index holds only 6 documents"):
        _quick(lambda: index.search("tea", prf_depth=BIG))
    # under a filter, feedback comes from the matching documents, as many as there are (as before)
    assert _quick(lambda: index.search("tea", k=3, prf_depth=BIG, filter={"tag": "tea"}))
    assert len(index.search("tea", k=6, prf_depth=6)) == 6  # every document: still answered


@pytest.mark.parametrize("kind, options, knob", [("hnsw", {"hnsw_m": 8}, "ef_search"), ("ivf", {"nlist": 2}, "nprobe")])
def test_huge_search_breadths_are_cut_and_rank_as_the_exact_search(tmp_path, kind, options, knob):
    vecs = _vectors(80)
    docs = [f"document {i}" for i in range(80)]
    exact = tt.Index.build(tmp_path / "flat", docs, vectors=vecs, show_progress=False)
    approx = tt.Index.build(tmp_path / kind, docs, vectors=vecs, kind=kind, show_progress=False, **options)
    q = _vectors(1, seed=1)[0]
    want = [h.id for h in exact.search(query_vector=q, k=10)]
    got = _quick(lambda: approx.search(query_vector=q, k=BIG, **{knob: BIG}))
    assert [h.id for h in got[:10]] == want


# ------------------------------------------------------------------------------------------------ item 5: counts


def test_list_and_get_take_whole_floats_and_refuse_the_rest(index):
    assert index.list(offset=1.0).ids == index.list(offset=1).ids
    assert index.list(limit=2.0).ids == index.list(limit=2).ids == ["d1", "d2"]
    assert [d.id for d in index.get(limit=2.0)] == ["d1", "d2"]
    assert [d.id for d in index.get(filter={"tag": "tea"}, limit=np.int64(1))] == ["d1"]
    for call, name in ((lambda: index.list(offset=1.5), "offset"), (lambda: index.list(limit=2.5), "limit"),
                       (lambda: index.get(limit=0.5), "limit"), (lambda: index.list(offset=True), "offset"),
                       (lambda: index.list(limit=False), "limit"), (lambda: index.get(limit="2"), "limit"),
                       (lambda: index.list(offset=float("nan")), "offset")):
        with pytest.raises(tt.TwoTowerError, match=f"^{name}="):
            call()


# ------------------------------------------------------------------------------------------------ item 5: bools


@pytest.mark.parametrize("value", ["no", "false", 0, 1, None, [], "True"])
def test_flags_of_the_index_methods_must_be_bools(index, tmp_path, value):
    calls = {
        "documents": lambda: index.list(documents=value),
        "merge": lambda: index.update(["d1"], metadata={"x": 1}, merge=value),
        "replace": lambda: index.add(["new text"], replace=value),
        "show_progress": lambda: index.add(["new text"], show_progress=value),
        "compile": lambda: index.add(["new text"], compile=value),
        "verify": lambda: tt.Index.open(index.path, verify=value),
    }
    version = index.info()["live_version"]
    for name, call in calls.items():
        with pytest.raises(tt.TwoTowerError, match=f"^{name}: True or False is needed"):
            call()
    for name in ("bm25", "bigrams", "compile", "show_progress", "ray"):
        if name == "bm25" and value is None:  # bm25: bool | None, None its default (on)
            continue
        needed = "True, False or a tt.Ray" if name == "ray" else "True or False is needed"  # ray: or its spec
        with pytest.raises(tt.TwoTowerError, match=f"^{name}: {needed}"):
            tt.Index.build(tmp_path / f"new-{name}", ["a text"], vectors=_vectors(1), **{name: value})
        assert not (tmp_path / f"new-{name}").exists()  # refused before anything was written
    assert index.info()["live_version"] == version and len(index) == 6
    assert index.get(["d1"])[0].metadata.get("x") is None


def test_numpy_bools_are_bools_and_other_api_flags_are_checked_too(index, tiny_bert_dir):
    assert index.list(documents=np.False_).documents == []
    assert index.list(documents=np.True_).documents
    assert index.update(["d1"], metadata={"x": 1}, merge=np.bool_(True)) == ["d1"]
    encoder = tt.Encoder.load(str(tiny_bert_dir))
    with pytest.raises(tt.TwoTowerError, match="^show_progress: True or False"):
        encoder.encode_queries(["tea"], show_progress="no")
    with pytest.raises(tt.TwoTowerError, match="^strict: True or False"):
        tt.Dataset.from_lists(["a"], ["q"], {"q0": {"d0": 1}}, strict="no")


# ------------------------------------------------------------------------------------------------ item 5: unset


@pytest.mark.parametrize("unset, shown", [([["a"]], "['a'] is a list"), ([1], "1 is a int"),
                                          ([None], "None is a NoneType"), ({"a": 1}, "not a dict"),
                                          (5, "not a int")])
def test_unset_keys_must_be_strings_whatever_the_documents_hold(index, tmp_path, unset, shown):
    version = index.info()["live_version"]
    for call in (lambda: index.update(["d1"], unset=unset),
                 lambda: index.update(filter={"tag": "none such"}, unset=unset),  # nothing selected: still refused
                 lambda: index.update(["d2"], metadata={"x": 1}, unset=unset)):
        with pytest.raises(tt.TwoTowerError, match="^unset") as err:
            call()
        assert shown in str(err.value)
    assert index.info()["live_version"] == version
    bare = tt.Index.build(tmp_path / "bare", ["one", "two"], vectors=_vectors(2), show_progress=False)  # no metadata
    with pytest.raises(tt.TwoTowerError, match=r"^unset: .*\['a'\] is a list"):
        bare.update(bare.added_ids[:1], unset=[["a"]])
    assert index.update(["d1"], unset=("year",)) == ["d1"] and "year" not in index.get(["d1"])[0].metadata


# ------------------------------------------------------------------------------------------------ item 5: ids twice


def test_an_id_given_twice_to_a_write_is_refused_naming_it(index, built):
    version = index.info()["live_version"]
    for call in (lambda: index.update(["d1", "d2", "d1"], metadata=[{"m": 1}, {"m": 2}, {"m": 3}]),
                 lambda: index.update(["d1", "d1"], metadata={"m": 1}),
                 lambda: index.update(["d1", "d1"], unset=["year"]),
                 lambda: index.delete(["d3", "d3"]),
                 lambda: index.delete(["d3", "d3"], filter={"tag": "tea"})):
        with pytest.raises(tt.TwoTowerError, match="^ids: 'd[13]' is given more than once"):
            call()
    assert index.info()["live_version"] == version and len(index) == 6
    assert index.delete(["d3"]) == ["d3"] and index.update(["d1", "d2"], metadata={"m": 1}) == ["d1", "d2"]
    # the command line and the service share the rule
    printed = cli_message("index", "delete", "--index", index.path, "d1", "d1")
    assert "'d1' is given more than once" in printed
    client = serve_client(index.path, KEY)
    key = {"X-API-Key": KEY}
    res = client.patch("/documents", json={"ids": ["d1", "d1"], "metadata": [{"m": 1}, {"m": 2}]}, headers=key)
    assert res.status_code == 400 and "'d1' is given more than once" in res.text, res.text
    res = client.post("/documents/delete", json={"ids": ["d2", "d2"], "filter": {"tag": "coffee"}}, headers=key)
    assert res.status_code == 400 and "'d2' is given more than once" in res.text, res.text


# ------------------------------------------------------------------------------------------------ item 5: passage_score


@pytest.mark.parametrize("score", ["", "MAX", " max", 0, "mean"])
def test_passage_score_is_max_or_first_only(tmp_path, tiny_bert_dir, score):
    with pytest.raises(tt.TwoTowerError, match="passage_score"):
        tt.Index.build(tmp_path / "i", ["a short text"], encoder=str(tiny_bert_dir), passage_score=score,
                       show_progress=False)
    built = tt.Index.build(tmp_path / "ok", ["a short text"], encoder=str(tiny_bert_dir), passage_score="first",
                           show_progress=False)
    assert built.info()["passages"]["score"] == "first"


# ------------------------------------------------------------------------------------------------ item 5: complex vectors


@pytest.mark.parametrize("bad, what", [
    (_vectors(2, dim=2) + 1j, "complex numbers"), (_vectors(2, dim=2).astype(np.complex64), "complex numbers"),
    ([[1 + 2j, 0.5], [0.5, 1.0]], "complex numbers"), (np.array([[1.0, 2j], [1, 2]], dtype=object), "complex numbers"),
    (np.ones((2, 2), dtype=bool), "found a bool"), ([["1.5", "2"], ["3", "4"]], "found a str"),
])
def test_vectors_that_a_float32_cast_would_change_are_refused(tmp_path, bad, what):
    with pytest.raises(tt.TwoTowerError, match=f"^vectors: .*{what}"):
        tt.Index.build(tmp_path / "i", ["one", "two"], vectors=bad, show_progress=False)
    assert not (tmp_path / "i").exists()
    index = tt.Index.build(tmp_path / "ok", ["one", "two"], vectors=_vectors(2, dim=2), show_progress=False)
    query = np.asarray(bad)[0]  # one vector of the same kind
    with pytest.raises(tt.TwoTowerError, match=f"^query_vector: .*{what}"):
        index.search(query_vector=query, k=1)
    with pytest.raises(tt.TwoTowerError, match=f"^vectors: .*{what}"):
        index.add(["three", "four"], vectors=bad)
    assert len(index) == 2
    assert index.search(query_vector=[1, 2], k=1)  # whole numbers are numbers


def test_an_embedding_that_returns_complex_vectors_is_refused(tmp_path):
    def complex_embedding(texts):
        return _vectors(len(texts)) * (1 + 1j)

    with pytest.raises(tt.TwoTowerError, match=r"^embedding .* of 2 documents: complex numbers \(complex64\)"):
        tt.Index.build(tmp_path / "i", ["one", "two"], embedding=complex_embedding, show_progress=False)


# ------------------------------------------------------------------------------------------------ item 5: --metadata JSON


def test_metadata_json_too_deep_or_with_too_long_a_number_is_named(index):
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    long_number = '{"a": ' + "9" * 5000 + "}"
    for text, words in ((deep, "nested too deep"), (long_number, "more than 4,300 digits"),
                        ('{"a": [' + "[" * 40 + "]" * 40 + "]}", "deeper than 32 levels")):
        printed = cli_message("index", "update", "--index", index.path, "d1", "--metadata", text)
        assert "--metadata" in printed and words in printed, printed
        assert "set_int_max_str_digits" not in printed
    # the service reads its bodies with the same care (a 4xx, no traceback, no Python advice)
    client = serve_client(index.path, KEY)
    key = {"X-API-Key": KEY, "content-type": "application/json"}
    for text, words in ((deep, "deeper than JSON reading allows"), (long_number, "more than 4,300 digits")):
        res = client.patch("/documents", content=('{"ids": ["d1"], "metadata": ' + text + "}").encode(), headers=key)
        assert res.status_code in (400, 422) and words in res.text, res.text
        assert "set_int_max_str_digits" not in res.text
    assert index.get(["d1"])[0].metadata == {"year": 2018, "tag": "tea"}


# ------------------------------------------------------------------------------------------------ integrations


def test_langchain_similarity_search_with_a_huge_k_answers_at_once(tmp_path):
    pytest.importorskip("langchain_core")
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from twotower.integrations.langchain import TwoTowerVectorStore

    store = TwoTowerVectorStore.from_texts(["tea", "coffee", "cats"], DeterministicFakeEmbedding(size=8),
                                           path=tmp_path / "s")
    assert len(_quick(lambda: store.similarity_search("tea", k=BIG))) == 3


def test_llama_index_query_with_a_huge_top_k_answers_at_once():
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from twotower.integrations.llama_index import TwoTowerVectorStore

    store = TwoTowerVectorStore()
    store.add([TextNode(text=f"note {i}", id_=f"n{i}", embedding=[1.0, float(i)]) for i in range(3)])
    found = _quick(lambda: store.query(VectorStoreQuery(query_embedding=[1.0, 1.0], similarity_top_k=BIG)))
    assert sorted(found.ids) == ["n0", "n1", "n2"]


@pytest.mark.parametrize("value, words", [("[" * 5000 + "]" * 5000, "JSON nested too deeply"),
                                          ("7" * 5000, "a number too long to read")])
def test_a_corpus_line_too_deep_or_with_too_long_a_number_names_its_line(tmp_path, value, words):
    from twotower.data.beir import load_corpus

    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "ok", "text": "fine"}\n{"_id": "a", "text": "x", "m": ' + value + "}\n")
    with pytest.raises(tt.DataError, match=f"line 2: {words}") as err:
        load_corpus(path)
    assert "set_int_max_str_digits" not in str(err.value)


def test_a_text_over_the_shared_limit_is_refused_but_metadata_keeps_its_own_limit(tmp_path):
    from twotower.api.dataset import corpus_documents
    from twotower.data.ids import MAX_TEXT_CHARS

    with pytest.raises(tt.DataError, match=f"over the limit of {MAX_TEXT_CHARS:,} for one text"):
        corpus_documents(["x" * (MAX_TEXT_CHARS + 1)])
    with pytest.raises(tt.DataError, match="64 KiB"):  # metadata strings: the metadata rule names itself
        corpus_documents(["ok"], metadatas=[{"blob": "x" * (MAX_TEXT_CHARS + 1)}])


VACUOUS = [None, {}, {"$and": [{}]}, {"$or": [{}, {"kind": "a"}]}, {"$and": [{"$and": [{}]}, {}]}]


@pytest.mark.parametrize("flt", VACUOUS)
def test_an_empty_filter_writes_nothing_on_any_surface_without_an_explicit_all(index, flt):
    """One rule (issue #70): a delete or update whose filter lets everything through by its form is refused — in
    Python, on the command line and over HTTP — and 'all' takes an explicit flag."""
    n = len(index)
    with pytest.raises(tt.TwoTowerError, match="delete needs ids or a non-empty filter"):
        index.delete(filter=flt)
    with pytest.raises(tt.TwoTowerError, match="all_documents=True"):
        index.update(filter=flt, metadata={"seen": 1})
    if flt is not None:
        import json

        printed = cli_message("index", "update", "--index", index.path, "--filter", json.dumps(flt), "--metadata",
                              '{"seen": 1}')
        assert "--all" in printed
        client = serve_client(index.path, "round6-key-0123456789")
        headers = {"X-API-Key": "round6-key-0123456789"}
        assert client.post("/documents/delete", json={"filter": flt}, headers=headers).status_code in (400, 422)
        assert client.patch("/documents", json={"filter": flt, "metadata": {"seen": 1}},
                            headers=headers).status_code in (400, 422)
    assert len(index) == n and all("seen" not in d.metadata for d in index.get())
    changed = index.update(filter=flt, metadata={"seen": 1}, all_documents=True)
    assert len(changed) == n and all(d.metadata["seen"] == 1 for d in index.get())
