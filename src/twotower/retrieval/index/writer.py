"""Writing one version of an index: the new documents, the kept rows of the previous version (checked
against their checksums first: a write never copies corrupt bytes into a version with fresh sums),
the FAISS index, BM25, and the manifest."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from twotower.io import load_npy, preallocate
from twotower.retrieval.bm25 import BM25
from twotower.retrieval.index import breadth, codecs, fingerprint, kinds
from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.index.files import REBUILT, VersionFiles, describe, save_npy
from twotower.retrieval.index.ids import DocIds, write_ids
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.index.versions import FORMAT, FORMAT_VERSION, collect_garbage, new_temp_dir, publish

log = logging.getLogger(__name__)


class PreviousVersion(Protocol):
    """What a write reads of the version it starts from (an opened :class:`twotower.retrieval.store.IndexStore`)."""

    dir: Path
    manifest: dict
    files: VersionFiles
    codec: codecs.Codec
    offsets: np.ndarray | None
    spans: np.ndarray | None
    doc_ids: DocIds

    @property
    def vectors(self) -> np.ndarray: ...

    def document_bytes(self, row: int) -> bytes: ...

    def document_fields(self, row: int) -> tuple[str, str, str]: ...

    def spec(self) -> kinds.IndexSpec: ...


def write_version(
    root: Path,
    *,
    previous: PreviousVersion | None,
    keep_mask: np.ndarray | None,
    new: NewDocs | None,
    model: dict,
    spec: kinds.IndexSpec,
    multivector: int | None,
    projection: np.ndarray | None,
    keep: int,
    show_progress: bool,
    passages: dict | None = None,
) -> tuple[Path, dict]:
    """Write a complete version into a temp dir, rename it into place, then switch CURRENT (call under
    the writer lock). Returns the new version's dir and manifest."""
    if previous is not None:  # every file copied from it must still match its checksum
        previous.files.check_all(writing=True, skip=REBUILT)
    from twotower.io import reporting_full_disk

    with reporting_full_disk(root, "the index is as it was"):  # ENOSPC, FAISS's errno 28: named, not a traceback
        tmp = new_temp_dir(root)
        try:
            manifest = fill_version(tmp, previous, keep_mask, new, model, spec, multivector, projection,
                                    show_progress, passages=passages)
            final = publish(root, tmp, manifest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    collect_garbage(root / "versions", final.name, keep)
    log.info("%s: version %s live (%d documents)", root, final.name, manifest["num_docs"])
    return final, manifest


def fill_version(
    out: Path,
    previous: PreviousVersion | None,
    keep_mask: np.ndarray | None,
    new: NewDocs | None,
    model: dict,
    spec: kinds.IndexSpec,
    multivector: int | None,
    projection: np.ndarray | None,
    show_progress: bool,
    passages: dict | None = None,
) -> dict:
    """Write every file of a version into ``out`` and return its manifest (``version`` 0: see ``publish``).
    ``passages``: the passage spec of an index that splits long documents (``encoders.passages``; its vector rows are
    passages, with ``offsets.npy`` and ``spans.npy``)."""
    import faiss

    if previous is None and new is None:
        raise ValueError("nothing to write")
    codec = previous.codec if previous is not None else new_codec(spec, new.vectors)
    new_f = codec.cut(new.vectors) if new is not None else None  # float32 at the stored dimension
    dim = codec.dim

    # which old documents stay, and how many vectors each has
    old_rows = np.flatnonzero(keep_mask) if previous is not None else np.empty(0, dtype=np.int64)
    if previous is not None and previous.offsets is not None:
        old_counts = np.diff(previous.offsets)[old_rows]
    else:
        old_counts = np.ones(len(old_rows), dtype=np.int64)
    new_counts = (
        np.diff(new.offsets) if new is not None and new.offsets is not None
        else np.ones(len(new.ids) if new is not None else 0, dtype=np.int64)
    )
    counts = np.concatenate([old_counts, new_counts]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    num_vectors = int(offsets[-1])
    num_docs = len(counts)
    if num_docs == 0:
        raise IndexStoreError("an index needs at least one document")

    if passages is not None and new is not None and new.spans is None:
        raise IndexStoreError("this index keeps passages: new documents need their passage spans")
    old_vec = kept_vector_rows(previous, old_rows)
    new_stored = codec.encode(new_f) if new is not None else None
    vectors = _write_vectors(out / "vectors.npy", previous, old_vec, new_stored, num_vectors, codec)
    _write_documents(out, previous, old_rows, new)
    if multivector is not None or passages is not None:
        save_npy(out / "offsets.npy", offsets)
    if passages is not None:
        old_spans = (np.asarray(previous.spans)[old_vec] if previous is not None and previous.spans is not None
                     else np.empty((0, 2), dtype=np.int64))
        new_spans = new.spans if new is not None else np.empty((0, 2), dtype=np.int64)
        save_npy(out / "spans.npy", np.concatenate([old_spans, new_spans]).astype(np.int64))
    if projection is not None:
        save_npy(out / "projection.npy", np.asarray(projection, dtype=np.float32))
    if codec.calibration is not None:
        save_npy(out / "calibration.npy", np.asarray(codec.calibration, dtype=np.float32))

    # FAISS: add to a copy of the previous index when nothing was dropped, else rebuild
    t0 = time.perf_counter()
    search = previous.manifest.get("search") if previous is not None else None  # a copied index keeps its breadth
    if codec.vectors == "binary":
        index, factory = _binary_index(previous, keep_mask, old_vec, new_f, spec, dim)
        faiss.write_index_binary(index, str(out / "faiss.index"))
    else:
        if previous is not None and keep_mask.all():
            index = faiss.clone_index(_readable(previous))
            factory = previous.manifest["factory"]
            if new is not None:
                kinds.add_in_chunks(index, new_f, show_progress=show_progress, desc="indexing new vectors")
        elif previous is not None:
            index = faiss.clone_index(_readable(previous))
            index.reset()  # keeps the trained quantizer / codebooks / int8 ranges
            factory = previous.manifest["factory"]
            kinds.add_in_chunks(index, _Decoded(vectors, codec), show_progress=show_progress)
        else:
            index, factory = kinds.new_faiss_index(spec, new_f, show_progress=show_progress,
                                                   calibration=codec.calibration)
            search = breadth.add_calibrated(index, new_f, show_progress=show_progress) or None
        faiss.write_index(index, str(out / "faiss.index"))
    faiss_s = time.perf_counter() - t0

    # BM25 over title + text of every document (bm25s indexes are rebuilt, not appended to)
    bm25_manifest = None
    if spec.bm25:
        ids, texts = [], []
        with (out / "docs.jsonl").open("rb") as handle:
            for line in handle:
                d = json.loads(line)
                ids.append(d["_id"])
                texts.append(f"{d['title']} {d['text']}".strip() if d["title"] else d["text"])
        bm25 = BM25(spec.bm25_params).index(ids, texts, show_progress=show_progress)
        bm25.save(out / "bm25")
        bm25_manifest = asdict(bm25.params)  # language "auto" recorded as the one detected

    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "version": 0,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model,
        "dim": int(dim),
        "vectors": codec.manifest(),
        "kind": spec.kind,
        "factory": factory,
        "metric": "inner_product",
        "spec": {"hnsw_m": spec.hnsw_m, "ef_construction": spec.ef_construction, "nlist": spec.nlist,
                 "pq_m": spec.pq_m, "train_size": spec.train_size},
        "search": search,  # the default ef_search / nprobe calibrated at the first build (retrieval.index.breadth)
        "num_docs": num_docs,
        "num_vectors": num_vectors,
        "multivector": multivector,
        "passages": passages,
        "num_passages": num_vectors if passages is not None else None,
        "bm25": bm25_manifest,
        "corpus": _corpus_entry(previous, keep_mask, old_rows, new),
        "faiss_build_s": round(faiss_s, 3),
        "files": describe(out),
    }


def new_codec(spec: kinds.IndexSpec, vectors: np.ndarray) -> codecs.Codec:
    """How a first build stores ``vectors`` (the encoder's): ``spec``'s type and dimension, and for int8
    storage the per-dimension ranges of the whole corpus (kept by every later version)."""
    source_dim = vectors.shape[1]
    codec = codecs.Codec(vectors=spec.vectors, dim=spec.dim or source_dim, source_dim=source_dim,
                         rescore=(spec.rescore or "int8") if spec.binary else None,
                         rescore_factor=spec.rescore_factor)
    if codec.needs_calibration:
        codec = replace(codec, calibration=codecs.calibrate(codec.cut(vectors)))
    return codec


class _Decoded:
    """Stored rows read as float32, a chunk at a time (what FAISS adds when an index is rebuilt)."""

    def __init__(self, stored: np.ndarray, codec: codecs.Codec) -> None:
        self.stored, self.codec = stored, codec

    def __len__(self) -> int:
        return len(self.stored)

    def __getitem__(self, rows) -> np.ndarray:
        return self.codec.decode(self.stored[rows])


def kept_vector_rows(previous, old_rows: np.ndarray) -> np.ndarray:
    """The vector rows of the kept document rows ``old_rows`` (the same rows for a one-vector-per-document index;
    every row a document owns, in order, for passages and ME-BERT)."""
    if previous is None:
        return np.empty(0, dtype=np.int64)
    if previous.offsets is None:
        return np.asarray(old_rows, dtype=np.int64)
    offsets = np.asarray(previous.offsets)
    starts, counts = offsets[old_rows], np.diff(offsets)[old_rows]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return (np.repeat(starts - first, counts) + np.arange(int(counts.sum()))).astype(np.int64)


def _binary_index(previous, keep_mask, old_rows, new_f, spec: kinds.IndexSpec, dim: int):
    """The Hamming index of a version: a copy of the previous one grown by the new documents' sign bits,
    or (documents dropped) a new one over the kept rows' bits (read back from the previous index) and the new."""
    import faiss

    new_bits = codecs.pack_bits(new_f) if new_f is not None else None
    if previous is not None and keep_mask.all():
        index = faiss.clone_binary_index(_readable(previous))
        if new_bits is not None:
            kinds.add_binary(index, new_bits)
        return index, previous.manifest["factory"]
    if previous is not None:
        spec = previous.spec()
    index, factory = kinds.new_faiss_index(spec, np.empty((0, dim), dtype=np.float32), show_progress=False)
    if previous is not None and len(old_rows):
        old = _readable(previous)
        for s in range(0, len(old_rows), kinds.CHUNK):
            block = old_rows[s : s + kinds.CHUNK]
            kinds.add_binary(index, np.stack([old.reconstruct(int(r)) for r in block]))
    if new_bits is not None:
        kinds.add_binary(index, new_bits)
    return index, factory


def _write_vectors(path: Path, previous, old_vec: np.ndarray, new_stored, num_vectors: int,
                   codec: codecs.Codec) -> np.ndarray:
    """Kept old vector rows ``old_vec`` (copied in chunks from the memory map), then the new ones; returned
    memory-mapped."""
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=codec.dtype, shape=(num_vectors, codec.columns))
    preallocate(path)  # the map's pages get their blocks now: a full disk is ENOSPC here, not a SIGBUS later
    pos = 0
    if previous is not None and len(old_vec):
        old = previous.vectors
        if len(old_vec) == old.shape[0]:  # everything kept: one sequential copy
            vectors[: old.shape[0]] = old
            pos = old.shape[0]
        else:
            for s in range(0, len(old_vec), kinds.CHUNK):
                block = old_vec[s : s + kinds.CHUNK]
                vectors[pos : pos + len(block)] = old[block]
                pos += len(block)
    if new_stored is not None:
        vectors[pos:] = new_stored
    vectors.flush()
    del vectors
    return load_npy(path, mmap_mode="r")


