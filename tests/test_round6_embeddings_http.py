"""Own embeddings and precomputed vectors, over HTTP and across reopening (issue #71 items 6, 9, 14, 16, 18).

- 6: an embedding of your own that raises (or returns unusable vectors) while the service encodes answers a JSON
  502 ``embedding_failed`` naming the embedding, the exception's type and message, on every route that encodes
  (``/search``, ``/search/batch``, ``POST /documents`` adding or replacing), and a write then writes nothing; the
  Python API still raises the embedding's own exception.
- 9: reopening with your own embedding: its identity is its kind and name, not its module (a script's ``__main__``
  function reopens from a module and back), or the ``twotower_name`` set on it; another kind, name or model name is
  refused with a whole, actionable message; another size at the first encoding.
- 14: vectors added to an index of precomputed vectors are normalised like the built ones: a hit's score is numpy's
  cosine between the query vector and the document's vector.
- 16: ``tt.create_app(index, api_key=K, keyed_reads=True)`` refuses every read without the key (401) or with a
  wrong one (403), and answers it with the right one.
- 18: ``tt.create_app(folder)`` over an index of precomputed vectors starts (no query runtime applies to it).

References are numpy (cosine, brute force) on the embedding's vectors, and the HTTP statuses the service documents.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import twotower as tt
from _fixtures import hash_vectors

DIM = 8
KEY = "k" * 24
TEXTS = [f"document {i} about {w}" for i, w in enumerate("tea coffee cats dogs rain sun moon bones".split())]
IDS = [tt.document_id(t) for t in TEXTS]

# The embedding as source text: this module runs it (module-level `embed`), and the scripts below run the same text
# as __main__ (its functions then live in module `__main__`).
EMBED_SOURCE = '''
import hashlib

import numpy as np


def embed(texts):
    """A deterministic embedding: a vector drawn from the text's hash (documents and queries alike)."""
    out = []
    for t in texts:
        seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
        out.append(np.random.default_rng(seed).normal(size=DIM))
    return np.array(out)
