"""int8 vectors on Milvus (issue #54): ``vectors="int8"`` maps to Milvus' 8-bit scalar-quantized indexes (flat:
IVF_SQ8 with one list, an exhaustive scan of the codes; hnsw: HNSW_SQ; ivf: IVF_SQ8), against the real Milvus Lite.
Their top 10 agree with exact fp32 search as the local int8 index's do, and the manifest says what is stored."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from twotower.retrieval.index.kinds import IndexSpec  # noqa: E402
from twotower.retrieval.index.newdocs import NewDocs  # noqa: E402
from twotower.retrieval.milvus.store import MilvusStore, forget_client  # noqa: E402
from twotower.retrieval.store import IndexStore  # noqa: E402


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean([len(set(x) & set(y)) / len(y) for x, y in zip(a, b)]))


@pytest.mark.parametrize("kind,index_type", [("flat", "IVF_SQ8"), ("hnsw", "HNSW_SQ")])
def test_int8_on_milvus_ranks_as_the_local_int8_index(tmp_path, kind, index_type):
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((20, 32)).astype(np.float32)
    v = centers[rng.integers(0, 20, 2000)] + 0.5 * rng.standard_normal((2000, 32)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = v[rng.choice(2000, 50, replace=False)] + 0.1 * rng.standard_normal((50, 32)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ids = [f"d{i}" for i in range(2000)]
    docs = NewDocs(ids, [""] * 2000, ["text"] * 2000, v)
    exact = np.argsort(-(q @ v.T), axis=1)[:, :10]
    uri = str(tmp_path / "int8.db")
    store = MilvusStore.build(tmp_path / "m", docs, model={"name": "random"}, spec=IndexSpec(kind=kind, vectors="int8"),
                              uri=uri, collection=f"int8_{kind}", show_progress=False)
    try:
        assert store.manifest["milvus"]["index_type"] == index_type
        assert store.manifest["vectors"]["type"] == "int8" and index_type in store.manifest["vectors"]["stored"]
        scores, rows = store.search(q, 10, **({"ef_search": 200} if kind == "hnsw" else {}))
        got = np.asarray([[int(store.doc_ids[r][1:]) for r in row] for row in rows])
        local = IndexStore.build(tmp_path / "l", docs, model={"name": "random"}, spec=IndexSpec(vectors="int8"),
                                 show_progress=False)
        _, local_rows = local.search(q, 10)
        assert _overlap(got, exact) >= _overlap(local_rows, exact) - 0.03 >= 0.85
        assert np.allclose(scores[:, 0], (q * v[got[:, 0]]).sum(1), atol=0.02)  # int8 scores near the true ones
    finally:
        forget_client(uri)