def _write_documents(out: Path, previous, old_rows, new) -> None:
    """docs.jsonl (kept lines copied as bytes, new ones appended; ``{"_id", "title", "text"}`` and, when the
    document has any, ``"metadata"``), its line offsets, the ids' files (:mod:`.ids`)."""
    line_offsets = [0]
    with (out / "docs.jsonl").open("wb") as handle:
        if previous is not None:
            for r in old_rows:
                line = previous.document_bytes(int(r))
                handle.write(line)
                line_offsets.append(line_offsets[-1] + len(line))
        if new is not None:
            metadata = new.metadata or [None] * len(new.ids)
            for doc_id, title, text, meta in zip(new.ids, new.titles, new.texts, metadata):
                record = {"_id": doc_id, "title": title, "text": text}
                if meta:  # stored only when there is some: a document without metadata keeps the old line
                    record["metadata"] = meta
                line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
                handle.write(line)
                line_offsets.append(line_offsets[-1] + len(line))
        handle.flush()
        os.fsync(handle.fileno())
    save_npy(out / "docs.offsets.npy", np.asarray(line_offsets, dtype=np.int64))
    write_ids(out, previous.doc_ids if previous is not None else None, old_rows, new.ids if new is not None else [])


def _corpus_entry(previous, keep_mask, old_rows, new) -> dict:
    """The fingerprint of the version's documents: the previous one's, less the dropped documents, plus
    the new ones (or, for a version written before fingerprints, computed over every kept document)."""
    added = zip(new.ids, new.titles, new.texts) if new is not None else ()
    if previous is None:
        return fingerprint.entry(fingerprint.combine(added))
    before = fingerprint.parse(previous.manifest.get("corpus"))
    if before is None:
        kept = (previous.document_fields(int(r)) for r in old_rows)
        return fingerprint.entry(fingerprint.combine(kept), fingerprint.combine(added))
    dropped = (previous.document_fields(int(r)) for r in np.flatnonzero(~keep_mask))
    return fingerprint.entry(before, fingerprint.combine(added), -fingerprint.combine(dropped))


def _readable(store: PreviousVersion):
    """The previous FAISS index loaded fully in memory (a memory-mapped one cannot be cloned and grown)."""
    import faiss

    if store.codec.vectors == "binary":
        return faiss.read_index_binary(str(store.dir / "faiss.index"))
    return faiss.read_index(str(store.dir / "faiss.index"))
