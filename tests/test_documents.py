"""Documents as users have them (issue #43): plain strings with content ids, dicts whose other keys are metadata,
BEIR fields kept, bad metadata refused before anything is written, and metadata through add / remove / replace /
reopen."""

from __future__ import annotations

import hashlib
import json

import pytest

import twotower as tt
from conftest import write_beir

TEXTS = ["Green tea is steamed.", "Black tea is oxidised.", "Coffee beans are roasted."]


def test_content_ids_are_the_texts_sha256():
    want = ["doc-" + hashlib.sha256(t.encode()).hexdigest()[:16] for t in TEXTS]
    assert tt.document_ids(TEXTS) == want and tt.document_id(TEXTS[0]) == want[0]
    with pytest.raises(tt.DataError, match="one string"):
        tt.document_ids("tea")


def test_build_from_strings_with_metadatas_and_find_duplicates(tiny_bert_dir, tmp_path):
    index = tt.Index.build(tmp_path / "idx", TEXTS, metadatas=[{"kind": "tea"}, {"kind": "tea"}, None],
                           encoder=str(tiny_bert_dir), show_progress=False)
    ids = tt.document_ids(TEXTS)
    assert index.added_ids == ids and index.store.doc_ids == ids
    assert index.documents(ids) == [{"_id": ids[0], "title": "", "text": TEXTS[0], "kind": "tea"},
                                    {"_id": ids[1], "title": "", "text": TEXTS[1], "kind": "tea"},
                                    {"_id": ids[2], "title": "", "text": TEXTS[2]}]
    with pytest.raises(tt.TwoTowerError, match="already in the index"):  # the same text again: detected
        index.add([TEXTS[1]])
    with pytest.raises(tt.DataError, match="same text twice") as err:
        index.add(["Matcha.", "Matcha."])
    assert err.value.path == "corpus[1]"
    index.add(["Matcha is ground."], ids=["m1"], metadatas=[{"kind": "tea", "grade": 1}])
    assert index.added_ids == ["m1"] and index.documents(["m1"])[0]["grade"] == 1
    assert len(tt.Index.open(tmp_path / "idx")) == 4


def test_dict_documents_keep_every_other_key(tiny_bert_dir, tmp_path):
    from twotower.api.dataset import as_documents

    docs = as_documents([{"id": "a", "text": "x", "src": "wiki", "n": {"k": [1, 2.5, None, True]}},
                         {"_id": "b", "title": "T", "text": "y", "tags": ("p", "q")}])
    assert docs["a"].metadata == {"src": "wiki", "n": {"k": [1, 2.5, None, True]}}
    assert docs["b"].metadata == {"tags": ["p", "q"]} and docs["b"].title == "T"
    assert as_documents({"c": {"title": "T", "text": "z", "lang": "en"}})["c"].metadata == {"lang": "en"}
    assert as_documents([docs["a"]])["a"] == docs["a"]  # a Document carries its metadata along
    assert hash(docs["a"]) == hash(tt.Document("a", "", "x"))  # hashable: the metadata is left out of the hash
    with pytest.raises(tt.DataError, match="both _id 'b' and id 'c'"):
        as_documents([{"_id": "b", "id": "c", "text": "y"}])
    with pytest.raises(tt.DataError, match="goes with a list of strings"):
        as_documents([{"_id": "b", "text": "y"}], ids=["x"])
    with pytest.raises(tt.DataError, match="2 metadatas for 3 texts"):
        as_documents(TEXTS, metadatas=[{}, {}])
    with pytest.raises(tt.DataError, match="expected a dict or None"):
        as_documents(TEXTS, metadatas=[{}, "tea", {}])
    with pytest.raises(tt.DataError, match="expected a string"):
        as_documents(["a", {"_id": "b", "text": "y"}])


BAD = [
    ({"s": {1, 2}}, "s", "type set is not JSON"),
    ({"b": b"raw"}, "b", "type bytes is not JSON"),
    ({"x": float("nan")}, "x", "not finite"),
    ({"x": {"y": [1, float("inf")]}}, "x.y[1]", "not finite"),
    ({"x": {1: "a"}}, "x", "not a non-empty string"),
    ({"big": 2**60}, "big", "beyond ±2**53"),
    ({"blob": "x" * 10_000_000}, "metadata", "64 KiB"),
]


