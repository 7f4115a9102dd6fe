"""Filters on the Milvus backend under hostile input (issue #55), against the real Milvus Lite and the local index
over the same documents: range operators at the bound, field names holding ``"`` or ``\\``, keys written to look like
expression syntax, string values with control characters, and the filter limits, all answered as the local index
answers them; numbers beyond float range, lone surrogates and comparing with null refused alike on both backends,
when filtering and when writing; a metadata ``True`` comes back as ``True``."""

from __future__ import annotations

import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

import twotower as tt  # noqa: E402
from twotower.retrieval.filters.checks import MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_FILTER_VALUES  # noqa: E402

QUOTE, BACKSLASH = 'k"q', "k\\b"
LOOKS_LIKE_SYNTAX = 'x"] == 1 or exists metadata["year'  # a key that, pasted unescaped, would select other documents
CONTROL = "a\x01b\x07\x1f\x7f c"  # control characters Milvus has no escape for: sent as they are
ESCAPED = 'line\nnext\ttab\rret "q" \\ end'  # the characters Milvus escapes


def _corpus() -> list[dict]:
    texts = ["Green tea is steamed.", "Black tea is oxidised.", "Coffee is roasted.", "Milk is added to tea.",
             "Water boils at one hundred degrees.", "Oolong tea is partly oxidised.", "Mate is a tea of leaves."]
    meta = [{"year": 2019, QUOTE: 1, "flag": True}, {"year": 2020, BACKSLASH: 2, "flag": False},
            {"year": 2021, "s": CONTROL}, {"year": 2020.0, LOOKS_LIKE_SYNTAX: 1, "s": ESCAPED},
            {"year": 2018, QUOTE: 3}, {"s": "plain", BACKSLASH: 1}, {"year": 2022, "nested": {QUOTE: "v"}}]
    return [{"_id": f"d{i}", "text": t, **m} for i, (t, m) in enumerate(zip(texts, meta))]


@pytest.fixture(scope="module")
def pair(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("milvushard")
    common = dict(encoder=str(tiny_bert_dir), precision="fp32", show_progress=False)
    local = tt.Index.build(root / "local", _corpus(), **common)
    milvus = tt.Index.build(root / "mil", _corpus(), backend="milvus", uri=str(root / "m.db"), collection="hard",
                            **common)
    return local, milvus


def _ids(index, flt) -> list[str]:
    return sorted(h.id for h in index.search("tea", k=20, filter=flt))


def _same(pair, flt, expected: list[str] | None = None) -> None:
    local, milvus = pair
    want = _ids(local, flt)
    assert _ids(milvus, flt) == want, flt
    if expected is not None:
        assert want == expected, flt


@pytest.mark.parametrize("op, expected", [("$lte", ["d0", "d1", "d3", "d4"]), ("$gte", ["d1", "d2", "d3", "d6"]),
                                          ("$lt", ["d0", "d4"]), ("$gt", ["d2", "d6"])])
def test_ranges_at_the_bound_equal_the_local_index(pair, op, expected):
    # year 2020 (and 2020.0): $lte / $gte include it, $lt / $gt leave it out, by hand; Milvus answers the same
    _same(pair, {"year": {op: 2020}}, expected)
    _same(pair, {"year": {op: 2020.0}}, expected)


def test_field_names_with_quotes_and_backslashes(pair):
    _same(pair, {QUOTE: 1}, ["d0"])
    _same(pair, {QUOTE: {"$exists": True}}, ["d0", "d4"])
    _same(pair, {BACKSLASH: {"$in": [1, 2]}}, ["d1", "d5"])
    _same(pair, {BACKSLASH: {"$gte": 2}}, ["d1"])
    _same(pair, {f"nested.{QUOTE}": "v"}, ["d6"])
    # a key written to look like expression syntax selects the one document that has it, never errors
    _same(pair, {LOOKS_LIKE_SYNTAX: 1}, ["d3"])
    _same(pair, {LOOKS_LIKE_SYNTAX: {"$exists": False}}, ["d0", "d1", "d2", "d4", "d5", "d6"])
    _same(pair, {'x"] or metadata["year': {"$exists": True}}, [])


def test_strings_with_control_characters_are_escaped_or_sent_as_they_are(pair):
    _same(pair, {"s": CONTROL}, ["d2"])
    _same(pair, {"s": ESCAPED}, ["d3"])
    _same(pair, {"s": {"$in": [CONTROL, ESCAPED, "none"]}}, ["d2", "d3"])
    _same(pair, {"s": {"$gt": "a\x01"}}, ["d2", "d3", "d5"])


def test_the_filter_limits_are_within_what_milvus_answers(pair):
    deep = {"year": 2020}
    for _ in range(MAX_FILTER_DEPTH):
        deep = {"$or": [deep, {"year": 1}]}
    _same(pair, deep, ["d1", "d3"])
    wide = {"$or": [{"year": 3000 + i} for i in range(MAX_FILTER_CONDITIONS - 1)] + [{"year": 2019}]}
    _same(pair, wide, ["d0"])
    many = {"year": {"$in": list(range(10_000, 10_000 + MAX_FILTER_VALUES - 1)) + [2021]}}
    _same(pair, many, ["d2"])
    local, milvus = pair
    for over in ({"$or": [deep, {"year": 1}]}, {"$or": wide["$or"] + [{"year": 1}]},
                 {"year": {"$in": many["year"]["$in"] + [1]}}):
        for index in (local, milvus):
            with pytest.raises(tt.DataError, match="more than|deeper than"):
                index.search("tea", filter=over)


@pytest.mark.parametrize("flt, field, words", [
    ({"year": int("9" * 400)}, "year.$eq", "beyond float range"),
    ({"year": {"$in": [1, -int("9" * 400)]}}, "year.$in", "beyond float range"),
    ({"s": "a\ud800"}, "s.$eq", "lone surrogate"),
    ({"k\udc00": 1}, "k\\udc00", "lone surrogate"),
    ({"year": None}, "year.$eq", "null"),
    ({"$or": [{"s": "x"}, {"s": {"$nin": ["y", None]}}]}, "s.$nin", "null"),
])
def test_what_no_backend_takes_is_refused_alike(pair, flt, field, words):
    for index in pair:
        with pytest.raises(tt.DataError, match=words) as err:
            index.search("tea", filter=flt)
        assert err.value.field == field
        str(err.value).encode("utf-8")  # the message itself can be printed and sent


def test_metadata_no_backend_can_filter_on_is_refused_when_written(pair):
    for index in pair:
        for bad, field in (({"k\ud800": 1}, "k\\ud800"), ({"k": "v\udfff"}, "k")):
            with pytest.raises(tt.DataError, match="lone surrogate") as err:
                index.add([{"_id": "bad", "text": "tea", **bad}])
            assert err.value.field == field
        assert "bad" not in {h.id for h in index.search("tea", k=20)}


def test_true_comes_back_as_true(pair):
    for index in pair:
        hits = {h.id: h for h in index.search("tea", k=20)}
        for doc_id, value in (("d0", True), ("d1", False)):
            got = hits[doc_id].metadata["flag"]
            assert type(got) is bool and got is value, (index, got)
            stored = index.documents([doc_id])[0]
            assert type(stored["flag"]) is bool and stored["flag"] is value
        assert type(hits["d0"].metadata["year"]) is int and type(hits["d3"].metadata["year"]) is float
