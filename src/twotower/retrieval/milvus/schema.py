"""A twotower collection on Milvus: its schema (a row per passage), its dense and sparse index types, and the checks
that a collection is the one an index directory names (the properties twotower stamps on it)."""

from __future__ import annotations

import math
from pathlib import Path

from twotower.checks import flag, given
from twotower.errors import TwoTowerError
from twotower.retrieval.milvus.client import (
    CODES,
    DENSE,
    MAX_ID_BYTES,
    MAX_VARCHAR,
    METADATA,
    SPARSE,
    MilvusError,
    milvus_errors,
)

SCHEMA_VERSION = 5  # 2: rows keyed <write>:<id> with added/removed write numbers, a __state collection; 3: metadata;
# 4: rows keyed <attempt>:<id> with the attempt's token, and each document's BM25 length and the avgdl of its weights;
# 5: a row per passage (``passage``, ``span_start``, ``span_end``), the document's own row being passage 0
# index kinds twotower builds on Milvus: --kind -> Milvus index type
INDEX_TYPES = {"flat": "FLAT", "hnsw": "HNSW", "ivf": "IVF_FLAT"}
PROPERTY = "twotower"  # collection properties: twotower.index_id, twotower.model, twotower.dim, twotower.schema


def index_settings(kind: str, *, hnsw_m: int, ef_construction: int, nlist: int | None, num_docs: int,
                   vectors: str = "fp32") -> dict:
    """The Milvus index for ``--kind`` and ``--vectors``: ``{"index_type", "params"}`` (metric IP on normalised
    vectors). ``int8``: Milvus' 8-bit scalar-quantized indexes (HNSW_SQ, IVF_SQ8; ``flat``: IVF_SQ8 with one list,
    an exhaustive scan of the codes, as the local int8 index); ``binary``: BIN_FLAT or BIN_IVF_FLAT (Hamming,
    :mod:`.vectors`)."""
    if kind not in INDEX_TYPES:
        raise TwoTowerError(f"{given('kind', kind)}: on Milvus choose one of {', '.join(INDEX_TYPES)} (FAISS factory "
                            f"strings and ivfpq need {given('backend', 'faiss')})")
    lists = int(nlist or max(1, min(65_536, int(4 * math.sqrt(max(1, num_docs))))))  # IVF: given, or 4·√n
    if vectors == "binary":  # Milvus' binary indexes: an exhaustive scan or inverted lists, Hamming distance
        if kind == "hnsw":
            raise TwoTowerError(f"{given('kind', 'hnsw')} with {given('vectors', 'binary')}: Milvus indexes binary "
                                f"vectors as BIN_FLAT or BIN_IVF_FLAT; choose {given('kind', 'flat')} or "
                                f"{given('kind', 'ivf')} (or {given('backend', 'faiss')} for a binary HNSW)")
        if kind == "ivf":
            return {"index_type": "BIN_IVF_FLAT", "params": {"nlist": lists}}
        return {"index_type": "BIN_FLAT", "params": {}}
    if vectors == "int8":
        if kind == "hnsw":
            return {"index_type": "HNSW_SQ", "params": {"M": int(hnsw_m), "efConstruction": int(ef_construction),
                                                        "sq_type": "SQ8"}}
        return {"index_type": "IVF_SQ8", "params": {"nlist": 1 if kind == "flat" else lists}}
    if kind == "hnsw":
        return {"index_type": "HNSW", "params": {"M": int(hnsw_m), "efConstruction": int(ef_construction)}}
    if kind == "ivf":
        return {"index_type": "IVF_FLAT", "params": {"nlist": lists}}
    return {"index_type": "FLAT", "params": {}}