@pytest.mark.parametrize("meta, field, words", BAD)
def test_bad_metadata_is_refused_and_nothing_is_written(tiny_bert_dir, tmp_path, meta, field, words):
    index = tt.Index.build(tmp_path / "idx", TEXTS, encoder=str(tiny_bert_dir), show_progress=False)
    version = index.info()["live_version"]
    with pytest.raises(tt.DataError) as err:
        index.add(["A new text."], metadatas=[meta])
    assert err.value.field == field and words in str(err.value) and "corpus[0]" in str(err.value)
    assert index.info()["live_version"] == version and len(tt.Index.open(tmp_path / "idx")) == 3
    with pytest.raises(tt.DataError):  # and a first build writes no folder
        tt.Index.build(tmp_path / "new", ["A new text."], metadatas=[meta], encoder=str(tiny_bert_dir),
                       show_progress=False)
    assert not (tmp_path / "new").exists()


def test_beir_extra_fields_become_metadata(tiny_bert_dir, tmp_path):
    corpus = [{"_id": "d1", "title": "Tea", "text": "Green tea.", "metadata": {"url": "http://x"}, "year": 2001},
              {"_id": "d2", "title": "", "text": "Coffee."}]
    data = write_beir(tmp_path / "beir", corpus, [{"_id": "q1", "text": "tea"}], [("q1", "d1", 1)])
    ds = tt.load_beir(data)
    assert ds.corpus["d1"].metadata == {"metadata": {"url": "http://x"}, "year": 2001} and ds.corpus["d2"].metadata == {}
    assert tt.load_beir(ds.save(tmp_path / "saved")).corpus == ds.corpus  # saved and read back with the metadata
    index = tt.Index.build(tmp_path / "idx", data, encoder=str(tiny_bert_dir), show_progress=False)
    hit = index.search("tea", k=1, filter={"metadata.url": {"$exists": True}})[0]
    assert hit.id == "d1" and hit.metadata == ds.corpus["d1"].metadata
    assert hit.document == {"_id": "d1", "title": "Tea", "text": "Green tea.", **ds.corpus["d1"].metadata}
    # the flat form: "score" is plain metadata; "id" would be a second id, refused (never a silent overwrite)
    (data / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "Tea", "text": "x", "score": 3}) + "\n")
    assert tt.load_beir(data).corpus["d1"].metadata == {"score": 3}
    (data / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "x", "id": "d9"}) + "\n")
    with pytest.raises(tt.DataError) as err:
        tt.load_beir(data)
    assert err.value.field == "id" and "corpus.jsonl, line 1 (document 'd1')" in str(err.value)


def test_metadata_survives_add_replace_remove_and_reopen(tiny_bert_dir, tmp_path):
    index = tt.Index.build(tmp_path / "idx", [{"_id": "a", "text": "tea one", "v": 1},
                                              {"_id": "b", "text": "tea two", "v": 2}],
                           encoder=str(tiny_bert_dir), show_progress=False, bm25=True)
    assert [h.id for h in index.search("tea", k=5, filter={"v": {"$gte": 2}})] == ["b"]
    index.add([{"_id": "c", "text": "tea three", "v": 3, "tags": ["x"]}])
    assert sorted(h.id for h in index.search("tea", k=5, filter={"v": {"$gte": 2}})) == ["b", "c"]  # a new version
    index.add([{"_id": "b", "text": "tea two again", "v": 0}], replace=True)  # its metadata replaced too
    assert [h.id for h in index.search("tea", k=5, mode="bm25", filter={"v": {"$gte": 2}})] == ["c"]
    index.remove(["a"])
    again = tt.Index.open(tmp_path / "idx")
    assert again.documents(["b", "c"]) == [{"_id": "b", "title": "", "text": "tea two again", "v": 0},
                                           {"_id": "c", "title": "", "text": "tea three", "v": 3, "tags": ["x"]}]
    assert {h.id: h.metadata for h in again.search("tea", k=5)} == {"b": {"v": 0}, "c": {"v": 3, "tags": ["x"]}}
    assert again.search("tea", k=5, filter={"tags": "x"})[0].id == "c"


def test_documents_without_metadata_keep_the_old_line_format(tiny_bert_dir, tmp_path):
    """An index written before metadata existed has no "metadata" in docs.jsonl: documents without metadata are
    still written that way, read back as {}, and match no condition on a field (but $exists: false)."""
    index = tt.Index.build(tmp_path / "idx", {"d1": "tea", "d2": "coffee"}, encoder=str(tiny_bert_dir),
                           show_progress=False)
    lines = [json.loads(x) for x in (index.store.dir / "docs.jsonl").read_text().splitlines()]
    assert lines == [{"_id": "d1", "title": "", "text": "tea"}, {"_id": "d2", "title": "", "text": "coffee"}]
    assert [h.metadata for h in index.search("tea", k=2)] == [{}, {}]
    assert index.search("tea", k=2, filter={"x": {"$ne": 1}}) == []
    assert len(index.search("tea", k=2, filter={"x": {"$exists": False}})) == 2
