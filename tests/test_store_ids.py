"""Compact document ids (``retrieval.index.ids``): every id the loaders take survives build, add, replace, remove and
reopening; ids that share a hash are told apart; a version written before the compact files opens from doc_ids.json;
an opened index holds no Python string per document."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twotower.data.ids import MAX_ID_BYTES
from twotower.errors import DataError
from twotower.retrieval.index import ids as ids_module
from twotower.retrieval.index.ids import DocIds
from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs, UnknownIdError

MODEL = {"name": "test", "path": "/nonexistent"}
DIM = 8
# 1,024 bytes of ASCII, 1,024 bytes of two-byte letters, quotes and backslashes, a combining mark
ODD = ["d0", "é", "日本語の文書", "🙂x", "a" * MAX_ID_BYTES, "ä" * (MAX_ID_BYTES // 2), "q','d1", 'q"\\',
       "Ω≈ç√", "x" * 3 + "\u0301"]


def _docs(ids, seed=0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return NewDocs(list(ids), [f"title {i}" for i in ids], [f"text {i}" for i in ids], v)


def test_doc_ids_reads_like_a_list_and_a_dict():
    held = DocIds.from_list(ODD)
    assert len(held) == len(ODD) and list(held) == ODD and held == ODD and held[-1] == ODD[-1]
    assert held[2:4] == ODD[2:4] and held[np.int64(3)] == ODD[3]
    assert [held.row_of[d] for d in ODD] == list(range(len(ODD)))
    assert held.rows(["nope", ODD[4], 7, None]) == [None, 4, None, None]
    assert "nope" not in held.row_of and held.row_of.get("nope", -1) == -1 and set(held.row_of) == set(ODD)
    with pytest.raises(KeyError):
        held.row_of["nope"]
    with pytest.raises(IndexError):
        held[len(ODD)]
    assert held.problem() is None


def test_ids_that_share_a_hash_are_told_apart(monkeypatch):
    monkeypatch.setattr(ids_module, "id_hashes",
                        lambda encoded: np.asarray([len(b) % 2 for b in encoded], dtype=np.uint64))  # 2 hashes for all
    held = DocIds.from_list(ODD)
    assert [held.row_of[d] for d in ODD] == list(range(len(ODD)))
    assert held.rows(["zz", "z"]) == [None, None]


def test_every_operation_keeps_the_ids(tmp_path):
    root = tmp_path / "idx"
    store = IndexStore.build(root, _docs(ODD), model=MODEL, spec=IndexSpec(bm25=True), show_progress=False)
    assert list(store.doc_ids) == ODD and json.loads((store.dir / "doc_ids.json").read_text()) == ODD
    assert store.documents([ODD[5]])[0]["_id"] == ODD[5]
    grown = store.add(_docs(["new", "ünï"], seed=1), show_progress=False)
    replaced = grown.add(_docs([ODD[1], ODD[4]], seed=2), replace=True, show_progress=False)
    want = [ODD[0], *ODD[2:4], *ODD[5:], "new", "ünï", ODD[1], ODD[4]]
    assert list(replaced.doc_ids) == want
    smaller = replaced.remove([ODD[6], "new"], show_progress=False)
    want = [d for d in want if d not in (ODD[6], "new")]
    reopened = IndexStore.open(root, verify=True)
    for s in (smaller, reopened):
        assert list(s.doc_ids) == want and s.rows(want) == list(range(len(want)))
        assert [s.document(r)["_id"] for r in range(len(s))] == want
        assert json.loads((s.dir / "doc_ids.json").read_text()) == want
        assert s.bm25.doc_ids[s.rows(["ünï"])[0]] == "ünï"
        v = s.float_vectors(np.asarray([s.row_of[ODD[4]]]))
        assert s.doc_ids[s.search(v, 1)[1][0, 0]] == ODD[4]  # the replaced vector, found under its id
    with pytest.raises(UnknownIdError, match="'new'"):
        reopened.documents(["new"])
    with pytest.raises(Exception, match="already in the index"):
        reopened.add(_docs(["ünï"]), show_progress=False)
    smaller.close()
    reopened.close()


def test_a_version_without_the_compact_files_opens_from_doc_ids_json(tmp_path):
    """Indexes written before doc_ids.bin existed: the ids are read from doc_ids.json (into memory), and the next
    write adds the compact files."""
    root = tmp_path / "idx"
    store = IndexStore.build(root, _docs(ODD), model=MODEL, show_progress=False)
    manifest_path = store.dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for name in ("doc_ids.bin", "doc_ids.offsets.npy", "doc_ids.lookup.npy"):
        (store.dir / name).unlink()
        del manifest["files"][name]
    manifest_path.write_text(json.dumps(manifest))
    store.close()
    old = IndexStore.open(root, verify=True)
    assert list(old.doc_ids) == ODD and old.row_of[ODD[3]] == 3
    new = old.add(_docs(["later"], seed=3), show_progress=False)
    assert (new.dir / "doc_ids.bin").is_file() and list(IndexStore.open(root).doc_ids) == [*ODD, "later"]


def test_id_files_that_disagree_are_named(tmp_path):
    root = tmp_path / "idx"
    store = IndexStore.build(root, _docs(["a", "b", "c"]), model=MODEL, show_progress=False)
    np.save(store.dir / "doc_ids.offsets.npy", np.asarray([0, 1, 2], dtype=np.int64))  # one short, same byte count
    with pytest.raises(DataError, match="doc_ids.offsets.npy"):
        IndexStore.open(root)
