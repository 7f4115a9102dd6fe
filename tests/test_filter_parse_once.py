"""A filter is parsed once, where it comes in (issue #73 item 1): one ``tt.Index`` call (list, count, get, delete,
update, search in every mode), one ``retrieval.manage`` call and one HTTP request parse a raw filter (a dict or JSON
text) once; the layers inside take the parsed :class:`~twotower.retrieval.filters.Filter` (``parse_filter`` hands
one back as it is). Counted at the one step every raw parse takes: the limits check before the tree is built
(``filters.parse.check_filter``). On Milvus Lite too, where ``list(after=...)`` also counts the documents."""

from __future__ import annotations

import shutil

import pytest

import twotower as tt
from _fixtures import build_small_index, private_copy
from conftest import serve_client
from manage_cases import corpus
from twotower.retrieval import manage
from twotower.retrieval.filters import parse as parse_module

FLT = {"$or": [{"src": "wiki"}, {"year": {"$gte": 2010}}], "$not": {"tags": "b"}}


@pytest.fixture()
def parses(monkeypatch):
    """The number of raw filters parsed since the fixture was set up (a list holding one count)."""
    seen = [0]
    check = parse_module.check_filter

    def counting(obj):
        seen[0] += 1
        return check(obj)

    monkeypatch.setattr(parse_module, "check_filter", counting)
    return seen


def _once(parses, call, what=""):
    before = parses[0]
    result = call()
    assert parses[0] - before == 1, f"{what}: {parses[0] - before} parses"
    return result


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    return build_small_index(tmp_path_factory.mktemp("parseonce") / "index", corpus(), tiny_bert_dir)


@pytest.fixture()
def index(built, tmp_path):
    return tt.Index.open(private_copy(built, tmp_path))


def test_a_parsed_filter_is_handed_back_as_it_is(parses):
    flt = _once(parses, lambda: tt.parse_filter(FLT))
    assert tt.parse_filter(flt) is flt and parses[0] == 1
    assert _once(parses, lambda: tt.parse_filter('{"src": "wiki"}')).matches({"src": "wiki"})


def test_each_index_call_parses_its_filter_once(index, parses):
    assert 0 < index.count(FLT) < len(index)
    cursor = index.list(FLT, limit=1).next
    assert cursor is not None
    calls = [lambda: index.count(FLT), lambda: index.list(FLT, limit=2), lambda: index.list(FLT, limit=2, after=cursor),
             lambda: index.get(filter=FLT), lambda: index.get(["d1", "d2", "g01"], filter=FLT)]
    calls += [lambda mode=mode: index.search("green tea", k=3, mode=mode, filter=FLT)
              for mode in ("dense", "bm25", "hybrid", "rrf")]
    calls += [lambda: index.search(["green tea", "hot water"], k=3, filter=FLT),
              lambda: index.run({"q1": "green tea"}, k=3, filter=FLT),
              lambda: index.update(filter=FLT, metadata={"seen": True}),
              lambda: index.delete(filter={"seen": True, "src": "wiki"})]
    for call in calls:
        _once(parses, call)


def test_each_manage_function_parses_its_filter_once(index, parses):
    store = index.store
    _once(parses, lambda: manage.count(store, FLT))
    _once(parses, lambda: manage.page(store, FLT, limit=3))
    _once(parses, lambda: manage.selected_ids(store, FLT))
    _once(parses, lambda: manage.selected_ids(store, '{"src": "wiki"}', ["d1", "d2"]))  # JSON text too
    parsed = tt.parse_filter(FLT)
    before = parses[0]
    manage.count(store, parsed), manage.page(store, parsed), manage.selected_ids(store, parsed)
    assert parses[0] == before  # a parsed filter: parsed no more


def test_each_request_parses_its_filter_once(built, tmp_path, parses):
    target = tmp_path / "served"
    shutil.copytree(built, target)
    client = serve_client(target, api_key="k" * 24)
    key = {"X-API-Key": "k" * 24}
    for path, body in [("/count", {"filter": FLT}), ("/list", {"filter": FLT, "limit": 2}),
                       ("/list", {"filter": FLT, "ids": ["d1", "g01"]}),
                       ("/search", {"query": "green tea", "k": 3, "filter": FLT}),
                       ("/search/batch", {"queries": ["green tea", "milk"], "k": 3, "filter": FLT}),
                       ("/documents/delete", {"filter": {"src": "wiki", "year": {"$gte": 2020}}})]:
        response = _once(parses, lambda: client.post(path, json=body, headers=key), path)
        assert response.status_code == 200, (path, response.text)
    response = _once(parses, lambda: client.patch("/documents", json={"filter": FLT, "metadata": {"x": 1}},
                                                  headers=key))
    assert response.status_code == 200, response.text
    response = _once(parses, lambda: client.post("/count", json={"filter": {"year": {"$gte": "x", "$foo": 1}}},
                                                 headers=key))
    assert response.status_code == 422  # a bad filter: refused by its one parse


def test_each_milvus_call_parses_its_filter_once(tiny_bert_dir, tmp_path, parses):
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    index = tt.Index.build(tmp_path / "m", corpus(), encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=str(tmp_path / "m.db"), collection="once")
    first = index.list(FLT, limit=1)
    assert first.next is not None
    for call in (lambda: index.count(FLT), lambda: index.list(FLT, limit=2),
                 lambda: index.list(FLT, limit=2, after=first.next), lambda: index.get(filter=FLT),
                 lambda: index.search("green tea", k=3, mode="hybrid", filter=FLT),
                 lambda: index.update(filter=FLT, metadata={"seen": True})):
        _once(parses, call)
