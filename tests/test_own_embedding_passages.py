"""Documents of an embedding of your own are split into passages by characters (issue #70 item 4): the embedding
never receives more than the window (plus the title), offsets stay exact, a document scores by its best passage, and
adds, sync and Milvus split alike."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import twotower as tt

WINDOW = 300
seen: list[int] = []


def embed(texts):
    """A bag-of-words embedding (hashing trick), recording the longest text it was given."""
    seen.append(max(len(t) for t in texts))
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().split():
            out[i, zlib.crc32(word.strip(".,").encode()) % 64] += 1.0
    return out


def _long(i: int) -> str:
    body = " ".join(f"Sentence {j} of report {i} speaks of harbours and tides." for j in range(60))
    return body + f" The secret word of report {i} is marmalade{i}."


def test_long_documents_become_passages_the_embedding_can_take(tmp_path):
    seen.clear()
    docs = {f"r{i}": {"title": f"Report {i}", "text": _long(i)} for i in range(4)}
    docs["short"] = "A short note on tea."
    index = tt.Index.build(tmp_path / "idx", docs, embedding=embed, passage_window=WINDOW, bm25=False,
                           show_progress=False)
    info = index.info()
    assert info["num_vectors"] > 4 * 10 and info["passages"]["unit"] == "chars"
    assert max(seen) <= WINDOW + len("Report 0 ")  # never a whole 3,000-character document
    hit = index.search("marmalade2", k=1)[0]
    assert hit.id == "r2" and "marmalade2" in hit.passage.text
    assert hit.text[hit.passage.start:hit.passage.end] == hit.passage.text
    # the document's score is its best passage's: brute force over the passages' vectors
    q = embed(["marmalade2"])[0]
    q = q / np.linalg.norm(q)
    parts = [docs["r2"]["title"] + " " + docs["r2"]["text"][a:b] for a, b in index.store.spans[
        index.store.offsets[index.store.row_of["r2"]]:index.store.offsets[index.store.row_of["r2"] + 1]]]
    vecs = embed(parts)
    vecs = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    assert hit.score == pytest.approx(float((vecs @ q).max()), abs=1e-5)
    seen.clear()
    index.add({"r9": _long(9)})  # an add splits the same way
    assert max(seen) <= WINDOW and index.search("marmalade9", k=1)[0].id == "r9"


def test_passages_off_gives_one_vector_per_document_and_precomputed_vectors_refuse_them(tmp_path):
    seen.clear()
    docs = {"a": _long(1), "b": "short"}
    whole = tt.Index.build(tmp_path / "whole", docs, embedding=embed, passages=False, bm25=False,
                           show_progress=False)
    assert whole.info()["num_vectors"] == 2 and max(seen) == len(_long(1))
    with pytest.raises(tt.TwoTowerError, match="precomputed vectors are one per document"):
        tt.Index.build(tmp_path / "given", docs, vectors=np.ones((2, 8), dtype=np.float32), passage_window=200,
                       show_progress=False)


def test_milvus_splits_an_own_embedding_alike(tmp_path):
    pytest.importorskip("pymilvus", reason="the Milvus backend needs pymilvus (the dev extra)")
    pytest.importorskip("milvus_lite", reason="the Milvus backend needs milvus-lite (the dev extra)")
    docs = {f"r{i}": _long(i) for i in range(3)}
    local = tt.Index.build(tmp_path / "local", docs, embedding=embed, passage_window=WINDOW, bm25=False,
                           show_progress=False)
    remote = tt.Index.build(tmp_path / "remote", docs, embedding=embed, passage_window=WINDOW, bm25=False,
                            show_progress=False, backend="milvus", uri=str(tmp_path / "m.db"), collection="own_p")
    for query in ("marmalade1", "harbours and tides"):
        a, b = local.search(query, k=3), remote.search(query, k=3)
        assert [h.id for h in a] == [h.id for h in b]
        assert [(h.passage.start, h.passage.end) for h in a] == [(h.passage.start, h.passage.end) for h in b]
