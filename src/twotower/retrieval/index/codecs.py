"""How an index stores its vectors: fp32 | fp16 | int8 | binary, optionally cut to their first ``dim`` dimensions.

- ``fp32``: float32 rows in ``vectors.npy``, any FAISS kind (as before compression existed).
- ``fp16``: float16 rows in ``vectors.npy``; FAISS's ``SQfp16`` scalar quantizer (``SQfp16``,
  ``HNSWm,SQfp16``, ``IVFn,SQfp16``) holds the same values in RAM.
- ``int8``: one byte per dimension, FAISS's 8-bit scalar quantizer (``SQ8``) with per-dimension ranges
  (the corpus's min and max of every dimension, ``calibration.npy`` (2, dim)) computed from the whole
  corpus at build and kept by every later version: ``index add`` encodes new documents with the old
  ranges (values outside them are clipped) and never shifts stored codes. Code ``c`` of dimension ``j``
  means ``min_j + (c + 0.5) / 255 · (max_j − min_j)``.
- ``binary``: the sign bits of each vector (``x > 0``, packed 8 per byte as sentence-transformers'
  ``quantize_embeddings(..., "ubinary")`` packs them) in a FAISS binary index (``BFlat`` or ``BHNSWm``),
  searched by Hamming distance for ``k × rescore_factor`` candidates that are then rescored with the
  float query against the documents' ``int8`` (default) or ``fp32`` vectors, kept in ``vectors.npy`` and
  memory-mapped (read from disk per query, not held in RAM). ``rescore="none"`` keeps only the bits
  (``vectors.npy`` holds them too) and scores ``1 − 2·hamming / dim`` (the cosine of the sign vectors).

``dim`` (``index build --dim D``): every stored vector is cut to its first D dimensions and L2-normalised
again (Matryoshka-trained models keep most of their quality so); queries are cut the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twotower.retrieval.index.errors import DimensionError, IndexStoreError

VECTOR_TYPES = ("fp32", "fp16", "int8", "binary")
RESCORE_TYPES = ("int8", "fp32", "none")
DEFAULT_RESCORE_FACTOR = 4
_SQ = {"fp16": "SQfp16", "int8": "SQ8"}


def truncate(vectors: np.ndarray, dim: int) -> np.ndarray:
    """The first ``dim`` columns of ``vectors``, each row L2-normalised again (float32; zero rows stay zero)."""
    cut = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32)[:, :dim])
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return cut / np.where(norms > 0, norms, 1.0)


def check_vectors(*, vectors: str, dim: int | None, rescore: str | None, rescore_factor: int, kind: str,
                  source_dim: int, multivector: bool = False) -> int:
    """Fail before any encoding when the vector options cannot work; return the stored dimension.
    ``source_dim``: the dimension the encoder (or multi-vector projection) produces."""
    from twotower.checks import check_number, flag, given

    if vectors not in VECTOR_TYPES:
        raise IndexStoreError(f"{given('vectors', vectors)}: choose one of {', '.join(VECTOR_TYPES)}")
    if dim is not None:
        check_number(dim, "dim", integer=True, minimum=1)
        if dim > source_dim:
            raise IndexStoreError(f"{given('dim', dim)} is more than the model's {source_dim} dimensions: give "
                                  f"{flag('dim')} {source_dim} or fewer (the stored vectors keep their first "
                                  f"{flag('dim')} dimensions)")
    check_number(rescore_factor, "rescore_factor", integer=True, minimum=1, maximum=1 << 20,
                 hint="the binary search fetches k × factor candidates to rescore")
    if rescore_factor != DEFAULT_RESCORE_FACTOR and vectors != "binary":
        raise IndexStoreError(f"{flag('rescore_factor')} applies to binary vectors, not "
                              f"'{vectors}': drop it or store binary vectors")
    if rescore is not None:
        if rescore not in RESCORE_TYPES:
            raise IndexStoreError(f"{given('rescore', rescore)}: choose one of {', '.join(RESCORE_TYPES)}")
        if vectors != "binary":
            raise IndexStoreError(f"{flag('rescore')} applies to {given('vectors', 'binary')}, not '{vectors}': "
                                  f"drop it or pass {given('vectors', 'binary')}")
    stored = dim or source_dim
    if multivector and (vectors != "fp32" or dim is not None):
        raise IndexStoreError(f"{flag('vectors')} and {flag('dim')} apply to single-vector indexes; drop them or "
                              f"{flag('multivector')}")
    k = kind.lower()
    if vectors in _SQ and k not in ("flat", "hnsw", "ivf"):
        raise IndexStoreError(f"{given('vectors', vectors)} applies to {flag('kind')} flat, hnsw or ivf, not "
                              f"'{kind}' (ivfpq and factory strings choose their own codes): use "
                              f"{given('vectors', 'fp32')} with it")
    if vectors == "binary":
        if k not in ("flat", "hnsw"):
            raise IndexStoreError(f"{given('vectors', 'binary')} builds a FAISS binary index of {flag('kind')} flat "
                                  f"or hnsw, not '{kind}'")
        if stored % 8:
            cut = f" ({flag('dim')})" if dim else ""
            raise IndexStoreError(f"{given('vectors', 'binary')} needs a dimension that is a multiple of 8 (FAISS "
                                  f"binary indexes hold whole bytes), got {stored}{cut}: choose "
                                  f"{given('dim', stored - stored % 8 or 8)}")
    return stored


def sq_factory(vectors: str, base: str) -> str:
    """The FAISS factory string of ``base`` (``Flat``, ``HNSW32``, ``IVF100,Flat``) holding fp16/int8 codes."""
    if vectors not in _SQ:
        return base
    if base == "Flat":
        return _SQ[vectors]
    if base.endswith(",Flat"):
        return base[: -len("Flat")] + _SQ[vectors]
    return f"{base},{_SQ[vectors]}"


def binary_factory(kind: str, hnsw_m: int) -> str:
    return f"BHNSW{hnsw_m}" if kind.lower() == "hnsw" else "BFlat"


def pack_bits(vectors: np.ndarray) -> np.ndarray:
    """Sign bits (``x > 0``), 8 per byte, most significant first: (n, dim / 8) uint8."""
    return np.packbits(np.asarray(vectors) > 0, axis=1)


def calibrate(vectors: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Per-dimension ranges (2, dim): the minimum and the maximum of every dimension over ``vectors``."""
    lo = np.full(vectors.shape[1], np.inf, dtype=np.float32)
    hi = np.full(vectors.shape[1], -np.inf, dtype=np.float32)
    for s in range(0, len(vectors), chunk):
        block = np.asarray(vectors[s : s + chunk], dtype=np.float32)
        lo, hi = np.minimum(lo, block.min(axis=0)), np.maximum(hi, block.max(axis=0))
    return np.stack([lo, hi]).astype(np.float32)


