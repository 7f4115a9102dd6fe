"""Metadata filters (issue #43): the language's parser and semantics, its vectorised evaluation against the
reference, and filtered search in every local mode against brute force over the matching documents."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import twotower as tt
from twotower.retrieval import filters
from twotower.retrieval.filters.columns import MetadataColumns
from twotower.retrieval.index import filtered

# ------------------------------------------------------------------------------------------------ the parser


@pytest.mark.parametrize("flt, field, words", [
    (3, "filter", "a filter is a JSON object"),
    ("\"tea\"", "filter", "a filter is a JSON object"),
    ([{"a": 1}], "filter", "a filter is a JSON object"),
    ({"year": {"$gtx": 3}}, "year.$gtx", "unknown operator '$gtx'"),
    ({"$nor": {"a": 1}}, "$nor", "unknown operator '$nor'"),
    ({"$not": {}}, "$not", "non-empty filter object"), ({"$text": {"$contains": 3}}, "$text.$contains", "non-empty"),
    ({"tag": {"$in": "tea"}}, "tag.$in", "$in takes a list"),
    ({"tag": {"$nin": 3}}, "tag.$nin", "$nin takes a list"),
    ({"$and": []}, "$and", "non-empty list"),
    ({"$or": {"a": 1}}, "$or", "non-empty list"),
    ({"$or": [{"a": 1}, "b"]}, "$or[1]", "a filter is a JSON object"),
    ({"a": {"$exists": 1}}, "a.$exists", "true or false"),
    ({"a": {"$gt": True}}, "a.$gt", "a number or a string"),
    ({"a": {"$lt": None}}, "a.$lt", "a number or a string"),
    ({"a": {"$gte": [1, 2]}}, "a.$gte", "a number or a string"),
    ({"a": float("nan")}, "a.$eq", "not finite"),
    ({"a": {"$lt": float("inf")}}, "a.$lt", "not finite"),
    ({"a": {"$in": [1, float("-inf")]}}, "a.$in[1]", "not finite"),
    ({"a": [1, 2]}, "a.$eq", "compares with a list"),
    ({"a": {"$ne": {"b": 1}}}, "a.$ne", "compares with an object"),
    ({"a": {"b": 1}}, "a.b", "not an operator"),
    ({"a..b": 1}, "a..b", "empty segment"),
    ({"a": {}}, "a", "empty object"),
    ({"a": {"$eq": {1, 2}}}, "a.$eq", "not JSON"),
    # one null rule on every backend (issue #55): comparing with null is refused; $exists finds a missing field
    ({"none": None}, "none.$eq", "compares with null"), ({"a": {"$ne": None}}, "a.$ne", "compares with null"),
    ({"a": {"$in": ["x", None]}}, "a.$in", "compares with null"),
    ({"$or": [{"b": 1}, {"a": {"$nin": [None]}}]}, "a.$nin", "compares with null"),
])
def test_bad_filters_name_the_field_or_operator(flt, field, words):
    with pytest.raises(tt.DataError) as err:
        tt.parse_filter(flt)
    assert err.value.field == field and words in str(err.value)


def test_filter_json_text_and_empty_filters():
    assert tt.parse_filter('{"a": {"$gte": 2}}') == tt.parse_filter({"a": {"$gte": 2}})
    assert tt.parse_filter(None).empty and tt.parse_filter({}).empty and not tt.parse_filter({"a": 1}).empty
    with pytest.raises(tt.DataError, match="not JSON"):
        tt.parse_filter("{a: 1}")


DOC = {"src": "wiki", "year": 2020, "score_x": 0.5, "ok": True, "none": None, "tags": ["tea", "green", 3],
       "author": {"name": "Ann", "age": 41}, "title_len": "long", "empty": []}

# (filter, expected on DOC), each worked out by hand from the module docstring's rules
HAND = [
    ({"src": "wiki"}, True), ({"src": "Wiki"}, False), ({"src": {"$ne": "web"}}, True),
    ({"year": 2020}, True), ({"year": 2020.0}, True), ({"year": "2020"}, False),
    ({"year": {"$gt": 2019, "$lte": 2020}}, True), ({"year": {"$gt": 2020}}, False),
    ({"year": {"$gte": "2000"}}, False),  # string vs number: no match, no error
    ({"title_len": {"$gt": 3}}, False), ({"title_len": {"$gt": "l"}}, True), ({"title_len": {"$lt": "long"}}, False),
    ({"ok": True}, True), ({"ok": 1}, False), ({"ok": {"$ne": 1}}, True),  # bool is not a number
    ({"none": {"$exists": True}}, True), ({"none": {"$ne": 1}}, True),
    ({"missing": {"$ne": 1}}, False), ({"missing": {"$nin": [1]}}, False), ({"missing": {"$exists": False}}, True),
    ({"src": {"$exists": False}}, False),
    ({"tags": "tea"}, True), ({"tags": 3}, True), ({"tags": "3"}, False), ({"tags": {"$ne": "tea"}}, False),
    ({"tags": {"$nin": ["black", "oolong"]}}, True), ({"tags": {"$in": ["black", "green"]}}, True),
    ({"tags": {"$gt": 2}}, True), ({"tags": {"$gt": "u"}}, False), ({"empty": {"$ne": 1}}, True),
    ({"empty": {"$in": [1]}}, False),
    ({"author.name": "Ann"}, True), ({"author.age": {"$lt": 40}}, False), ({"author": "Ann"}, False),
    ({"author": {"$ne": "Ann"}}, True), ({"author.name.first": "Ann"}, False), ({"tags.x": 1}, False),
    ({"src": {"$in": []}}, False), ({"src": {"$nin": []}}, True),
    ({"$or": [{"src": "web"}, {"year": 2020}]}, True), ({"$and": [{"src": "wiki"}, {"year": 1}]}, False),
    ({"$or": [{"$and": [{"src": "wiki"}, {"ok": False}]}, {"author.age": 41}]}, True),
    ({"src": "wiki", "ok": False}, False),
]


@pytest.mark.parametrize("flt, expected", HAND)
def test_matches_hand_computed_cases(flt, expected):
    assert tt.parse_filter(flt).matches(DOC) is expected
    cols = MetadataColumns([DOC, {}, {"src": 1}], 3)  # the vectorised form agrees, and leaves the others alone
    assert tt.parse_filter(flt).mask(cols).tolist() == [expected, *(tt.parse_filter(flt).matches(m)
                                                                   for m in ({}, {"src": 1}))]


# ------------------------------------------------------------------------ vectorised == reference, randomised

KEYS = ["a", "b", "metadata"]  # a nested "metadata" key: the cut of docs.jsonl lines must find the outer one
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, -1.5, 2.0]),
                    st.sampled_from(["", "x", "y", "xy", "é", "Z"]))
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.dictionaries(st.sampled_from(KEYS), st.one_of(scalars, st.lists(scalars, max_size=2)),
                                   max_size=2))
metadata = st.dictionaries(st.sampled_from(KEYS), values, max_size=3)
paths = st.sampled_from(["a", "b", "c", "a.b", "b.metadata", "a.a", "metadata", "metadata.a"])
comparable = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0]), st.sampled_from(["", "x", "xy", "y", "Z"]))
not_null = st.one_of(st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, -1.5, 2.0]),
                    st.sampled_from(["", "x", "y", "xy", "é", "Z"]))  # a filter compares with no null
conditions = st.one_of(
    st.builds(lambda p, v: {p: v}, paths, not_null),
    st.builds(lambda p, o, v: {p: {o: v}}, paths, st.sampled_from(["$eq", "$ne"]), not_null),
    st.builds(lambda p, o, v: {p: {o: v}}, paths, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), comparable),
    st.builds(lambda p, o, v: {p: {o: v}}, paths, st.sampled_from(["$in", "$nin"]), st.lists(not_null, max_size=3)),
    st.builds(lambda p, v: {p: {"$exists": v}}, paths, st.booleans()),
)
filters_st = st.recursive(conditions, lambda inner: st.one_of(
    st.builds(lambda xs: {"$and": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda xs: {"$or": xs}, st.lists(inner, min_size=1, max_size=3))), max_leaves=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(metadata, min_size=1, max_size=12), filters_st)
def test_vectorised_mask_equals_matches(docs, flt):
    f = tt.parse_filter(flt)
    lines = [json.dumps({"_id": str(i), "title": "", "text": 'say "metadata": {', **({"metadata": m} if m else {})},
                        ensure_ascii=False) for i, m in enumerate(docs)]
    cols = MetadataColumns.from_docs_jsonl(("\n".join(lines) + "\n").encode(), len(docs))
    assert f.mask(cols).tolist() == [f.matches(m) for m in docs]


# -------------------------------------------------------------------------------------------- searching

WORDS = ["tea", "coffee", "green", "black", "roast", "leaf", "bean", "water", "cup", "brew", "milk", "sugar"]


def _corpus(n: int = 160):
    rng = np.random.default_rng(7)
    texts, metas = [], []
    for i in range(n):
        texts.append(f"doc {i}: " + " ".join(rng.choice(WORDS, size=8)))
        meta = {"i": i, "kind": ["tea", "coffee", "water"][i % 3], "year": 1990 + i % 35,
                "tags": [f"t{i % 5}", f"u{i % 4}"], "src": {"site": "wiki" if i % 2 else "web"}}
        if i % 10 == 0:
            del meta["year"]
        metas.append(meta)
    return texts, metas


FILTERS = [
    {"kind": "tea"},
    {"year": {"$gte": 2000, "$lt": 2010}},
    {"tags": "t2", "src.site": "wiki"},
    {"$or": [{"i": {"$lt": 6}}, {"kind": {"$in": ["water"]}, "year": {"$exists": False}}]},
    {"i": {"$gte": 148}},  # the 12 last documents
]
QUERIES = ["green tea leaf", "black coffee bean roast", "cup of water"]


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    texts, metas = _corpus()
    enc = tt.Encoder.load(str(tiny_bert_dir), device="cpu", precision="fp32")
    index = tt.Index.build(tmp_path_factory.mktemp("f") / "idx", texts, metadatas=metas, encoder=enc, bm25=True,
                           precision="fp32", show_progress=False)
    docs = enc.encode_documents(texts)
    return index, enc, texts, metas, docs


def _matching(metas, flt):
    f = tt.parse_filter(flt)
    return np.array([f.matches(m) for m in metas])


def _dense_reference(q, docs, match, k):
    """(ids by row, scores): brute force over the matching documents only."""
    rows = np.flatnonzero(match)
    s = docs[rows] @ q
    order = np.argsort(-s, kind="stable")[:k]
    return rows[order], s[order]


@pytest.mark.parametrize("force_faiss", [False, True], ids=["exact-subset", "faiss-selector"])
@pytest.mark.parametrize("flt", FILTERS)
def test_filtered_flat_dense_equals_brute_force_over_matching(built, flt, force_faiss, monkeypatch):
    if force_faiss:  # the path large indexes take: FAISS with an ID selector
        monkeypatch.setattr(filtered, "EXACT_ROWS", 0)
        monkeypatch.setattr(filtered, "EXACT_SHARE", 0.0)
    index, enc, texts, metas, docs = built
    match = _matching(metas, flt)
    ids = index.store.doc_ids
    for query, hits in zip(QUERIES, index.search(QUERIES, k=10, mode="dense", filter=flt)):
        rows, scores = _dense_reference(enc.encode_queries([query])[0], docs, match, 10)
        assert len(hits) == min(10, match.sum()) == len(rows)  # never fewer than k when k match
        assert [h.id for h in hits] == [ids[r] for r in rows]
        assert [h.score for h in hits] == pytest.approx(scores.tolist(), abs=1e-5)
        assert all(h.metadata == metas[h.metadata["i"]] for h in hits)


def test_a_filter_on_the_worst_documents_still_fills_k(built):
    """Post-filter truncation (search k, then drop) would return nothing here: the filter keeps only the documents
    the unfiltered search ranks last."""
    index, enc, texts, metas, docs = built
    order = index.search(QUERIES[0], k=len(texts), mode="dense")
    worst = {h.id for h in order[-12:]}
    flt = {"i": {"$in": [metas[index.store.row_of[d]]["i"] for d in worst]}}
    hits = index.search(QUERIES[0], k=10, mode="dense", filter=flt)
    assert len(hits) == 10 and {h.id for h in hits} <= worst
    assert [h.id for h in hits] == [h.id for h in order[-12:]][:10]


def test_filter_is_never_dropped_in_any_mode(built):
    index, *_ , metas, _ = built
    for mode in ("dense", "bm25", "hybrid", "rrf"):
        for flt in FILTERS:
            f = tt.parse_filter(flt)
            for hits in index.search(QUERIES, k=20, mode=mode, filter=flt):
                assert hits and all(f.matches(h.metadata) for h in hits), (mode, flt)
    assert index.search("tea", k=5, filter={"kind": "nothing"}) == []


def _bm25_reference(index, query, match, k):
    """The unfiltered BM25 scores of every document, restricted to the matching ones that match the query."""
    scores, rows = index.store.bm25.search([query], len(index), show_progress=False)
    ranked = [(index.store.doc_ids[r], float(s)) for s, r in zip(scores[0], rows[0]) if s > 0 and match[r]]
    return ranked[:k]


@pytest.mark.parametrize("flt", FILTERS)
def test_filtered_bm25_equals_the_full_scores_over_matching(built, flt):
    index, _, _, metas, _ = built
    match = _matching(metas, flt)
    for query in QUERIES:
        full = dict(_bm25_reference(index, query, match, len(index)))  # every matching document's score
        got = index.search(query, k=10, mode="bm25", filter=flt)
        assert len(got) == min(10, len(full))
        assert [h.score for h in got] == pytest.approx(sorted(full.values(), reverse=True)[:10], rel=1e-6)
        assert [h.score for h in got] == pytest.approx([full[h.id] for h in got], rel=1e-6)  # ties in any order


@pytest.mark.parametrize("mode", ["hybrid", "rrf"])
@pytest.mark.parametrize("flt", FILTERS[:3])
def test_filtered_fusion_fuses_the_filtered_sides(built, flt, mode):
    from twotower.retrieval.hybrid import interpolate, rrf

    index, enc, _, metas, docs = built
    match = _matching(metas, flt)
    ids = index.store.doc_ids
    depth = 100
    for query in QUERIES:
        rows, scores = _dense_reference(enc.encode_queries([query])[0], docs, match, depth)
        dense = {"q": {ids[r]: float(s) for r, s in zip(rows, scores)}}
        bm25 = {"q": dict(_bm25_reference(index, query, match, depth))}
        want = (interpolate(dense, bm25, 0.5, n_best=depth, top_k=10, norm="minmax") if mode == "hybrid"
                else rrf([dense, bm25], n_best=depth, top_k=10))["q"]
        got = index.search(query, k=10, mode=mode, filter=flt)
        assert {h.id: h.score for h in got} == pytest.approx(dict(sorted(want.items(), key=lambda kv: -kv[1])[:10]),
                                                             abs=1e-5)


def test_run_and_searcher_take_the_filter(built):
    index, _, _, metas, _ = built
    flt = FILTERS[1]
    run = index.run({"q1": QUERIES[0]}, k=7, mode="dense", filter=flt)
    assert list(run["q1"]) == [h.id for h in index.search(QUERIES[0], k=7, mode="dense", filter=flt)]
    with pytest.raises(tt.DataError, match="unknown operator"):
        index.search("tea", filter={"i": {"$like": 1}})


def test_prf_feeds_back_from_matching_documents_only(built):
    from twotower.retrieval.prf import rocchio

    index, enc, _, metas, docs = built
    flt = {"kind": "coffee"}
    match = _matching(metas, flt)
    q = enc.encode_queries([QUERIES[0]])[0]
    top, _ = _dense_reference(q, docs, match, 3)
    moved = rocchio(q[None, :], docs[top][None, :, :], 0.5)[0]
    rows, scores = _dense_reference(moved, docs, match, 10)
    hits = index.search(QUERIES[0], k=10, mode="dense", prf_depth=3, prf_weight=0.5, filter=flt)
    assert [h.id for h in hits] == [index.store.doc_ids[r] for r in rows]
    few = index.search(QUERIES[0], k=10, mode="dense", prf_depth=50, filter={"i": {"$lt": 4}})  # 4 to feed back
    assert sorted(h.metadata["i"] for h in few) == [0, 1, 2, 3]


def test_rerank_sees_only_filtered_candidates(built, tiny_ce_dir):
    index, *_ , metas, _ = built
    flt = {"kind": "water"}
    hits = index.search(QUERIES[2], k=5, mode="dense", filter=flt, rerank=str(tiny_ce_dir), rerank_depth=20)
    assert len(hits) == 5 and all(h.metadata["kind"] == "water" for h in hits)
    first_stage = {h.id for h in index.search(QUERIES[2], k=20, mode="dense", filter=flt)}
    assert {h.id for h in hits} <= first_stage


# ------------------------------------------------------------------------------ other kinds and vectors


@pytest.mark.parametrize("vectors", ["fp16", "int8", "binary"])
def test_filtered_compressed_vectors(built, tiny_bert_dir, tmp_path, vectors, monkeypatch):
    _, enc, texts, metas, _ = built
    index = tt.Index.build(tmp_path / vectors, texts, metadatas=metas, encoder=enc, precision="fp32",
                           show_progress=False, vectors=vectors)
    store = index.store
    q = store.project_queries(enc.encode_queries(QUERIES))
    for flt in FILTERS:
        match = _matching(metas, flt)
        want = min(10, match.sum())
        exact_scores, exact_rows = filtered.exact(store, q, 10, np.flatnonzero(match))
        for force in (False, True):
            if force:
                monkeypatch.setattr(filtered, "EXACT_ROWS", 0)
                monkeypatch.setattr(filtered, "EXACT_SHARE", 0.0)
            for hits, rows in zip(index.search(QUERIES, k=10, filter=flt, mode="dense"), exact_rows):
                assert len(hits) == want and all(match[store.row_of[h.id]] for h in hits)
                if vectors != "binary":  # flat fp16 / int8: exact over the matching rows
                    assert [h.id for h in hits] == [store.doc_ids[r] for r in rows[:want]]


@pytest.mark.parametrize("kind, options", [("hnsw", {"hnsw_m": 8}), ("ivf", {"nlist": 8})])
def test_filtered_ann_recall(built, tmp_path, monkeypatch, kind, options):
    """HNSW (M=8) / IVF (8 lists): the widened, selector-restricted search against exact filtered search; recall@10
    over 3 queries × 5 filters must reach 0.9 or the unfiltered search's own recall at the default breadth
    (IVF's nprobe 1 of 8 lists), whichever is lower: the widening makes up for the filter (a tiny index: the
    benchmark measures recall at scale)."""
    _, enc, texts, metas, docs = built
    index = tt.Index.build(tmp_path / kind, texts, metadatas=metas, encoder=enc, precision="fp32", kind=kind,
                           show_progress=False, **options)
    monkeypatch.setattr(filtered, "EXACT_ROWS", 0)
    monkeypatch.setattr(filtered, "EXACT_SHARE", 0.0)
    found = total = 0
    for flt in FILTERS:
        match = _matching(metas, flt)
        for query, hits in zip(QUERIES, index.search(QUERIES, k=10, filter=flt)):
            rows, _ = _dense_reference(enc.encode_queries([query])[0], docs, match, 10)
            assert len(hits) == len(rows) and all(match[index.store.row_of[h.id]] for h in hits)
            found += len({h.id for h in hits} & {index.store.doc_ids[r] for r in rows})
            total += len(rows)
    plain = 0  # the same index unfiltered, against exact search: the breadth's own recall
    for query, hits in zip(QUERIES, index.search(QUERIES, k=10)):
        rows, _ = _dense_reference(enc.encode_queries([query])[0], docs, np.ones(len(docs), dtype=bool), 10)
        plain += len({h.id for h in hits} & {index.store.doc_ids[r] for r in rows})
    assert found / total >= min(0.9, plain / (10 * len(QUERIES))), (found / total, plain / (10 * len(QUERIES)))
    # the widening rule itself: a filter letting 10% through searches 10× as broadly, from at least
    # FILTERED_EF_BASE when no ef_search is given (efSearch 32 → 320; nprobe 1 → all 8 lists)
    store = index.store
    params = filtered._params(store, store.faiss_index, filtered._selector(np.ones(len(store), dtype=bool)), None,
                              None, 0.1)
    params = getattr(params, "index_params", None) or params
    assert (params.efSearch == 10 * filtered.FILTERED_EF_BASE == 320) if kind == "hnsw" else (params.nprobe == 8)
    if kind == "hnsw":  # a given ef_search is the base
        given = filtered._params(store, store.faiss_index, filtered._selector(np.ones(len(store), dtype=bool)), 20,
                                 None, 0.1)
        assert (getattr(given, "index_params", None) or given).efSearch == 200


def test_filtered_multivector_equals_maxsim_brute_force(built, tiny_bert_dir, tmp_path, monkeypatch):
    _, enc, texts, metas, _ = built
    index = tt.Index.build(tmp_path / "mv", texts, metadatas=metas, encoder=enc, precision="fp32", multivector=3,
                           show_progress=False)
    store = index.store
    vectors, offsets = np.asarray(store.vectors), store.offsets
    q = store.project_queries(index._searcher.encode_queries(QUERIES))
    for force in (False, True):
        if force:
            monkeypatch.setattr(filtered, "EXACT_ROWS", 0)
            monkeypatch.setattr(filtered, "EXACT_SHARE", 0.0)
        for flt in FILTERS:
            match = _matching(metas, flt)
            for qv, hits in zip(q, index.search(QUERIES, k=10, filter=flt, mode="dense")):
                best = np.array([(vectors[offsets[r]:offsets[r + 1]] @ qv).max() if match[r] else -np.inf
                                 for r in range(len(store))])
                order = np.argsort(-best, kind="stable")[: min(10, match.sum())]
                assert [h.id for h in hits] == [store.doc_ids[r] for r in order]
                assert [h.score for h in hits] == pytest.approx(best[order].tolist(), abs=1e-5)


# ------------------------------------------------------------------------------------------- Milvus translation

MILVUS_DOCS = [
    {"src": "wiki", "year": 2020, "ok": True, "tags": ["tea", "green", 3], "author": {"name": "Ann", "age": 41},
     "title_len": "long", "q": 'say "hi"\\'},
    {}, {"src": 1}, {"src": "web", "year": 1999.5, "tags": "tea"}, {"tags": [], "year": "2000"},
    {"ok": False, "src": 'w"eb', "author": {"name": "Bo"}}, {"src": "wiki", "year": 2001, "tags": ["black"]},
]
MILVUS_FILTERS = [
    {"src": "wiki"}, {"src": {"$ne": "web"}}, {"year": {"$gt": 2000}}, {"year": {"$gte": "2000"}}, {"year": 2020.0},
    {"ok": True}, {"ok": {"$ne": False}}, {"tags": "tea"}, {"tags": 3}, {"tags": "3"},
    {"tags": {"$in": ["green", "black"]}}, {"tags": {"$nin": ["tea"]}}, {"author.name": "Ann"},
    {"author.age": {"$lt": 50}}, {"author.age": {"$exists": False}}, {"src": {"$exists": True}}, {"src": {"$in": []}},
    {"src": {"$nin": []}}, {"title_len": {"$gt": 3}}, {"q": 'say "hi"\\'}, {"src": 'w"eb'},
    {"$or": [{"src": "web"}, {"ok": False}]}, {"$and": [{"src": "wiki"}, {"year": {"$lte": 2001}}], "ok": True},
]


def test_milvus_expression_selects_what_matches_selects(tmp_path):
    """The translation, run by the real Milvus Lite over a JSON field, selects exactly the documents
    :meth:`Filter.matches` does (outside the differences the docstring of ``to_milvus_expr`` states)."""
    pytest.importorskip("milvus_lite")
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(str(tmp_path / "f.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("pk", DataType.INT64, is_primary=True)
    schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)
    schema.add_field("metadata", DataType.JSON)
    params = client.prepare_index_params()
    params.add_index("v", index_type="FLAT", metric_type="IP")
    client.create_collection("f", schema=schema, index_params=params)
    client.insert("f", [{"pk": i, "v": [1.0, 0.0], "metadata": m} for i, m in enumerate(MILVUS_DOCS)])
    client.load_collection("f")
    for flt in MILVUS_FILTERS:
        want = [i for i, m in enumerate(MILVUS_DOCS) if tt.parse_filter(flt).matches(m)]
        got = sorted(r["pk"] for r in client.query("f", filter=filters.to_milvus_expr(flt), output_fields=["pk"]))
        assert got == want, (flt, filters.to_milvus_expr(flt))
    client.close()
    assert filters.to_milvus_expr({}) == ""
    with pytest.raises(tt.DataError, match="null") as err:
        filters.to_milvus_expr({"a": {"$in": ["x", None]}})
    assert err.value.field == "a.$in"
