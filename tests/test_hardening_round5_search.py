"""Behaviours an independent review's plausible bugs slipped past (issue #55, items 15, 16, 19-22), each compared
with a value worked out by hand or with exact search: ties in filtered and unfiltered search in ascending row order,
filtered IVF widening from the caller's nprobe, exclusive upper bounds, a blank API key given in Python, the
highlight window of two equally dense runs, and a metadata True that stays a bool on every way out."""

from __future__ import annotations

import numpy as np
import pytest

import twotower as tt
from conftest import serve_client
from twotower.retrieval.index import filtered

TIED = "green tea leaves"
# identical documents at rows 0, 2 and 5; ids whose alphabetical order is not their row order
ROWS = [("z0", TIED), ("b1", "coffee beans roasted"), ("a2", TIED), ("c3", "milk and sugar"), ("e4", "water boils"),
        ("m5", TIED), ("f6", "lemon juice"), ("g7", "black tea")]


@pytest.fixture(scope="module")
def tied(tiny_bert_dir, tmp_path_factory):
    corpus = [{"_id": i, "text": t, "keep": i != "c3", "flag": i == "z0", "n": 1} for i, t in ROWS]
    return tt.Index.build(tmp_path_factory.mktemp("ties") / "ix", corpus, encoder=str(tiny_bert_dir),
                          precision="fp32", show_progress=False)


def _ids(hits) -> list[str]:
    return [h.id for h in hits]


@pytest.mark.parametrize("path", ["unfiltered", "exact", "selector"])
def test_ties_come_in_ascending_row_order_on_every_path(tied, monkeypatch, path):
    if path == "selector":  # FAISS with an ID-selector bitmap, as on a large index
        monkeypatch.setattr(filtered, "EXACT_ROWS", 0)
        monkeypatch.setattr(filtered, "EXACT_SHARE", 0.0)
    flt = None if path == "unfiltered" else {"keep": True}
    hits = tied.search(TIED, k=6, filter=flt)
    assert hits[0].score == hits[1].score == hits[2].score > hits[3].score  # the three copies tie, at the top
    assert _ids(hits)[:3] == ["z0", "a2", "m5"]  # rows 0, 2, 5: not heap order, not id order
    assert _ids(tied.search(TIED, k=2, filter=flt)) == ["z0", "a2"]  # a cut through the ties keeps the first rows


@pytest.fixture(scope="module")
def ivf(tiny_bert_dir, tmp_path_factory):
    rng = np.random.default_rng(5)
    words = "tea coffee green black leaf bean water cup brew milk sugar roast steam cold hot sweet".split()
    texts = [" ".join(rng.choice(words, size=6)) + f" {i}" for i in range(320)]
    metas = [{"half": i % 2 == 0} for i in range(320)]
    return tt.Index.build(tmp_path_factory.mktemp("ivf") / "ix", texts, metadatas=metas, encoder=str(tiny_bert_dir),
                          precision="fp32", kind="ivf", nlist=16, show_progress=False), metas


def test_filtered_ivf_widens_from_the_callers_nprobe(ivf, monkeypatch):
    index, metas = ivf
    store = index.store
    monkeypatch.setattr(filtered, "EXACT_ROWS", 0)
    monkeypatch.setattr(filtered, "EXACT_SHARE", 0.0)
    sel = filtered._selector(np.ones(len(store), dtype=bool))
    default = filtered._params(store, store.faiss_index, sel, None, None, 0.5).nprobe
    assert filtered._params(store, store.faiss_index, sel, None, 3, 0.5).nprobe == 6  # 3 / 0.5, by hand
    assert default != 6
    # nprobe 8 of 16 lists, a filter letting half through: widened to all 16 lists, so exact
    match = np.array([m["half"] for m in metas])
    queries = ["green tea", "black coffee with milk", "cold water"]
    q = store.project_queries(index._searcher.encode_queries(queries))
    _, rows = filtered.exact(store, q, 10, np.flatnonzero(match))
    for hits, want in zip(index.search(queries, k=10, nprobe=8, filter={"half": True}, mode="dense"), rows):
        assert _ids(hits) == [store.doc_ids[r] for r in want]


@pytest.mark.parametrize("call, name", [
    (lambda: tt.fit("unused", "unused", dev_fraction=1.0), "dev_fraction"),
    (lambda: tt.fit("unused", "unused", attention_dropout=1.0), "attention_dropout"),
    (lambda: tt.fit("unused", "unused", margins=(0.5, 1.0)), "margins"),
    (lambda: tt.TrainConfig(out="unused", attention_dropout=1.0).validate(), "attention"),
])
def test_exclusive_upper_bounds_refuse_the_bound_itself(call, name):
    with pytest.raises(tt.TwoTowerError, match=name):
        call()


def test_exclusive_bounds_by_hand():
    from twotower.checks import check_number

    assert check_number(0.999, "p", below=1) == 0.999
    for value in (1, 1.0, np.float64(1.0)):
        with pytest.raises(tt.TwoTowerError, match="below 1"):
            check_number(value, "p", below=1)
    with pytest.raises(tt.TwoTowerError):
        check_number(0, "p", above=0)


@pytest.mark.parametrize("key", [" " * 16, " " * 40, "\t" * 20])
def test_a_blank_api_key_given_in_python_is_refused(tied, key):
    with pytest.raises(tt.TwoTowerError, match="empty"):
        tt.create_app(tied.path, api_key=key)


def test_the_highlight_window_of_two_equally_dense_runs_is_the_first():
    from twotower.serve.highlight import WINDOW_CHARS, Highlighter

    words = [f"w{i}" for i in range(300)]
    words[40:43] = ["tea", "and", "milk"]  # two runs: the same terms, as close together
    words[200:203] = ["tea", "and", "milk"]
    text = " ".join(words)
    h = Highlighter(None)
    shown = h.window(text, h.terms("tea milk"), WINDOW_CHARS)
    joined = "".join(s for s, _ in shown.segments)
    assert joined.count("tea") == 1 and "w41" not in joined and "w45" in joined and "w199" not in joined, joined
    assert [s for s, m in shown.segments if m] == ["tea", "milk"]


def test_true_stays_true(tied, tmp_path):
    def check(metadata, value):
        assert type(metadata["flag"]) is bool and metadata["flag"] is value, metadata
        assert type(metadata["n"]) is int

    hits = {h.id: h for h in tied.search(TIED, k=8)}
    check(hits["z0"].metadata, True)
    check(hits["a2"].metadata, False)
    check(tied.documents(["z0"])[0], True)
    check(tt.Index.open(tied.path, precision="fp32").search(TIED, k=1)[0].metadata, True)  # read back from disk
    client = serve_client(tied.path, None)
    body = client.post("/search", json={"query": TIED, "k": 1}).json()
    check(body["hits"][0]["metadata"], True)
    check(client.get("/documents/z0").json()["metadata"], True)
    assert [h.id for h in tied.search(TIED, k=8, filter={"flag": True})] == ["z0"]
    assert "z0" not in [h.id for h in tied.search(TIED, k=8, filter={"flag": 1})]
