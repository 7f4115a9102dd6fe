"""The default search breadth of a Milvus IVF / HNSW index is calibrated at build (:mod:`twotower.retrieval.milvus.
breadth`), against the real Milvus Lite: a default search reaches the recall an explicit ``nprobe`` 1 (the default
before) does not, and the manifest says what was chosen and measured."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from twotower.retrieval.index.kinds import IndexSpec  # noqa: E402
from twotower.retrieval.index.newdocs import NewDocs  # noqa: E402
from twotower.retrieval.milvus.store import MilvusStore, forget_client  # noqa: E402


def test_ivf_on_milvus_searches_as_many_lists_as_its_calibration_needs(tmp_path):
    rng = np.random.default_rng(0)
    n, dim = 3000, 32
    centers = rng.standard_normal((40, dim)).astype(np.float32)
    v = centers[rng.integers(0, 40, n)] + 0.8 * rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = (v[rng.choice(n, 60, replace=False)] + v[rng.choice(n, 60, replace=False)])  # between documents, as queries
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    exact = np.argsort(-(q @ v.T), axis=1)[:, :10]
    uri = str(tmp_path / "b.db")
    store = MilvusStore.build(tmp_path / "m", NewDocs([f"d{i}" for i in range(n)], [""] * n, ["t"] * n, v),
                              model={"name": "random"}, spec=IndexSpec(kind="ivf", nlist=64), uri=uri,
                              collection="ivf", show_progress=False)
    try:
        search = store.manifest["milvus"]["search"]
        assert 1 < search["nprobe"] <= 64 and search["calibration"]["queries"] == 300
        assert search["calibration"]["midpoint_recall"] >= 0.9
        _, rows = store.search(q, 10)
        default = np.mean([len({int(store.doc_ids[r][1:]) for r in row if r >= 0} & set(e)) / 10
                           for row, e in zip(rows, exact)])
        _, rows = store.search(q, 10, nprobe=1)
        one = np.mean([len({int(store.doc_ids[r][1:]) for r in row if r >= 0} & set(e)) / 10
                       for row, e in zip(rows, exact)])
        assert default >= 0.9 and one < default - 0.2
        # a write keeps the build's breadth
        store = store.add(NewDocs(["x1"], [""], ["t"], v[:1]), show_progress=False)
        assert store.manifest["milvus"]["search"]["nprobe"] == search["nprobe"]
    finally:
        forget_client(uri)


def test_small_and_exact_indexes_keep_the_defaults(tmp_path):
    rng = np.random.default_rng(1)
    v = rng.standard_normal((150, 16)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    uri = str(tmp_path / "s.db")
    try:
        for kind in ("ivf", "flat"):
            store = MilvusStore.build(tmp_path / kind, NewDocs([f"d{i}" for i in range(150)], [""] * 150, ["t"] * 150,
                                                               v), model={"name": "random"}, spec=IndexSpec(kind=kind),
                                      uri=uri, collection=f"small_{kind}", show_progress=False)
            assert store.manifest["milvus"]["search"] == {"ef_search": 128, "nprobe": 1}
    finally:
        forget_client(uri)