def create_collection(client, name: str, *, dim: int, lexical: bool, index: dict, properties: dict,
                      uri: str, vectors=None) -> None:
    """The collection: ``pk`` (primary key ``<attempt>:<id>``), ``id``, ``title``, ``text``, ``dense`` (``dim``
    floats), ``added`` / ``removed`` (the writes that added and removed the row) and ``attempt`` (the token of the
    write attempt that wrote it: see :mod:`.state`) and, with ``lexical``, ``sparse`` (twotower's BM25 weights),
    ``length`` (the document's number of BM25 terms) and ``avgdl`` (the average length its weights were computed
    with: :mod:`.lexical`), ``metadata`` (JSON: the document's metadata, ``{}`` when it
    has none; filters run on it, :mod:`.filtering`); its dense index as ``index`` says, metric IP.

    A document is one row per passage (:mod:`.writes`): ``passage`` numbers them from 0, ``span_start`` /
    ``span_end`` are the passage's character offsets into the document's text. Passage 0's row is the document's:
    it alone holds the title, the text and the BM25 vector; every row holds the metadata (filters select rows).

    ``vectors`` (a :class:`.vectors.MilvusVectors`; default fp32): ``dense``'s type and metric, and for binary
    vectors rescored from codes a ``codes`` field."""
    from pymilvus import DataType

    with milvus_errors(uri, name, "creating the collection"):
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES + 48)
        schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
        schema.add_field("passage", DataType.INT64)
        schema.add_field("span_start", DataType.INT64)
        schema.add_field("span_end", DataType.INT64)
        schema.add_field("added", DataType.INT64)
        schema.add_field("removed", DataType.INT64)
        schema.add_field("attempt", DataType.INT64)
        schema.add_field("length", DataType.INT64)
        schema.add_field("avgdl", DataType.DOUBLE)
        schema.add_field("title", DataType.VARCHAR, max_length=MAX_VARCHAR)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_VARCHAR)
        schema.add_field(METADATA, DataType.JSON)
        schema.add_field(DENSE, getattr(DataType, vectors.field_type if vectors else "FLOAT_VECTOR"), dim=int(dim))
        if vectors is not None and vectors.rescores:
            schema.add_field(CODES, DataType.VARCHAR, max_length=vectors.codes_length)
        if lexical:
            schema.add_field(SPARSE, DataType.SPARSE_FLOAT_VECTOR)
        params = client.prepare_index_params()
        # pymilvus 3 sends the settings as top-level keys, which a Milvus server reads; Milvus Lite reads only a
        # "params" key (without it, IVF got 128 lists and HNSW its defaults whatever was asked): both
        settings = dict(index["params"])
        params.add_index(DENSE, index_type=index["index_type"], metric_type=vectors.metric if vectors else "IP",
                         params={**settings, "params": settings} if settings else {})
        if lexical:
            params.add_index(SPARSE, index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        client.create_collection(name, schema=schema, index_params=params,
                                 properties={f"{PROPERTY}.{k}": str(v) for k, v in properties.items()},
                                 consistency_level="Strong")


def owner_properties(client, name: str, uri: str) -> dict | None:
    """The twotower properties of collection ``name`` (``{}`` for a collection twotower did not make), None when
    there is no such collection."""
    with milvus_errors(uri, name, "reading the collection"):
        if not client.has_collection(name):
            return None
        described = client.describe_collection(name)
    props = described.get("properties") or {}
    out = {k.split(".", 1)[1]: v for k, v in props.items() if k.startswith(PROPERTY + ".")}
    for field in described.get("fields", []):
        if field.get("name") == DENSE:
            out["field_dim"] = str((field.get("params") or {}).get("dim"))
    return out


def check_owner(client, manifest: dict, index_dir: Path) -> None:
    """The collection the manifest names exists and was built for this index (its id, model and dimension)."""
    m = manifest["milvus"]
    uri, name = m["uri"], m["collection"]
    props = owner_properties(client, name, uri)
    if props is None:
        raise MilvusError(f"{index_dir}: its Milvus collection '{name}' at {uri} does not exist (dropped?): rebuild "
                          "the index with 'twotower index build --backend milvus'")
    want_model = str(manifest["model"].get("name"))
    if props.get("index_id") != m["index_id"]:
        raise MilvusError(
            f"{index_dir}: the Milvus collection '{name}' at {uri} belongs to another index (model "
            f"{props.get('model', 'unknown')}, {props.get('field_dim', '?')}-d vectors, corpus "
            f"{props.get('corpus', 'unknown')[:12]}…), not to this one (model {want_model}, {manifest['dim']}-d, corpus "
            f"{str((manifest.get('corpus') or {}).get('fingerprint', ''))[:12]}…): rebuild this index into a "
            f"collection of its own ({flag('collection')})")
    if props.get("schema") != str(SCHEMA_VERSION):
        raise MilvusError(f"{index_dir}: the Milvus collection '{name}' at {uri} has the layout of an older twotower "
                          f"(schema {props.get('schema')}, this one reads {SCHEMA_VERSION}): rebuild the index with "
                          "'twotower index build --backend milvus'")
    if props.get("field_dim") != str(manifest["dim"]) or props.get("model") != want_model:
        raise MilvusError(f"{index_dir}: the Milvus collection '{name}' at {uri} holds {props.get('field_dim')}-d "
                          f"vectors of model {props.get('model')}, the manifest says {manifest['dim']}-d of "
                          f"{want_model}: rebuild the index")
