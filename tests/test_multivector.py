"""ME-BERT multi-vector documents: first-m token vectors, max-score search, index round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from twotower.retrieval.multivector import (
    encode_multivector, exact_multivector_search, maxsim_scores, random_projection, reduce_to_documents,
)
from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs


def test_encode_first_m_tokens_matches_the_backbone(tiny_bert_dir):
    from twotower.encoders.towers import DualEncoder

    enc = DualEncoder.load(str(tiny_bert_dir)).doc_tower
    texts = ["a b", "a much longer text with many tokens in it"]
    vecs, offsets = encode_multivector(enc, texts, 4, precision="fp32", show_progress=False)
    # "a b" has [CLS] a b [SEP] = 4 tokens; the long text is cut at m=4
    assert offsets.tolist() == [0, 4, 8] and vecs.shape == (8, 32)
    enc.eval()
    batch = enc.tokenizer([texts[1]], return_tensors="pt")
    with torch.no_grad():
        hidden = enc.backbone(**batch).last_hidden_state[0, :4]
    expected = torch.nn.functional.normalize(hidden, dim=-1).numpy()
    np.testing.assert_allclose(vecs[4:8], expected, atol=1e-5)
    proj = random_projection(32, 8)
    pv, _ = encode_multivector(enc, texts, 4, precision="fp32", projection=proj, show_progress=False)
    assert pv.shape == (8, 8) and np.allclose(np.linalg.norm(pv, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="m must be at least 1"):
        encode_multivector(enc, texts, 0)


def _random_multi(n_docs=40, m=3, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, m + 1, size=n_docs)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    vecs = rng.standard_normal((offsets[-1], dim)).astype(np.float32)
    return vecs, offsets


def test_max_score_by_hand():
    vecs = np.array([[1, 0], [0, 1], [0.5, 0.5], [-1, 0]], dtype=np.float32)
    offsets = np.array([0, 2, 4])
    q = np.array([[0.2, 0.9]], dtype=np.float32)
    assert maxsim_scores(q, vecs, offsets, [0, 1]).tolist() == [[pytest.approx(0.9), pytest.approx(0.55)]]
    s, i = exact_multivector_search(q, vecs, offsets, 2)
    assert i.tolist() == [[0, 1]] and s[0].tolist() == pytest.approx([0.9, 0.55])


def test_reduce_equals_exact_when_all_entries_are_hits():
    vecs, offsets = _random_multi()
    q = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    all_entries = np.tile(np.arange(len(vecs)), (5, 1))
    s1, d1 = reduce_to_documents(q, all_entries, vecs, offsets, 10)
    s2, d2 = exact_multivector_search(q, vecs, offsets, 10)
    np.testing.assert_array_equal(d1, d2)
    np.testing.assert_allclose(s1, s2, rtol=1e-5)


def test_multivector_store_round_trip(tmp_path):
    vecs, offsets = _random_multi()
    ids = [f"d{i}" for i in range(40)]
    store = IndexStore.build(tmp_path / "mv", NewDocs(ids, ids, ids, vecs, offsets), model={"name": "t"},
                             spec=IndexSpec(kind="hnsw", hnsw_m=8), multivector=3, show_progress=False)
    assert store.manifest["num_vectors"] == len(vecs) and store.multivector == 3
    q = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    s, rows = IndexStore.open(tmp_path / "mv").search(q, 5, ef_search=64)
    es, erows = exact_multivector_search(q, vecs, offsets, 5)
    np.testing.assert_array_equal(rows, erows)
    np.testing.assert_allclose(s, es, rtol=1e-5)
    # add a multi-vector document and remove one; the offsets follow
    new_vecs = np.ones((2, 8), dtype=np.float32)
    grown = store.add(NewDocs(["n"], ["n"], ["n"], new_vecs, np.array([0, 2])), show_progress=False)
    np.testing.assert_array_equal(grown.vectors_for(["n"])[0], new_vecs)
    shrunk = grown.remove(["d0"], show_progress=False)
    np.testing.assert_array_equal(shrunk.vectors_for(["d5"])[0], vecs[offsets[5] : offsets[6]])
    _, rows = shrunk.search(np.ones((1, 8), np.float32), 1, candidates=200)
    assert shrunk.doc_ids[rows[0, 0]] == "n"


def test_build_multivector_index_from_text(tiny_beir, tiny_bert_dir, tmp_path):
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    s = build_index(tiny_beir, tmp_path / "mv", model=str(tiny_bert_dir), multivector=4, project_dim=16,
                    cfg=EncodeConfig(precision="fp32", show_progress=False))
    assert s.dim == 16 and s.projection.shape == (32, 16) and s.manifest["num_vectors"] == 24
    hits = Searcher(tmp_path / "mv").search("green tea", k=6)
    assert sorted(h.doc_id for h in hits) == [f"d{i}" for i in range(1, 7)]
