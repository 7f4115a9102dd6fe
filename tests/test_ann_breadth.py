"""The default search breadth an ANN index calibrates at build (retrieval.index.breadth): on a structured synthetic
set where FAISS' defaults (efSearch 16, nprobe 1) miss recall@10 0.95 against brute force, a search without
``ef_search`` / ``nprobe`` reaches it; the breadth is in the manifest, and ``add`` / ``remove`` keep it."""

from __future__ import annotations

import numpy as np
import pytest

from twotower.retrieval.index import breadth
from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs

MODEL = {"name": "test", "path": "/nonexistent"}


def _clustered(n: int, spread: float, seed: int = 0, dim: int = 64) -> np.ndarray:
    """Unit vectors around 100 random centres (``spread``: the noise's σ per dimension against unit-σ centres)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((100, dim)).astype(np.float32)
    x = centres[rng.integers(0, 100, n)] + spread * rng.standard_normal((n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _docs(vectors: np.ndarray, start: int = 0) -> NewDocs:
    ids = [f"d{i}" for i in range(start, start + len(vectors))]
    return NewDocs(ids, [""] * len(ids), [f"text {i}" for i in ids], vectors)


def _recall(store: IndexStore, queries: np.ndarray, docs: np.ndarray, **breadth_given) -> float:
    truth = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :10]  # brute force
    _, rows = store.search(queries, k=10, **breadth_given)
    return float(np.mean([len(set(r) & set(t)) / 10 for r, t in zip(rows, truth)]))


@pytest.mark.parametrize("kind, spec, spread, knob, faiss_default", [
    ("hnsw", IndexSpec(kind="hnsw", hnsw_m=4, ef_construction=40), 1.0, "ef_search", 16),
    ("ivf", IndexSpec(kind="ivf"), 2.0, "nprobe", 1),
])
def test_default_breadth_keeps_recall(tmp_path, kind, spec, spread, knob, faiss_default):
    vectors = _clustered(4200, spread)
    docs, queries = vectors[:4000], vectors[4000:]  # queries from the same distribution, not in the index
    store = IndexStore.build(tmp_path / kind, _docs(docs), model=MODEL, spec=spec, show_progress=False)
    entry = store.manifest["search"]
    calibration = entry["calibration"]
    assert entry[knob] > faiss_default and calibration["held_out"] == 400 and calibration["indexed"] == 3600
    assert calibration["held_out_recall"] >= breadth.HELD_OUT_TARGET and calibration["midpoint_recall"] >= breadth.TARGET
    assert _recall(store, queries, docs, **{knob: faiss_default}) < 0.95  # FAISS' default: not enough here
    assert _recall(store, queries, docs) >= 0.95  # no breadth given: the calibrated one
    assert _recall(store, queries, docs) == _recall(store, queries, docs, **{knob: entry[knob]})

    def stored_breadth(s: IndexStore) -> int:
        import faiss

        from twotower.retrieval.index.kinds import find

        index = s.faiss_index
        return find(index, "IndexHNSW").hnsw.efSearch if kind == "hnsw" else faiss.try_extract_index_ivf(index).nprobe

    assert stored_breadth(IndexStore.open(tmp_path / kind)) == entry[knob]
    added = store.add(_docs(_clustered(50, spread, seed=1), start=4000), show_progress=False)  # copied index
    removed = added.remove(["d3", "d4000"], show_progress=False)  # rebuilt from the copy, reset
    for s in (added, removed):
        assert s.manifest["search"] == entry and stored_breadth(IndexStore.open(s.root)) == entry[knob]


def test_small_and_exact_indexes_are_not_calibrated(tmp_path):
    """A flat index has no breadth; an index too small to hold out MIN_HELD_OUT vectors keeps FAISS' defaults."""
    vectors = _clustered(300, 1.0)
    flat = IndexStore.build(tmp_path / "flat", _docs(vectors), model=MODEL, show_progress=False)
    assert flat.manifest["search"] is None
    tiny = IndexStore.build(tmp_path / "tiny", _docs(vectors[: 10 * breadth.MIN_HELD_OUT - 1]), model=MODEL,
                            spec=IndexSpec(kind="hnsw"), show_progress=False)
    assert tiny.manifest["search"] is None
    small = IndexStore.build(tmp_path / "small", _docs(vectors[: 10 * breadth.MIN_HELD_OUT]), model=MODEL,
                             spec=IndexSpec(kind="hnsw"), show_progress=False)
    assert small.manifest["search"]["calibration"]["held_out"] == breadth.MIN_HELD_OUT


def test_calibrate_picks_the_smallest_breadth_reaching_every_target_or_the_plateau():
    """Against a stub index whose recall per efSearch is known: the first step where every query set reaches its
    target; a set whose recall plateaus below its target (quantized codes) counts from its first step within
    PLATEAU of its best."""
    import faiss

    truth = np.arange(10)[None, :].repeat(4, axis=0)

    def fake(recall_of):
        index = faiss.IndexHNSWFlat(4, 4)

        def search(q, k, params=None):
            hits = round(recall_of(params.efSearch) * 10)
            return None, np.where(np.arange(10) < hits, np.arange(10), 100)[None, :].repeat(len(q), axis=0)

        index.search = search
        return index

    q = np.zeros((4, 4), dtype=np.float32)
    reach = fake(lambda ef: 0.8 if ef < 64 else 1.0)
    assert breadth.calibrate(reach, [(q, truth, 0.97)]) == ("ef_search", 64, [1.0]) and reach.hnsw.efSearch == 64
    plateau = fake(lambda ef: 0.7 if ef < 32 else 0.9)
    assert breadth.calibrate(plateau, [(q, truth, 0.97)])[:2] == ("ef_search", 32)
    # two sets: the breadth is the larger need (0.9 reached at 32 for the first target, 1.0 at 64 for the second)
    two = fake(lambda ef: 0.8 if ef < 32 else 0.9 if ef < 64 else 1.0)
    assert breadth.calibrate(two, [(q, truth, 0.9), (q, truth, 0.97)]) == ("ef_search", 64, [1.0, 1.0])
