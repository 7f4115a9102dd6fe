"""``index build --backend milvus``: check everything, fill a collection, write the manifest
(:meth:`.store.MilvusStore.build` and ``attach`` call these; the encoding comes first:
``retrieval.indexing.build_milvus_from``).

Everything that can fail without encoding is checked first: the URI (a server must answer, a Lite file's folder
must exist), the collection name and that no other index (or anything not made by twotower) owns that collection,
the index kind, and the options a Milvus index does not take (multi-vector, cut dimensions; binary
vectors on Milvus Lite; a server's missing field types, by a probe collection). Re-building an
index directory into the collection it already names drops and re-fills that collection.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np

from twotower.checks import flag, given, switch
from twotower.errors import TwoTowerError
from twotower.retrieval.index import fingerprint
from twotower.retrieval.index.codecs import check_vectors
from twotower.retrieval.index.lock import writer_lock
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.index.versions import (
    FORMAT, FORMAT_VERSION, check_target, current_version, discard_unfinished, is_index_dir, read_manifest,
)
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus import schema
from twotower.retrieval.milvus.breadth import calibrate, load_indexed
from twotower.retrieval.milvus.client import client_for
from twotower.retrieval.milvus.filtering import metadata_kinds
from twotower.retrieval.milvus.lexical import SparseBM25
from twotower.retrieval.milvus.state import State, create_state, new_token, state_name
from twotower.retrieval.milvus.vectors import FIELD_TYPES, SERVER_ONLY, MilvusVectors
from twotower.retrieval.milvus.writes import METADATA_KINDS, check_sizes, doc_rows, put_rows, write_version

log = logging.getLogger(__name__)

LEXICAL = "twotower-bm25-sparse"  # the manifest's milvus.lexical: twotower's BM25 weights as sparse vectors


def check_options(root: Path, spec, *, uri: str | None, collection: str | None, multivector=None, project=None,
                  num_docs: int = 0):
    """(uri, collection, index settings, client) for a build at ``root``, or the error of the first bad option."""
    if multivector or project:
        raise TwoTowerError(f"{flag('multivector')}/{flag('project')}: a Milvus index holds one vector per document; "
                            f"use {given('backend', 'faiss')} for multi-vector indexes")
    if spec.dim is not None:
        raise TwoTowerError(f"{flag('dim')} {spec.dim}: a Milvus index stores vectors at the model's dimension; use "
                            f"{given('backend', 'faiss')} to cut them")
    if spec.vectors not in FIELD_TYPES:
        raise TwoTowerError(f"{given('vectors', spec.vectors)}: a Milvus index stores {', '.join(FIELD_TYPES)} "
                            "vectors (half precision: Milvus 2.3.5's server crashes writing float16 vectors into a "
                            f"loaded collection, so it is not offered); use {given('vectors', 'int8')}, or "
                            f"{given('backend', 'faiss')}")
    check_vectors(vectors=spec.vectors, dim=None, rescore=spec.rescore, rescore_factor=spec.rescore_factor,
                  kind="flat", source_dim=8)  # rescore and its factor (the kind: index_settings)
    uri = mc.check_uri(uri)
    if spec.vectors in SERVER_ONLY and not mc.is_server(uri):
        raise TwoTowerError(f"{given('vectors', spec.vectors)}: Milvus Lite ({uri}) has no "
                            f"{FIELD_TYPES[spec.vectors]} field; give a Milvus server ({flag('uri')} "
                            f"http://host:19530, Milvus 2.3 or later), or {given('vectors', 'int8')} (a "
                            f"scalar-quantized index Milvus Lite has), or {given('backend', 'faiss')}")
    collection = mc.check_collection_name(collection or mc.default_collection(root))
    index = schema.index_settings(spec.kind, hnsw_m=spec.hnsw_m, ef_construction=spec.ef_construction, nlist=spec.nlist,
                                  num_docs=num_docs, vectors=spec.vectors)
    check_target(root)
    client = client_for(uri, flag("uri"))
    if spec.vectors in SERVER_ONLY:
        _probe(client, uri, spec, index)
    props = schema.owner_properties(client, collection, uri)
    if props is not None and not _ours(root, uri, collection, props):
        owner = (f"the index of model {props.get('model')} ({props.get('field_dim')}-d)" if props.get("index_id")
                 else "a collection twotower did not make")
        raise TwoTowerError(f"{given('collection', collection)}: {uri} already holds a collection of that name "
                            f"({owner}); choose another {flag('collection')}, or drop that one first")
    return uri, collection, index, client


def _probe(client, uri: str, spec, index: dict) -> None:
    """Create (and drop) a collection of the schema a build with ``spec`` makes, before any encoding: a server
    without the vector field's type (or, with BM25, sparse vectors: Milvus 2.4) refuses it now, not after an hour of
    encoding."""
    name = f"twotower_probe_{uuid.uuid4().hex}"
    kind = MilvusVectors.for_build(spec, np.zeros((1, 8), dtype=np.float32))
    try:
        schema.create_collection(client, name, dim=8, lexical=spec.bm25, index=dict(index, params={
            k: (1 if k == "nlist" else v) for k, v in index["params"].items()}), properties={}, uri=uri, vectors=kind)
    except mc.MilvusError as exc:
        bm25 = (f"; a BM25 part needs sparse vectors (Milvus 2.4 or later): build without {switch('bm25')} if "
                "this server is older") if spec.bm25 else ""
        raise TwoTowerError(f"{given('vectors', spec.vectors)}: the Milvus server at {uri} refused a collection with a "
                            f"{kind.field_type} field{' and a BM25 sparse field' if spec.bm25 else ''} and a "
                            f"{index['index_type']} index ({exc}){bm25}") from None
    finally:
        with contextlib.suppress(Exception):
            client.drop_collection(name)


def _ours(root: Path, uri: str, collection: str, props: dict) -> bool:
    """Whether the collection belongs to the index at ``root`` (a rebuild may replace it)."""
    if not is_index_dir(root):
        return False
    try:
        m = read_manifest(root / "versions" / current_version(root) / "manifest.json").get("milvus") or {}
    except (OSError, TwoTowerError):
        return False
    return m.get("uri") == uri and m.get("collection") == collection and m.get("index_id") == props.get("index_id")


def build_version(root: Path, new: NewDocs, *, model: dict, spec, uri: str, collection: str, index: dict, client,
                  keep: int = 2, show_progress: bool = True, passages: dict | None = None) -> tuple[Path, dict]:
    """Fill ``collection`` with the encoded documents ``new`` and publish the manifest at ``root``: the version's
    folder and manifest (``uri``, ``collection``, ``index``, ``client``: what :func:`check_options` returned;
    ``passages``: the :class:`~twotower.encoders.passages.PassageSpec` entry ``new`` was split by, a row each)."""
    root = Path(root)
    check_sizes(new)
    created = not root.exists()
    first = created or not (root / "CURRENT").exists()
    dim = int(new.vectors.shape[1])
    corpus = fingerprint.entry(fingerprint.combine(zip(new.ids, new.titles, new.texts)))
    index_id = uuid.uuid4().hex
    kind = MilvusVectors.for_build(spec, new.vectors)
    made = False
    try:
        with writer_lock(root):
            t0 = time.perf_counter()
            lexicon, weighed = (SparseBM25.build(new.ids, [f"{t} {x}".strip() if t else x for t, x in
                                                          zip(new.titles, new.texts)], spec.bm25_params,
                                                show_progress=show_progress) if spec.bm25 else (None, None))
            if schema.owner_properties(client, collection, uri) is not None:  # this index's own: re-filled
                log.warning("dropping Milvus collection '%s' at %s to rebuild it", collection, uri)
                with mc.milvus_errors(uri, collection, "dropping the old collection"):
                    client.drop_collection(collection)
            with mc.milvus_errors(uri, collection, "dropping the old state collection"):
                if client.has_collection(state_name(collection)):
                    client.drop_collection(state_name(collection))
            schema.create_collection(client, collection, dim=dim, lexical=spec.bm25, index=index, uri=uri, properties={
                "index_id": index_id, "model": model.get("name"), "dim": dim, "schema": schema.SCHEMA_VERSION,
                "corpus": corpus["fingerprint"]}, vectors=kind)
            made = True
            create_state(client, collection, uri)
            token = new_token()
            rows = doc_rows(new, weighed, 1, token, kind)
            put_rows(client, uri, collection, rows, show_progress=show_progress, building=True)
            load_indexed(client, collection, uri)
            search = {"ef_search": mc.DEFAULT_EF_SEARCH, "nprobe": 1,
                      **calibrate(client, uri, collection, index, kind, [r["pk"] for r in rows], new.vectors)}
            del rows
            manifest = {
                "format": FORMAT, "format_version": FORMAT_VERSION, "backend": "milvus", "version": 0,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": model, "dim": dim,
                "vectors": kind.manifest_entry(index["index_type"]),
                "kind": spec.kind, "factory": f"milvus {index['index_type']}", "metric": "inner_product",
                "spec": {"hnsw_m": spec.hnsw_m, "ef_construction": spec.ef_construction, "nlist": spec.nlist},
                "num_docs": len(new.ids), "num_vectors": len(new.vectors), "multivector": None,
                "passages": passages, "num_passages": len(new.vectors) if passages is not None else None,
                "bm25": asdict(lexicon.params) if lexicon is not None else None, "corpus": corpus,
                METADATA_KINDS: metadata_kinds(new.metadata or []),
                "milvus": {"uri": uri, "collection": collection, "index_id": index_id,
                           "schema_version": schema.SCHEMA_VERSION, "index_type": index["index_type"],
                           "index_params": index["params"], "metric": kind.metric,
                           "search": search,
                           "lexical": LEXICAL if lexicon is not None else None},
                "build_s": round(time.perf_counter() - t0, 3),
            }
            state = State(client, uri, collection)
            blobs = state.save_lexicon(1, token, lexicon) if lexicon is not None else {}
            state.save_value({"seq": 1, "token": token, "manifest": dict(manifest, version=1), "blobs": blobs,
                              "blobs_of": [1, token], "deltas": [], "write": None, "losers": [], "removed": 0,
                              "prev_keep": []})
            state._put({"dec:1": json.dumps({"token": token}), "marked:1": "1"})  # a new collection: no rival
            state.hint(1)
            final = write_version(root, manifest, None, keep=keep)  # the folder names the collection; the rest: Milvus
    except BaseException:
        if made:
            with contextlib.suppress(Exception):
                client.drop_collection(collection)
            with contextlib.suppress(Exception):
                client.drop_collection(state_name(collection))
        if first:
            discard_unfinished(root, created=created)
        raise
    return final, manifest


def attach_version(out: str | Path, uri: str, collection: str) -> tuple[Path, dict]:
    """A version of the index folder ``out`` for the Milvus index in ``collection`` at ``uri``, from what Milvus
    holds (the manifest in the collection's state), and its manifest: how a replica on another machine gets its
    folder, with the URI it reaches the server by. The folder is a cache: deleting it loses nothing."""
    out = Path(out)
    uri = mc.check_uri(uri)
    collection = mc.check_collection_name(collection)
    check_target(out)
    client = client_for(uri, flag("uri"))
    props = schema.owner_properties(client, collection, uri)
    if props is None or not props.get("index_id"):
        raise TwoTowerError(f"{given('collection', collection)}: {uri} holds no twotower index of that name"
                            + (" (a collection twotower did not make)" if props is not None else ""))
    state = State(client, uri, collection)
    state.load()
    head = state.head()
    manifest = {k: v for k, v in head["manifest"].items() if k != "files"}
    manifest["milvus"] = dict(manifest["milvus"], uri=uri)  # this machine's way to the server
    created = not out.exists()
    try:
        with writer_lock(out):
            final = write_version(out, manifest, None)
    except BaseException:
        discard_unfinished(out, created=created)
        raise
    return final, manifest


__all__ = ["LEXICAL", "attach_version", "build_version", "check_options"]