def scalar_quantizer(calibration: np.ndarray):
    """A FAISS 8-bit scalar quantizer with the ranges ``calibration`` (2, dim) (a dimension that never varies
    gets a tiny range, so that it encodes to one code instead of dividing by zero)."""
    import faiss

    sq = faiss.ScalarQuantizer(np.asarray(calibration).shape[1], faiss.ScalarQuantizer.QT_8bit)
    set_ranges(sq, calibration)
    return sq


def set_ranges(sq, calibration: np.ndarray) -> None:
    """Make the FAISS ``ScalarQuantizer`` ``sq`` use ``calibration`` (2, dim) as its per-dimension ranges."""
    import faiss

    lo, hi = np.asarray(calibration, dtype=np.float32)
    diff = np.maximum(hi - lo, np.float32(1e-12))
    faiss.copy_array_to_vector(np.concatenate([lo, diff]).astype(np.float32), sq.trained)


@dataclass(frozen=True)
class Codec:
    """Stored form of one index's vectors: ``encode`` float32 rows to it, ``decode`` back to float32."""

    vectors: str = "fp32"
    dim: int = 0  # the stored (cut) dimension
    source_dim: int = 0  # the encoder's dimension (queries and new documents arrive with it)
    rescore: str | None = None  # binary only: int8 | fp32 | none
    rescore_factor: int = DEFAULT_RESCORE_FACTOR
    calibration: np.ndarray | None = None  # (2, dim) int8 ranges (int8, and binary rescored with int8)

    @property
    def storage(self) -> str:
        """What ``vectors.npy`` holds: fp32 | fp16 | int8 | bits."""
        if self.vectors == "binary":
            return {"int8": "int8", "fp32": "fp32", "none": "bits"}[self.rescore or "int8"]
        return self.vectors

    @property
    def dtype(self):
        return {"fp32": np.float32, "fp16": np.float16, "int8": np.uint8, "bits": np.uint8}[self.storage]

    @property
    def columns(self) -> int:
        return self.dim // 8 if self.storage == "bits" else self.dim

    @property
    def needs_calibration(self) -> bool:
        return self.storage == "int8"

    def cut(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` at the stored dimension: cut and re-normalised when the index keeps fewer dimensions."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape[1] == self.dim:
            return np.ascontiguousarray(vectors)
        if vectors.shape[1] == self.source_dim and self.dim < self.source_dim:
            return truncate(vectors, self.dim)
        raise DimensionError(f"vectors have dimension {vectors.shape[1]} but the index holds {self.dim}-d vectors"
                             + (f" cut from {self.source_dim}" if self.dim != self.source_dim else "")
                             + "; encode with the index's model")

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """Float32 rows (already cut) in the stored form."""
        if self.storage == "fp32":
            return np.asarray(vectors, dtype=np.float32)
        if self.storage == "fp16":
            return np.asarray(vectors, dtype=np.float16)
        if self.storage == "bits":
            return pack_bits(vectors)
        if self.calibration is None:
            raise ValueError("int8 vectors need calibration ranges")
        return scalar_quantizer(self.calibration).compute_codes(np.ascontiguousarray(vectors, dtype=np.float32))

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """Stored rows as float32 (int8: the centre of each code's range; bits: ±1/√dim)."""
        stored = np.asarray(stored)
        if self.storage in ("fp32", "fp16"):
            return stored.astype(np.float32)
        if self.storage == "bits":
            signs = np.unpackbits(stored, axis=1)[:, : self.dim].astype(np.float32) * 2 - 1
            return signs / np.float32(np.sqrt(self.dim))
        return scalar_quantizer(self.calibration).decode(np.ascontiguousarray(stored, dtype=np.uint8))

    def manifest(self) -> dict:
        return {"type": self.vectors, "dim": self.dim, "source_dim": self.source_dim, "stored": self.storage,
                "rescore": self.rescore, "rescore_factor": self.rescore_factor}

    @classmethod
    def from_manifest(cls, manifest: dict, calibration: np.ndarray | None) -> "Codec":
        entry = manifest.get("vectors") or {}  # indexes written before compression: fp32 at full size
        return cls(vectors=entry.get("type", "fp32"), dim=int(manifest["dim"]),
                   source_dim=int(entry.get("source_dim", manifest["dim"])), rescore=entry.get("rescore"),
                   rescore_factor=int(entry.get("rescore_factor", DEFAULT_RESCORE_FACTOR)), calibration=calibration)
