"""Shared cases for the store-operation tests (tests/test_store_manage.py, tests/test_milvus_manage.py): a corpus whose
metadata mixes kinds and whose texts hold the characters a text filter must take literally, the filters (``$not``,
``$text`` and the older operators), and a brute-force reference that evaluates them over the documents in Python —
``$not``, ``$text``, ``$and`` and ``$or`` by hand, a single field's condition by ``Filter.matches`` on that field
alone (the reference the older operators are tested against)."""

from __future__ import annotations

import numpy as np

import twotower as tt
from conftest import TINY_CORPUS

WORDS = "tea green leaf cup water hot cold brew steam roast bean milk sugar sweet bitter".split()
ODD = ["50% off", "a_b", 'say "x"', "naïve café", "Tea time", "back\\slash", "x[y]z", "it's", "line\nbreak"]


def _metadata(i: int) -> dict:
    m: dict = {"src": ["wiki", "web", 'w"eb'][i % 3], "ok": i % 4 == 0}
    if i % 5:
        m["year"] = 1990 + i
    m["tags"] = [["a", "b"], "c", [], ["b"]][i % 4]
    if i % 6 == 0:
        m["author"] = {"name": "Ann" if i % 12 == 0 else "Bo", "age": 30 + i}
    if i % 7 == 0:
        m["note"] = None
    return m


def corpus() -> list[dict]:
    """42 documents (the tiny corpus and generated ones), each with metadata; some texts hold :data:`ODD` pieces,
    and two titles say "tea" where their texts do not (a text filter must not look at titles)."""
    rng = np.random.default_rng(5)
    docs = [dict(d) for d in TINY_CORPUS]
    for i in range(36):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 9))))
        if i % 4 == 1:
            text += " " + ODD[(i // 4) % len(ODD)]
        doc_id = {10: "Zeta", 20: "éclair", 30: "中文-1"}.get(i, f"g{i:02d}")  # id order: code points, not letters
        docs.append({"_id": doc_id, "title": "tea notes" if i in (3, 7) else "", "text": text + "."})
    return [dict(d, **_metadata(i)) for i, d in enumerate(docs)]


NEW_FILTERS = [
    {"$not": {"src": "wiki"}}, {"$not": {"year": {"$gt": 2010}}}, {"$not": {"year": {"$exists": True}}},
    {"$not": {"tags": "b"}}, {"$not": {"tags": {"$nin": ["b"]}}}, {"$not": {"author.name": "Ann"}},
    {"$not": {"author.age": {"$lte": 50}}}, {"$not": {"$or": [{"src": "web"}, {"ok": True}]}},
    {"$not": {"$and": [{"src": {"$in": ["wiki", "web"]}}, {"year": {"$lt": 2015}}]}},
    {"$not": {"$not": {"src": "wiki"}}}, {"$not": {"note": "x"}}, {"$not": {"src": {"$in": []}}},
    {"$not": {"src": {"$ne": "web"}}}, {"$not": {"ok": True}},
    {"$text": {"$contains": "tea"}}, {"$text": {"$contains": "Tea"}}, {"$text": {"$contains": "50%"}},
    {"$text": {"$contains": "a_b"}}, {"$text": {"$contains": '"x"'}}, {"$text": {"$contains": "naïve café"}},
    {"$text": {"$contains": "x[y]"}}, {"$text": {"$contains": "it's"}}, {"$text": {"$contains": "line\nbreak"}},
    {"$text": {"$contains": "green tea"}}, {"$text": {"$contains": "%"}}, {"$text": {"$contains": "_"}},
    {"$not": {"$text": {"$contains": "tea"}}}, {"src": "wiki", "$text": {"$contains": "tea"}},
    {"$or": [{"$text": {"$contains": "milk"}}, {"year": {"$lt": 1995}}]}, {"$text": {"$contains": "zzz none"}},
]
OLD_FILTERS = [
    None, {"src": "wiki"}, {"src": {"$ne": "web"}}, {"year": {"$gte": 2000, "$lt": 2020}},
    {"year": {"$exists": False}}, {"tags": "b"}, {"tags": {"$in": ["a", "c"]}}, {"author.name": "Ann"},
    {"$or": [{"src": "web"}, {"ok": True}]},
]
FILTERS = OLD_FILTERS + NEW_FILTERS


def metadata_of(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("_id", "title", "text")}


def passes(flt, doc: dict) -> bool:
    """The brute-force reference (module docstring)."""
    if not flt:
        return True
    for key, value in flt.items():
        if key == "$not":
            ok = not passes(value, doc)
        elif key == "$text":
            ok = value["$contains"] in doc["text"]
        elif key == "$and":
            ok = all(passes(f, doc) for f in value)
        elif key == "$or":
            ok = any(passes(f, doc) for f in value)
        else:
            ok = tt.parse_filter({key: value}).matches(metadata_of(doc))
        if not ok:
            return False
    return True


def expected(docs: list[dict], flt) -> list[str]:
    """The ids of ``docs`` that pass ``flt``, in id order."""
    return sorted(d["_id"] for d in docs if passes(flt, d))


def walk_pages(index, flt, limit: int) -> list[str]:
    """Every id :meth:`Index.list` gives, page by page through the ``next`` cursor (checking each page's ``total``)."""
    out, after, totals = [], None, set()
    while True:
        page = index.list(flt, limit=limit, after=after, documents=False)
        out += page.ids
        totals.add(page.total)
        assert len(page.ids) <= limit
        if page.next is None:
            assert totals == {len(out)}, (flt, totals, len(out))
            return out
        assert page.next == page.ids[-1]
        after = page.next
