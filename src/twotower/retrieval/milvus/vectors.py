"""How a Milvus index stores its dense vectors (``index build --backend milvus --vectors``), in Milvus' own types:

- ``fp32``: a ``FLOAT_VECTOR`` field (FLAT, HNSW or IVF_FLAT; inner product).
- ``int8``: the same field under Milvus' 8-bit scalar-quantized index (IVF_SQ8, HNSW_SQ: :func:`.schema.index_settings`).
- ``binary``: a ``BINARY_VECTOR`` field of the sign bits (``x > 0``, packed as the local binary index packs them:
  :func:`~twotower.retrieval.index.codecs.pack_bits`), BIN_FLAT or BIN_IVF_FLAT, searched by Hamming distance for
  ``k × rescore_factor`` candidates that are rescored with the float query against each candidate's ``codes``
  (a VARCHAR: its int8 codes, by the corpus's per-dimension ranges kept in the manifest, or its fp32 vector, base64)
  read back with the hits: one round trip, as the local binary index rescoring from ``vectors.npy``
  (:mod:`twotower.retrieval.index.binary`). ``rescore="none"`` keeps only the bits and scores ``1 − 2·hamming / dim``.

Binary fields need a Milvus server (Milvus 2.3 or later); Milvus Lite has none
(``benchmarks/results/milvus_vector_types.md``). The codec is the local index's
(:class:`~twotower.retrieval.index.codecs.Codec`), so both backends store and rescore the same numbers.

Half precision (``FLOAT16_VECTOR``) is not offered: the one Milvus server this project can run offline (2.3.5)
creates and fills such a collection, then crashes ("panic: unsupported data type: Float16Vector") at the first write
into it once loaded, so nothing could test it; ``int8`` is the compressed form that needs no server.

Example::

    kind = MilvusVectors.for_build(spec, vectors)  # at build: int8 ranges from the corpus
    kind = MilvusVectors.from_manifest(manifest)  # later
    rows = kind.row_values(vectors)  # {"dense": [...], "codes": [...]} per row
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

from twotower.retrieval.index.codecs import Codec, calibrate, pack_bits
from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus.client import CODES, DENSE  # CODES: binary rows' rescoring codes (base64)

FIELD_TYPES = {"fp32": "FLOAT_VECTOR", "int8": "FLOAT_VECTOR", "binary": "BINARY_VECTOR"}
SERVER_ONLY = ("binary",)  # vector fields Milvus Lite does not have


@dataclass(frozen=True)
class MilvusVectors:
    """One Milvus index's stored form of its vectors (see the module's docstring)."""

    codec: Codec

    @classmethod
    def for_build(cls, spec, vectors: np.ndarray) -> "MilvusVectors":
        """The form ``spec`` (an IndexSpec) asks for; binary rescored with int8 gets its ranges from ``vectors``."""
        dim = int(vectors.shape[1])
        rescore = (spec.rescore or "int8") if spec.vectors == "binary" else None
        calibration = calibrate(vectors) if rescore == "int8" else None
        return cls(Codec(vectors=spec.vectors, dim=dim, source_dim=dim, rescore=rescore,
                         rescore_factor=int(spec.rescore_factor), calibration=calibration))

    @classmethod
    def from_manifest(cls, manifest: dict) -> "MilvusVectors":
        entry = manifest.get("vectors") or {}
        calibration = entry.get("calibration")
        return cls(Codec.from_manifest(manifest, np.asarray(calibration, dtype=np.float32)
                                       if calibration is not None else None))

    def manifest_entry(self, index_type: str) -> dict:
        """The manifest's ``vectors`` entry: the codec's, what Milvus holds, and the int8 ranges (binary + int8)."""
        c = self.codec
        stored = f"milvus {FIELD_TYPES[c.vectors]}, index {index_type}"
        if self.rescores:
            stored += f", rescored from {c.storage} codes"
        entry = {"type": c.vectors, "dim": c.dim, "source_dim": c.source_dim, "stored": stored}
        if c.vectors == "binary":
            entry.update(rescore=c.rescore, rescore_factor=c.rescore_factor)
            if c.calibration is not None:
                entry["calibration"] = np.asarray(c.calibration, dtype=np.float32).tolist()
        return entry

    # ---- the schema ------------------------------------------------------------------------

    @property
    def binary(self) -> bool:
        return self.codec.vectors == "binary"

    @property
    def rescores(self) -> bool:
        return self.binary and self.codec.rescore != "none"

    @property
    def metric(self) -> str:
        return "HAMMING" if self.binary else "IP"

    @property
    def field_type(self) -> str:
        return FIELD_TYPES[self.codec.vectors]

    @property
    def codes_length(self) -> int:
        """The ``codes`` field's length in characters (base64 of one row's codes)."""
        raw = self.codec.dim * np.dtype(self.codec.dtype).itemsize
        return 4 * ((raw + 2) // 3)

    @property
    def fields(self) -> list[str]:
        """The fields a row's vector is read from."""
        return [DENSE, CODES] if self.rescores else [DENSE]

    # ---- writing and reading rows ----------------------------------------------------------

    def row_values(self, vectors: np.ndarray) -> list[dict]:
        """Each float32 row of ``vectors`` as the fields it is stored in."""
        vectors = np.asarray(vectors, dtype=np.float32)
        kind = self.codec.vectors
        if kind == "binary":
            bits = pack_bits(vectors)
            if not self.rescores:
                return [{DENSE: b.tobytes()} for b in bits]
            codes = self.codec.encode(vectors)
            return [{DENSE: b.tobytes(), CODES: base64.b64encode(c.tobytes()).decode("ascii")}
                    for b, c in zip(bits, codes)]
        return [{DENSE: v} for v in vectors]

    def _codes(self, entities: list[dict]) -> np.ndarray:
        """The rescoring vectors (float32) of rows read with :attr:`fields`, decoded from their ``codes``."""
        c = self.codec
        raw = b"".join(base64.b64decode(e[CODES]) for e in entities)
        return c.decode(np.frombuffer(raw, dtype=c.dtype).reshape(len(entities), c.columns))

    def decode(self, entities: list[dict]) -> np.ndarray:
        """The float32 vectors (n, dim) of rows read with :attr:`fields`, such that :meth:`row_values` of them stores
        the same values again (a metadata update writes rows again without encoding). Binary: the rescoring codes
        decoded, where a code's centre has the other sign than the stored bit (the code's range holds 0) set to 0 or
        a tiny value of the bit's sign; without codes, ±1/√dim from the bits."""
        if not entities:
            return np.empty((0, self.codec.dim), dtype=np.float32)
        c = self.codec
        if self.rescores:
            out = self._codes(entities)
            bits = np.unpackbits(np.stack([np.frombuffer(_bytes(e[DENSE]), dtype=np.uint8) for e in entities]),
                                 axis=1)[:, :c.dim].astype(bool)
            out[bits & (out <= 0)] = np.float32(1e-12)
            out[~bits & (out > 0)] = 0.0
            return out
        if self.binary:
            return c.decode(np.stack([np.frombuffer(_bytes(e[DENSE]), dtype=np.uint8) for e in entities]))
        return np.asarray([e[DENSE] for e in entities], dtype=np.float32).reshape(len(entities), c.dim)

    def stored_value(self, value):
        """A dense value as read from Milvus, in the form an upsert of the same row takes."""
        return _bytes(value) if self.binary else value

    # ---- searching -------------------------------------------------------------------------

    def queries(self, queries: np.ndarray) -> list:
        """Float32 query rows as Milvus searches this field with them."""
        if self.binary:
            return [b.tobytes() for b in pack_bits(queries)]
        return list(np.asarray(queries, dtype=np.float32))

    def depth(self, k: int, rescore_factor: int | None) -> int:
        """Rows to ask Milvus for when ``k`` are wanted (binary with rescoring: ``k × rescore_factor``)."""
        factor = self.codec.rescore_factor if rescore_factor is None else int(rescore_factor)
        if factor < 1:
            raise IndexStoreError(f"rescore factor {factor}: must be at least 1")
        return k * factor if self.rescores else k

    def ranked(self, hits: list[dict], query: np.ndarray) -> list[tuple[dict, float]]:
        """Milvus' hits for ``query`` (float32) as ``(entity, score)``, best first: inner products as Milvus gives
        them; binary: rescored against the candidates' codes (ties keep the Hamming order), or ``1 − 2·hamming /
        dim``."""
        if not self.binary:
            return [(h["entity"], float(h["distance"])) for h in hits]
        if not self.rescores:
            return [(h["entity"], 1.0 - 2.0 * float(h["distance"]) / self.codec.dim) for h in hits]
        if not hits:
            return []
        sims = self._codes([h["entity"] for h in hits]) @ np.asarray(query, dtype=np.float32)
        order = np.argsort(-sims, kind="stable")
        return [(hits[i]["entity"], float(sims[i])) for i in order]


def _bytes(value) -> bytes:
    """A binary vector as pymilvus returns it (bytes, or a list holding one bytes object)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (bytes, bytearray)):
        return bytes(value[0])
    return np.asarray(value).tobytes()


__all__ = ["CODES", "FIELD_TYPES", "MilvusVectors", "SERVER_ONLY"]
