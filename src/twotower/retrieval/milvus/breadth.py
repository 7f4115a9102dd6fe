"""The default search breadth of a Milvus ANN index (HNSW's ``ef``, IVF's ``nprobe``), calibrated at build time as
the local index's is (:mod:`twotower.retrieval.index.breadth`).

Milvus' IVF searched one list by default: on SciFact, BIN_IVF_FLAT at ``nprobe`` 1 reached NDCG@10 0.2473 against
0.6247 over every list (``benchmarks/results/milvus_binary_scifact.md``). So a build measures the breadth the index
needs, right after the collection is loaded with its index:

1. :func:`~twotower.retrieval.index.breadth.held_out_count` of the corpus's vectors, drawn at random, give midpoint
   pseudo-queries (:func:`~twotower.retrieval.index.breadth.pseudo_queries`: near no document, like real queries,
   and harder than them on every set measured there);
2. Milvus searches them at growing breadths, each hit scored as searches score it (binary: rescored), and their top
   :data:`~twotower.retrieval.index.breadth.K` rows are compared with exact inner-product search over the vectors;
3. the smallest breadth reaching recall@10 :data:`~twotower.retrieval.index.breadth.TARGET` (or within
   :data:`~twotower.retrieval.index.breadth.PLATEAU` of the best one reached: binary and int8 codes cap recall) is the
   index's default, in the manifest's ``milvus.search`` with how it was chosen.

The held-out documents themselves are no test here (they are in the collection and find themselves). HNSW's ``ef``
is never set below :data:`.client.DEFAULT_EF_SEARCH` (the default before calibration); IVF's ``nprobe`` starts at 1.
A corpus under ~200 documents keeps those defaults. A search's own ``ef_search`` / ``nprobe`` still win.

Example::

    entry = calibrate(client, uri, collection, index, kind, pks, vectors)
    # {"nprobe": 16, "calibration": {"queries": 500, "k": 10, "midpoint_recall": 0.93, ...}} (or {})
"""

from __future__ import annotations

import logging
import time

import numpy as np

from twotower.retrieval.index.breadth import (
    EF_STEPS, K, NPROBE_STEPS, PLATEAU, TARGET, held_out_count, pseudo_queries, recall_at, smallest,
)
from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus import client as mc

log = logging.getLogger(__name__)

HNSW_TYPES = ("HNSW", "HNSW_SQ")
IVF_TYPES = ("IVF_FLAT", "IVF_SQ8", "BIN_IVF_FLAT")


def load_indexed(client, name: str, uri: str, timeout: float = 3600.0) -> None:
    """Load collection ``name`` for searching with its dense index in place. On a server, first wait until the index
    covers every sealed row, then release and load again: the collection is loaded from its creation on, and a
    server swaps a segment's index in only some time after building it, so searches right after a build were
    exhaustive and turned approximate later (measured on Milvus 2.3.5, BIN_IVF_FLAT with nprobe 1: recall@1 1.0 right
    after the build, 0.22 thirty seconds on, 0.22 at once after a release and load). Milvus Lite searches its index
    as soon as it is built; its one transient load failure is retried (:func:`client.load_collection`)."""
    with mc.milvus_errors(uri, name, "loading the collection"):
        if mc.is_server(uri):
            deadline = time.monotonic() + timeout
            while True:
                info = client.describe_index(name, mc.DENSE) or {}
                if int(info.get("pending_index_rows", 0) or 0) == 0 and info.get("state", "Finished") == "Finished":
                    break
                if time.monotonic() > deadline:
                    raise mc.MilvusError(f"Milvus at {uri}, collection '{name}': the index was not built "
                                         f"within {timeout:.0f} s")
                time.sleep(0.5)
            client.release_collection(name)
        mc.load_collection(client, name, uri)


