"""A version's files against their manifest: sizes on open, sha256 before the first read of the vectors
(``vectors.npy``, ``faiss.index``) and of every file before a write copies them into a new version.

Checksum schedule (see the README's index section): opening a version compares every file's size;
the first read of ``vectors.npy`` and of ``faiss.index`` through an opened version hashes that file
(0.4–1.2 GB/s here; a version this process just wrote counts as checked); ``add`` / ``remove``
re-hash every file they copy, every time, and refuse to write when one fails; ``index info --verify``
hashes everything.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from twotower.errors import DataError
from twotower.io import file_digest

PINNED = ("vectors.npy", "faiss.index")  # held open from opening on, so a version deleted meanwhile still hashes
REBUILT = ("bm25/",)  # rebuilt by every write from the documents, never copied


def fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_npy(path: Path, array: np.ndarray) -> None:
    np.save(path, array)


def describe(out: Path) -> dict[str, dict]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under ``out``, each fsynced first."""
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        fsync_file(path)
        files[str(path.relative_to(out))] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    for sub in sorted(p for p in out.rglob("*") if p.is_dir()):
        fsync_dir(sub)
    return files


def corrupt(version_dir: Path, message: str, field_name: str | None = None) -> DataError:
    return DataError(version_dir / "manifest.json", f"index does not match its manifest: {message}",
                     field=field_name, hint="restore the index directory or rebuild it")


def _digest_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


class VersionFiles:
    """The files of one version as its manifest lists them; thread-safe."""

    def __init__(self, version_dir: Path, manifest: dict) -> None:
        self.dir = version_dir
        self.version = version_dir.name
        self.files: dict[str, dict] = manifest["files"]
        for name, info in self.files.items():
            path = version_dir / name
            if not path.is_file():
                raise corrupt(version_dir, f"{name} is missing", "files")
            size = path.stat().st_size
            if size != info.get("bytes"):
                raise corrupt(version_dir, f"{name} has {size} bytes, expected {info.get('bytes')}", "files")
        self._handles = {name: (version_dir / name).open("rb") for name in PINNED if name in self.files}
        self._verified: set[str] = set()
        self._lock = threading.Lock()

    def _digest(self, name: str) -> str:
        handle = self._handles.get(name)
        return _digest_fd(handle.fileno()) if handle is not None else file_digest(self.dir / name)

    def check(self, name: str, *, writing: bool = False) -> None:
        """Hash ``name`` and compare with the manifest; a mismatch is a :class:`DataError` naming the file."""
        if self._digest(name) == self.files[name].get("sha256"):
            return
        path = self.dir / name
        if writing:
            raise DataError(path, f"fails its sha256 checksum: its bytes changed after index version {self.version} "
                                  f"was written; refusing to copy corrupt data into a new version, nothing was written",
                            hint="restore the index directory from a backup, or rebuild the index with "
                                 "'twotower index build'")
        raise DataError(path, f"fails its sha256 checksum: its bytes changed after index version {self.version} was "
                              f"written, so searches would return wrong results",
                        hint="restore the index directory from a backup, or rebuild it with 'twotower index build'")

    def ensure(self, name: str) -> None:
        """Check ``name`` the first time this version reads it (a no-op for files the manifest does not list)."""
        if name in self._verified or name not in self.files:
            return
        with self._lock:
            if name not in self._verified:
                self.check(name)
                self._verified.add(name)

    def check_all(self, *, writing: bool = False, skip: tuple[str, ...] = ()) -> None:
        """Hash every listed file now (again, even if checked before), except names starting with ``skip``."""
        checked = [name for name in sorted(self.files) if not (skip and name.startswith(skip))]
        for name in checked:
            self.check(name, writing=writing)
        with self._lock:
            self._verified.update(checked)

    def written_now(self) -> None:
        """Mark the pinned files checked: this process just wrote them and computed their sums from disk."""
        with self._lock:
            self._verified.update(n for n in PINNED if n in self.files)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
