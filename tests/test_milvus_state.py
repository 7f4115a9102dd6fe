"""The index's state lives in Milvus (issue #44), against the real Milvus Lite: a folder made from the URI and
collection alone opens the same index; two folders (replicas) see each other's writes, the BM25 terms of added
documents included; BM25's idf after writes equals the one counted by hand over the documents left; the token may
come as a user and a password."""

from __future__ import annotations

import math
import shutil

import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

import twotower as tt  # noqa: E402
from conftest import TINY_CORPUS, write_beir  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("milvus-state")
    data = write_beir(root / "data", TINY_CORPUS, [{"_id": "q0", "text": "tea"}], [("q0", "d5", 1)])
    uri = str(root / "state.db")
    index = tt.Index.build(root / "idx", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=uri, collection="state")
    return root, index, uri


def test_attach_and_replicas_read_one_state(built):
    from twotower.retrieval.milvus.store import MilvusStore

    attach = MilvusStore.attach
    root, index, uri = built
    attached = attach(root / "attached", uri, "state")
    shutil.copytree(index.path, root / "copied")
    a, b = tt.Index.open(root / "attached", precision="fp32"), tt.Index.open(root / "copied", precision="fp32")
    queries = ["green tea leaves", "feline", "memory safe language"]
    want = [[h.id for h in hits] for hits in index.search(queries, k=3, mode="hybrid")]
    assert [[h.id for h in hits] for hits in a.search(queries, k=3, mode="hybrid")] == want
    assert attached.version == index.info()["live_version"] and len(attached) == len(index)
    a.add([{"_id": "r1", "title": "Okapi", "text": "Okapis are shy forest giraffes."}])  # a term no one had
    b.add([{"_id": "r2", "title": "Tapir", "text": "Tapirs snorkel with their trunks."}])  # after a's, from a stale b
    for replica in (a, b, index):  # a search picks up the latest committed write, whichever folder wrote it
        assert [[h.id for h in hits] for hits in replica.search(["okapis", "tapirs snorkel"], k=1, mode="bm25")] == \
            [["r1"], ["r2"]]
        assert len(replica) == len(TINY_CORPUS) + 2 == replica.info()["num_docs"]  # the count Milvus holds
    with pytest.raises(TwoTowerError, match="holds no twotower index"):
        attach(root / "none", uri, "nothing_here")
    with pytest.raises(TwoTowerError, match="not an index directory|exists and is not a directory"):
        (root / "file").write_text("x")
        attach(root / "file", uri, "state")
    b.remove(["r1", "r2"])
    assert a.info()["num_docs"] == len(TINY_CORPUS)


def test_bm25_idf_after_writes_is_counted_over_the_documents_left(built):
    """Lucene idf = ln(1 + (N − df + 0.5) / (df + 0.5)), N and df counted here over the index's documents after an
    add, a replace and a remove: the query weights Milvus gets are exactly those (the build's were frozen before)."""
    from twotower.retrieval.bm25 import BM25
    from twotower.retrieval.backends import open_store

    _, index, _ = built
    index.add([{"_id": "t1", "title": "", "text": "tea tea ceremony"}, {"_id": "t2", "title": "", "text": "tea kettle"}])
    index.add([{"_id": "t2", "title": "", "text": "kettle whistles"}], replace=True)
    index.remove(["d1"])
    store = open_store(index.path)
    docs = {d["_id"]: f"{d['title']} {d['text']}".strip() for d in index.documents([*store.row_of])}
    lexicon = store.lexicon
    analyse = BM25(lexicon.params)
    tokens = {d: set(analyse.tokenizer.tokenize([t], update_vocab=True, return_as="string", show_progress=False)[0])
              for d, t in docs.items()}
    n = len(docs)
    assert lexicon.n_docs == n == len(TINY_CORPUS) + 1
    for word in ("tea", "kettl", "ceremoni", "whistl"):
        df = sum(word in t for t in tokens.values())
        assert df > 0, word
        (vector,) = lexicon.query_vectors([word])
        assert list(vector.values()) == pytest.approx([math.log(1 + (n - df + 0.5) / (df + 0.5))], rel=1e-6), word
    index.remove(["t1", "t2"])


def test_user_and_password_make_the_token(monkeypatch):
    from twotower.retrieval.milvus.client import PASSWORD_ENV, TOKEN_ENV, USER_ENV, server_token

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(USER_ENV, raising=False)
    assert server_token() == ""
    monkeypatch.setenv(USER_ENV, "reader")
    monkeypatch.setenv(PASSWORD_ENV, "s3cret:x")
    assert server_token() == "reader:s3cret:x"
    monkeypatch.setenv(TOKEN_ENV, "api-key")  # an explicit token wins
    assert server_token() == "api-key"