def search_params(milvus: dict, metric: str, k: int, ef_search: int | None, nprobe: int | None) -> dict:
    """Milvus' search parameters for ``k`` rows on the index the manifest's ``milvus`` entry describes: the call's
    ``ef_search`` / ``nprobe``, else the build's (:func:`calibrate`); a knob the index does not have is an error."""
    index_type = milvus["index_type"]
    hnsw, ivf = index_type in HNSW_TYPES, index_type in IVF_TYPES
    if ef_search is not None and not hnsw:
        raise IndexStoreError(f"efSearch applies to HNSW indexes; this Milvus index is {index_type}")
    if nprobe is not None and not ivf:
        raise IndexStoreError(f"nprobe applies to IVF indexes; this Milvus index is {index_type}")
    defaults = milvus.get("search", {})
    if hnsw:
        return {"metric_type": metric, "params": {"ef": max(k, ef_search or defaults.get("ef_search",
                                                                                        mc.DEFAULT_EF_SEARCH))}}
    if ivf:
        return {"metric_type": metric, "params": {"nprobe": nprobe or defaults.get("nprobe", 1)}}
    return {"metric_type": metric, "params": {}}


def calibrate(client, uri: str, collection: str, index: dict, kind, pks: list[str], vectors: np.ndarray) -> dict:
    """The ``milvus.search`` entries for the loaded ``collection`` (``index``: its :func:`.schema.index_settings`;
    ``kind``: its :class:`.vectors.MilvusVectors`; ``pks``: the key of each row of ``vectors``, float32):
    ``{knob: value, "calibration": {...}}``, or ``{}`` for an exact index or too small a corpus."""
    index_type = index["index_type"]
    knob = "ef_search" if index_type in HNSW_TYPES else "nprobe" if index_type in IVF_TYPES else None
    n = len(vectors)
    m = held_out_count(n)
    if knob is None or not m:
        return {}
    if index_type == "IVF_SQ8" and int(index["params"].get("nlist", 0)) == 1:
        return {}  # --kind flat with int8: one list, an exhaustive scan
    import faiss

    t0 = time.perf_counter()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    queries = pseudo_queries(vectors[np.random.default_rng(0).choice(n, m, replace=False)])
    k = min(K, n)
    _, truth = faiss.knn(queries, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)  # as the local calibration
    if knob == "ef_search":
        steps = [v for v in EF_STEPS if v >= mc.DEFAULT_EF_SEARCH]
    else:
        nlist = int(index["params"]["nlist"])
        steps = [v for v in NPROBE_STEPS if v < nlist] + [nlist]
    row_of = {pk: i for i, pk in enumerate(pks)}
    depth = kind.depth(k, None)
    curve: list[tuple[int, float]] = []
    for value in steps:
        params = {"metric_type": kind.metric, "params": {"ef": max(value, depth)} if knob == "ef_search"
                  else {"nprobe": value}}
        found = np.full((m, k), -1, dtype=np.int64)
        with mc.milvus_errors(uri, collection, "calibrating the search breadth"):
            for start in range(0, m, 64):
                chunk = list(range(start, min(m, start + 64)))
                hits = client.search(collection, data=kind.queries(queries[chunk]), anns_field=mc.DENSE, limit=depth,
                                     search_params=params, output_fields=["pk", *kind.fields[1:]])
                for i, h in zip(chunk, hits):
                    for j, (entity, _) in enumerate(kind.ranked(h, queries[i])[:k]):
                        found[i, j] = row_of.get(entity["pk"], -1)
        curve.append((value, recall_at(found, truth)))
        if curve[-1][1] >= TARGET:
            break
    value, recall = smallest(curve, TARGET)
    log.info("Milvus %s default %s %d: recall@%d %.3f on %d midpoint queries (%.1fs)", index_type, knob, value, k,
             recall, m, time.perf_counter() - t0)
    return {knob: int(value), "calibration": {"queries": m, "k": k, "midpoint_recall": round(recall, 4),
                                              "midpoint_target": TARGET, "plateau": PLATEAU,
                                              "seconds": round(time.perf_counter() - t0, 1)}}


__all__ = ["calibrate", "load_indexed", "search_params"]