'''


def embed(texts):
    """As EMBED_SOURCE (the same vectors: tests/_fixtures.hash_vectors), defined in this module."""
    return hash_vectors(texts, DIM)


def cosine_ranking(query_vec, doc_vecs, ids, k):
    """Top k (ids, scores) by cosine, brute force (numpy)."""
    d = np.asarray(doc_vecs, dtype=np.float64)
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    q = np.asarray(query_vec, dtype=np.float64)
    scores = d @ (q / np.linalg.norm(q))
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[i] for i in order], [float(scores[i]) for i in order]


def run_script(tmp_path, body: str) -> str:
    """``body`` run as a script (``__main__``) after EMBED_SOURCE, in a fresh interpreter; its stdout."""
    script = tmp_path / "script.py"
    script.write_text(f"DIM = {DIM}\n" + EMBED_SOURCE + textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def client(app):
    from fastapi.testclient import TestClient

    return TestClient(app, raise_server_exceptions=False)  # a bug answers 500, as a server would


# ------------------------------------------------------------------------------------------------ item 6


class Switch:
    """Embeddings of each kind whose calls raise while ``fail`` is set (or return vectors of another size while
    ``wrong_size`` is)."""

    fail = False
    wrong_size = False

    def vectors(self, texts):
        if self.fail:
            raise RuntimeError("provider down (HTTP 503 from the embedding API)")
        out = embed(texts)
        return out[:, :4] if self.wrong_size else out


def switched(kind: str, switch: Switch):
    if kind == "callable":
        def flaky_embed(texts):
            return switch.vectors(texts)
        return flaky_embed
    if kind == "langchain":
        class FlakyEmbeddings:
            def embed_documents(self, texts):
                return switch.vectors(texts).tolist()

            def embed_query(self, text):
                return switch.vectors([text])[0].tolist()
        return FlakyEmbeddings()

    class FlakyLlamaEmbedding:
        def get_text_embedding_batch(self, texts, **kwargs):
            return switch.vectors(texts).tolist()

        def get_query_embedding(self, query):
            return switch.vectors([query])[0].tolist()
    return FlakyLlamaEmbedding()


@pytest.mark.parametrize("kind", ["callable", "langchain", "llama_index"])
def test_an_embedding_that_raises_answers_502_and_writes_nothing(tmp_path, kind):
    switch = Switch()
    index = tt.Index.build(tmp_path / "i", TEXTS, embedding=switched(kind, switch), show_progress=False)
    c = client(tt.create_app(index, api_key=KEY))
    key = {"X-API-Key": KEY}
    before = c.get("/healthz").json()
    old_text = c.get(f"/documents/{IDS[0]}").json()["text"]

    switch.fail = True
    requests = [
        ("/search", {"query": "a query about tea", "mode": "dense"}),
        ("/search", {"query": "a query about tea"}),  # hybrid by default: its dense side encodes
        ("/search/batch", {"queries": ["tea", "cats"], "mode": "dense"}),
        ("/documents", {"documents": ["a new document"]}),  # add
        ("/documents", {"documents": [{"_id": IDS[0], "title": "", "text": "replaced text"}], "replace": True}),
    ]
    for path, body in requests:
        r = c.post(path, json=body, headers=key)
        assert r.status_code == 502, (path, body, r.status_code, r.text[:300])
        assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
        out = r.json()
        assert set(out) == {"error", "detail"} and out["error"] == "embedding_failed", out
        detail = out["detail"]
        assert "embedding" in detail and "RuntimeError: provider down (HTTP 503 from the embedding API)" in detail
        assert ("flaky_embed" if kind == "callable" else "Flaky") in detail, detail
        assert ("queries" if path == "/search/batch" else "a query" if path == "/search" else "a document") in detail
    # nothing was written: the same version, the same documents, the replaced one untouched
    assert c.get("/healthz").json() == before
    assert c.get(f"/documents/{tt.document_id('a new document')}").status_code == 404
    assert c.get(f"/documents/{IDS[0]}").json()["text"] == old_text
    assert c.post("/search", json={"query": "tea", "mode": "bm25"}).status_code == 200  # BM25 needs no embedding

    # the Python API keeps the embedding's own exception (to catch, to retry)
    with pytest.raises(RuntimeError, match="provider down"):
        index.search("tea", mode="dense")

    # the embedding back: the same service searches (numpy's ranking) and writes again
    switch.fail = False
    q = "a query about tea"
    r = c.post("/search", json={"query": q, "mode": "dense", "k": 5})
    assert r.status_code == 200, r.text
    want_ids, want_scores = cosine_ranking(embed([q])[0], embed(TEXTS), IDS, 5)
    assert [h["id"] for h in r.json()["hits"]] == want_ids
    np.testing.assert_allclose([h["score"] for h in r.json()["hits"]], want_scores, atol=1e-5)
    r = c.post("/documents", json={"documents": ["a new document"]}, headers=key)
    assert r.status_code == 200 and r.json()["added"] == 1, r.text


def test_an_embedding_that_returns_vectors_of_another_size_answers_502(tmp_path):
    switch = Switch()
    index = tt.Index.build(tmp_path / "i", TEXTS, embedding=switched("callable", switch), show_progress=False)
    c = client(tt.create_app(index, api_key=KEY))
    version = c.get("/healthz").json()["version"]
    switch.wrong_size = True
    for path, body in [("/search", {"query": "tea", "mode": "dense"}), ("/documents", {"documents": ["new one"]})]:
        r = c.post(path, json=body, headers={"X-API-Key": KEY})
        assert r.status_code == 502 and r.json()["error"] == "embedding_failed", r.text
        assert "4-d vectors, but the index holds 8-d" in r.json()["detail"], r.json()
    assert c.get("/healthz").json()["version"] == version


# ------------------------------------------------------------------------------------------------ item 9


def check_dense(index, q="a query about cats", k=5):
    hits = index.search(q, k=k, mode="dense")
    want_ids, want_scores = cosine_ranking(embed([q])[0], embed(TEXTS), IDS, k)
    assert [h.id for h in hits] == want_ids
    np.testing.assert_allclose([h.score for h in hits], want_scores, atol=1e-5)


def test_an_index_built_by_a_script_reopens_with_the_same_function_from_a_module(tmp_path):
    folder = tmp_path / "built-by-script"
    run_script(tmp_path, f"""
        import twotower as tt

        texts = {TEXTS!r}
        tt.Index.build({str(folder)!r}, texts, embedding=embed, show_progress=False)
    """)
    assert tt.Index.open(folder).info()["model"]["embedding"]["source"] == "__main__.embed"
    check_dense(tt.Index.open(folder, embedding=embed))  # this module's embed: accepted, and it ranks as numpy


def test_an_index_built_from_a_module_reopens_in_a_script(tmp_path):
    folder = tmp_path / "built-here"
    tt.Index.build(folder, TEXTS, embedding=embed, show_progress=False)
    q = "a query about cats"
    out = run_script(tmp_path, f"""
        import json

        import twotower as tt

        index = tt.Index.open({str(folder)!r}, embedding=embed)
        print(json.dumps([[h.id, h.score] for h in index.search({q!r}, k=5, mode="dense")]))
    """)
    hits = json.loads(out.strip().splitlines()[-1])
    want_ids, want_scores = cosine_ranking(embed([q])[0], embed(TEXTS), IDS, 5)
    assert [h[0] for h in hits] == want_ids
    np.testing.assert_allclose([h[1] for h in hits], want_scores, atol=1e-5)


def test_another_embedding_is_refused_with_a_whole_message(tmp_path):
    folder = tmp_path / "i"
    tt.Index.build(folder, TEXTS, embedding=embed, show_progress=False)

    def other_embed(texts):
        return embed(texts) * -1.0

    with pytest.raises(tt.TwoTowerError) as info:
        tt.Index.open(folder, embedding=other_embed)
    text = str(info.value)
    assert "other_embed" in text and "is another encoder" in text and "other_embed', not 'embed')" in text
    assert f"{__name__}.embed" in text  # what the index was built with
    assert "tt.Index.open(path, embedding=...)" in text and "query_vector=" in text
    assert "twotower_name attribute to 'embed'" in text  # how to say it is the same one, renamed
    assert not text.rstrip().endswith("own"), text  # was cut off: "... give the index's own"

    # a renamed function that says it is the same one reopens (and ranks as numpy)
    def renamed(texts):
        return embed(texts)

    renamed.twotower_name = "embed"
    check_dense(tt.Index.open(folder, embedding=renamed))

    # another kind is refused, whatever its name
    class embed_like:  # noqa: N801 - the function's name, on a LangChain-like class
        def embed_documents(self, texts):
            return embed(texts).tolist()

        def embed_query(self, text):
            return embed([text])[0].tolist()

    with pytest.raises(tt.TwoTowerError, match="a langchain embedding, not a callable one"):
        tt.Index.open(folder, embedding=embed_like())

    # the same name from elsewhere with vectors of another size: refused at the first encoding
    def small(texts):
        return embed(texts)[:, :4]

    small.__qualname__ = "embed"
    small.__module__ = "__main__"
    with pytest.raises(tt.TwoTowerError, match="4-d vectors, but the index holds 8-d"):
        tt.Index.open(folder, embedding=small).search("tea", mode="dense")


def test_a_twotower_name_set_at_build_is_the_identity(tmp_path):
    def embed_v1(texts):
        return embed(texts)

    embed_v1.twotower_name = "my-embedder-v1"
    folder = tmp_path / "i"
    tt.Index.build(folder, TEXTS, embedding=embed_v1, show_progress=False)
    assert tt.Index.open(folder).info()["model"]["embedding"]["name"] == "my-embedder-v1"

    def elsewhere(texts):  # another function name, the same declared identity: accepted
        return embed(texts)

    elsewhere.twotower_name = "my-embedder-v1"
    check_dense(tt.Index.open(folder, embedding=elsewhere))

    def unnamed(texts):
        return embed(texts)

    with pytest.raises(tt.TwoTowerError, match="twotower_name attribute to 'my-embedder-v1'"):
        tt.Index.open(folder, embedding=unnamed)
    unnamed.twotower_name = "my-embedder-v2"
    with pytest.raises(tt.TwoTowerError, match="named 'my-embedder-v2', not 'my-embedder-v1'"):
        tt.Index.open(folder, embedding=unnamed)


def _model_embeddings(model: str):
    class ModelEmbeddings:  # as LangChain's: a class per provider, the model as an attribute
        def __init__(self, model):
            self.model = model

        def embed_documents(self, texts):
            return embed(texts).tolist()

        def embed_query(self, text):
            return embed([text])[0].tolist()

    return ModelEmbeddings(model)


def test_a_langchain_embedding_of_another_model_is_refused(tmp_path):
    folder = tmp_path / "i"
    tt.Index.build(folder, TEXTS, embedding=_model_embeddings("small-v3"), show_progress=False)
    assert tt.Index.open(folder).info()["model"]["embedding"]["model"] == "small-v3"
    with pytest.raises(tt.TwoTowerError, match="model 'large-v3', not 'small-v3'"):
        tt.Index.open(folder, embedding=_model_embeddings("large-v3"))
    check_dense(tt.Index.open(folder, embedding=_model_embeddings("small-v3")))


# ------------------------------------------------------------------------------------------------ item 14


def test_added_vectors_are_normalised_like_the_built_ones(tmp_path):
    rng = np.random.default_rng(7)
    built = rng.normal(size=(6, DIM)) * rng.uniform(0.01, 50, size=(6, 1))  # norms far from 1
    added = rng.normal(size=(3, DIM)) * np.array([[7.0], [0.003], [250.0]])
    texts = [f"built {i}" for i in range(6)]
    new_texts = [f"added {i}" for i in range(3)]
    ids = [tt.document_id(t) for t in texts + new_texts]
    folder = tmp_path / "v"
    index = tt.Index.build(folder, texts, vectors=built, show_progress=False)
    index.add(new_texts, vectors=added)
    reopened = tt.Index.open(folder)
    more = rng.normal(size=(1, DIM)) * 1000.0
    reopened.add(["added later"], vectors=more)
    ids.append(tt.document_id("added later"))
    every = np.vstack([built, added, more])
    for q in (rng.normal(size=DIM), rng.normal(size=DIM) * 0.001, added[1]):
        hits = tt.Index.open(folder).search(query_vector=q, k=len(ids))
        want_ids, want_scores = cosine_ranking(q, every, ids, len(ids))
        assert [h.id for h in hits] == want_ids
        got = {h.id: h.score for h in hits}
        for doc, want in zip(want_ids, want_scores):  # each score is the cosine, added documents included
            assert got[doc] == pytest.approx(want, abs=1e-5), doc
    assert tt.Index.open(folder).search(query_vector=added[1], k=1)[0].score == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------------------------------------------------------ item 16


def test_keyed_reads_refuse_every_read_without_the_right_key(tmp_path):
    index = tt.Index.build(tmp_path / "i", TEXTS, embedding=embed, metadatas=[{"n": i} for i in range(len(TEXTS))],
                           show_progress=False)
    c = client(tt.create_app(index, api_key=KEY, keyed_reads=True))
    reads = [
        ("POST", "/search", {"query": "tea", "mode": "dense", "k": 3}),
        ("POST", "/search", {"query": "tea", "mode": "bm25", "k": 3}),
        ("POST", "/search/batch", {"queries": ["tea", "cats"], "k": 3}),
        ("GET", f"/documents/{IDS[0]}", None),
        ("POST", "/count", {}),
        ("POST", "/count", {"filter": {"n": 1}}),
        ("POST", "/list", {}),
        ("POST", "/list", {"limit": 2, "documents": False}),
        ("GET", "/info", None),
    ]

    def send(method, path, body, headers):
        return c.request(method, path, json=body, headers=headers) if body is not None else c.request(
            method, path, headers=headers)

    basic = "Basic " + base64.b64encode(f"anyone:{KEY}".encode()).decode()
    for method, path, body in reads:
        r = send(method, path, body, {})
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, r.status_code, r.text[:200])
        r = send(method, path, body, {"X-API-Key": "not-the-key-but-long-enough"})
        assert r.status_code == 403 and r.json()["error"] == "forbidden", (path, r.status_code, r.text[:200])
        for headers in ({"X-API-Key": KEY}, {"Authorization": basic}):
            r = send(method, path, body, headers)
            assert r.status_code == 200, (path, headers, r.status_code, r.text[:200])
    # what the right key reads is the index's
    r = send("POST", "/count", {}, {"X-API-Key": KEY})
    assert r.json()["count"] == len(TEXTS)
    r = send("GET", f"/documents/{IDS[0]}", None, {"X-API-Key": KEY})
    assert r.json()["text"] == TEXTS[0]
    assert c.get("/healthz").status_code == 200  # liveness stays open


# ------------------------------------------------------------------------------------------------ item 18


def test_the_service_starts_on_an_index_of_precomputed_vectors(tmp_path):
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(len(TEXTS), DIM))
    folder = tmp_path / "v"
    tt.Index.build(folder, TEXTS, vectors=vectors, show_progress=False)
    for served in (folder, str(folder), tt.Index.open(folder)):
        c = client(tt.create_app(served))  # no query_runtime given: the default (auto) does not apply to vectors
        assert c.get("/healthz").json()["documents"] == len(TEXTS)
        r = c.post("/search", json={"query": "tea", "mode": "bm25", "k": 2})
        assert r.status_code == 200 and r.json()["hits"][0]["id"] == IDS[0], r.text
        r = c.post("/search", json={"query": "tea", "mode": "dense"})  # no embedding to encode text with
        assert r.status_code == 400 and "query_vector" in r.json()["detail"], r.text
        assert c.get(f"/documents/{IDS[1]}").json()["text"] == TEXTS[1]
    # torch (the only other runtime) is fine too; the opened Index searches by vector as numpy does
    assert client(tt.create_app(folder, query_runtime="torch")).get("/healthz").status_code == 200
    hits = tt.Index.open(folder).search(query_vector=vectors[2], k=3)
    assert [h.id for h in hits] == cosine_ranking(vectors[2], vectors, IDS, 3)[0]
