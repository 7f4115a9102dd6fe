"""A version's document ids, held compactly: no Python string or dict entry per document.

A list of a million ``str`` ids and a ``{id: row}`` dict cost ~150 bytes per document in a process — three times the
48 bytes a binary index keeps per document. So a version stores its ids as files beside ``doc_ids.json`` (which stays:
the format's list, what older readers open) and an opened version memory-maps them:

    doc_ids.bin            the ids' UTF-8 bytes, one after another
    doc_ids.offsets.npy    int64 (num_docs + 1): the id of row i is doc_ids.bin[offsets[i]:offsets[i + 1]]
    doc_ids.lookup.npy     uint64 (2, num_docs): every id's 64-bit hash (BLAKE2b of its UTF-8 bytes), sorted (row 0),
                           and the row holding that id (row 1)

An id's row is found by binary search on the hashes and confirmed by comparing the stored bytes (so two ids with one
hash are still told apart). A version written before these files existed opens from ``doc_ids.json``: the same
arrays, built in memory. :class:`DocIds` reads as a sequence of ``str`` (``ids[row]``); :attr:`DocIds.row_of` as a
read-only mapping ``{id: row}``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from twotower.io import load_npy
from twotower.retrieval.index.files import save_npy

IDS_FILE, OFFSETS_FILE, LOOKUP_FILE = "doc_ids.bin", "doc_ids.offsets.npy", "doc_ids.lookup.npy"
JSON_FILE = "doc_ids.json"
_CHUNK = 65_536  # ids per step when a write copies or lists them


def id_hashes(encoded: Iterable[bytes]) -> np.ndarray:
    """The lookup hash (uint64, the same on every machine and process) of each UTF-8 encoded id."""
    digest = b"".join(hashlib.blake2b(b, digest_size=8).digest() for b in encoded)
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def _lookup(hashes: np.ndarray) -> np.ndarray:
    """``(2, n)`` uint64: ``hashes`` sorted, and the row each came from."""
    order = np.argsort(hashes, kind="stable")
    return np.stack([hashes[order], order.astype(np.uint64)])


class DocIds(Sequence):
    """The ids of one version in row order (see the module's docstring); read-only, thread-safe."""

    def __init__(self, blob, offsets: np.ndarray, lookup: np.ndarray, *, close=None) -> None:
        self._blob = blob  # bytes or a read-only mmap: slicing gives bytes
        self.offsets = offsets
        self.hashes = lookup[0]
        self.order = lookup[1]
        self._close = close

    @classmethod
    def from_list(cls, ids: Sequence[str]) -> "DocIds":
        """Ids held in memory (a version written before ``doc_ids.bin`` existed; tests)."""
        encoded = [d.encode("utf-8") for d in ids]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets, _lookup(id_hashes(encoded)))

    @classmethod
    def load(cls, version_dir: Path) -> "DocIds":
        """The ids of the version in ``version_dir``: its files memory-mapped, or ``doc_ids.json`` read into memory
        when the version predates them (``FileNotFoundError`` when neither is there)."""
        if not (version_dir / IDS_FILE).is_file():
            return cls.from_list(json.loads((version_dir / JSON_FILE).read_text(encoding="utf-8")))
        offsets = load_npy(version_dir / OFFSETS_FILE, mmap_mode="r")
        lookup = load_npy(version_dir / LOOKUP_FILE, mmap_mode="r")
        with (version_dir / IDS_FILE).open("rb") as handle:
            blob = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if handle.seek(0, 2) else b""
        return cls(blob, offsets, lookup, close=getattr(blob, "close", None))

    def problem(self) -> str | None:
        """Why the arrays cannot be one version's ids (sizes that disagree), or None."""
        n = len(self.offsets) - 1
        if n < 0 or self.hashes.shape != (n,) or self.order.shape != (n,):
            return (f"{OFFSETS_FILE} holds {len(self.offsets)} offsets and {LOOKUP_FILE} {self.hashes.shape} "
                    "hashes: they disagree")
        if n and (int(self.offsets[0]) != 0 or int(self.offsets[-1]) != len(self._blob)):
            return f"{OFFSETS_FILE} ends at byte {int(self.offsets[-1])}, {IDS_FILE} holds {len(self._blob)}"
        return None

    def close(self) -> None:
        if self._close is not None:
            self._close()

    # ---- the sequence -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def encoded(self, row: int) -> bytes:
        """The UTF-8 bytes of the id in ``row``."""
        return self._blob[int(self.offsets[row]) : int(self.offsets[row + 1])]

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        row = operator.index(row)
        n = len(self)
        if row < 0:
            row += n
        if not 0 <= row < n:
            raise IndexError(f"row {row} of {n} document ids")
        return self.encoded(row).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), _CHUNK):
            stop = min(len(self), start + _CHUNK)
            bounds = np.asarray(self.offsets[start : stop + 1])
            base = int(bounds[0])
            chunk = self._blob[base : int(bounds[-1])]
            rel = (bounds - base).tolist()
            for a, b in zip(rel, rel[1:]):
                yield chunk[a:b].decode("utf-8")

    def __contains__(self, doc_id) -> bool:
        return self.row(doc_id) is not None

    def __eq__(self, other) -> bool:
        """Equal to any list, tuple or :class:`DocIds` of the same ids in the same order."""
        if not isinstance(other, (DocIds, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # mutable-looking like a list: not hashable

    def __repr__(self) -> str:
        shown = ", ".join(repr(d) for d in self[:3]) + (", …" if len(self) > 3 else "")
        return f"DocIds([{shown}], {len(self)} ids)"

    # ---- id -> row --------------------------------------------------------------------------

    def rows(self, ids: Sequence[str]) -> list[int | None]:
        """The row of each of ``ids`` (None for an id not held, or not a string)."""
        encoded = [d.encode("utf-8", "surrogatepass") if isinstance(d, str) else None for d in ids]
        found: list[int | None] = [None] * len(encoded)
        asked = [i for i, b in enumerate(encoded) if b is not None]
        if not asked or not len(self):
            return found
        wanted = id_hashes(encoded[i] for i in asked)
        lo = np.searchsorted(self.hashes, wanted, side="left")
        hi = np.searchsorted(self.hashes, wanted, side="right")
        for i, a, b in zip(asked, lo.tolist(), hi.tolist()):
            for row in np.asarray(self.order[a:b]).tolist():  # usually one; more when two ids share a hash
                if self.encoded(row) == encoded[i]:
                    found[i] = row
                    break
        return found

    def row(self, doc_id) -> int | None:
        return self.rows([doc_id])[0]

    @property
    def row_of(self) -> "RowOf":
        """``{id: row}`` as a read-only mapping over these arrays."""
        return RowOf(self)

    # ---- writing ----------------------------------------------------------------------------

    def row_hashes(self, rows: np.ndarray) -> np.ndarray:
        """The hashes of the ids in ``rows`` (in that order)."""
        per_row = np.empty(len(self), dtype=np.uint64)
        per_row[np.asarray(self.order, dtype=np.int64)] = self.hashes
        return per_row[rows]

    def gather(self, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The ids in ``rows`` as ``(their bytes one after another, their lengths)``."""
        rows = np.asarray(rows, dtype=np.int64)
        offsets = np.asarray(self.offsets)
        starts, lengths = offsets[rows], offsets[rows + 1] - offsets[rows]
        if len(rows) == len(self) and np.array_equal(rows, np.arange(len(self))):
            return bytes(self._blob[: int(offsets[-1])]), lengths
        parts = []
        for s in range(0, len(rows), _CHUNK):
            parts.extend(self._blob[a : a + n] for a, n in zip(starts[s : s + _CHUNK].tolist(),
                                                                  lengths[s : s + _CHUNK].tolist()))
        return b"".join(parts), lengths


class RowOf(Mapping):
    """``store.row_of``: a read-only ``{id: row}`` over a :class:`DocIds`."""

    def __init__(self, ids: DocIds) -> None:
        self._ids = ids

    def __getitem__(self, doc_id: str) -> int:
        row = self._ids.row(doc_id)
        if row is None:
            raise KeyError(doc_id)
        return row

    def get(self, doc_id, default=None):
        row = self._ids.row(doc_id)
        return default if row is None else row

    def __contains__(self, doc_id) -> bool:
        return self._ids.row(doc_id) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


def write_ids(out: Path, previous: DocIds | None, old_rows: np.ndarray, new_ids: Sequence[str]) -> None:
    """The id files of a version (``doc_ids.json`` and the compact ones) holding ``previous``' ids in ``old_rows``,
    then ``new_ids``."""
    kept, kept_lengths = previous.gather(old_rows) if previous is not None else (b"", np.empty(0, dtype=np.int64))
    encoded = [d.encode("utf-8") for d in new_ids]
    lengths = np.concatenate([kept_lengths, np.asarray([len(b) for b in encoded], dtype=np.int64)])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = kept + b"".join(encoded)
    hashes = np.concatenate([previous.row_hashes(old_rows) if previous is not None else np.empty(0, np.uint64),
                             id_hashes(encoded)])
    (out / IDS_FILE).write_bytes(blob)
    save_npy(out / OFFSETS_FILE, offsets)
    save_npy(out / LOOKUP_FILE, _lookup(hashes))
    with (out / JSON_FILE).open("w", encoding="utf-8") as handle:  # the list every reader of the format knows
        bounds = offsets.tolist()
        handle.write("[")
        for s in range(0, len(lengths), _CHUNK):
            part = [json.dumps(blob[a:b].decode("utf-8"), ensure_ascii=False)
                    for a, b in zip(bounds[s : s + _CHUNK], bounds[s + 1 : s + _CHUNK + 1])]
            handle.write((", " if s else "") + ", ".join(part))
        handle.write("]")
