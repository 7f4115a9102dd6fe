"""Versions of an index directory: the ``CURRENT`` pointer, ``versions/vNNNNNN`` dirs and their manifests.

A version is written into ``versions/.tmp-*``, renamed to the next ``vNNNNNN`` and only then named
by ``CURRENT`` (temp file + ``os.replace``), so ``CURRENT`` always names a complete version.

Readers hold the version they opened (:class:`Lease`): a shared ``flock`` on ``INDEX/.readers/vNNNNNN``, taken before
any file of the version is read and released when the store is closed or dropped (or its process ends). A writer
collects an old version only after taking that lock exclusively (without waiting), so a version a reader holds stays
whole on disk — the files a store reads on first use (``faiss.index``, ``bm25/``, ``docs.jsonl`` for filters) included
— and is collected by a later write once released. Collecting renames the version out of the way (``versions/.tmp-*``)
and drops its lock file under the exclusive lock; a reader re-checks the version folder after its shared lock is
granted, so one that came too late finds it gone and opens the new ``CURRENT`` instead (:func:`open_live`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from twotower.checks import flag, given
from twotower.errors import DataError
from twotower.io import atomic_write_json, atomic_write_text
from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.index.files import fsync_dir
from twotower.retrieval.index.lock import LOCK_NAME

READERS = ".readers"  # INDEX/.readers/vNNNNNN: the lock file readers of that version hold shared
FORMAT = "twotower-index"
FORMAT_VERSION = 1
TMP_PREFIX = ".tmp-"

REQUIRED = {
    "format": str, "format_version": int, "version": int, "dim": int, "kind": str, "factory": str,
    "num_docs": int, "num_vectors": int, "model": dict, "files": dict,
}
_HINT = "restore the file or rebuild the index"
T = TypeVar("T")


def is_index_dir(root: Path) -> bool:
    """Whether ``root`` holds an index (a ``CURRENT`` pointer and its ``versions/``)."""
    return (root / "CURRENT").is_file() and (root / "versions").is_dir()


def current_version(root: Path) -> str:
    """The name of the live version (``CURRENT``), or an error saying what ``root`` is instead."""
    if not root.is_dir():
        raise IndexStoreError(f"{root}: index directory not found (build one with 'twotower index build')")
    try:
        name = (root / "CURRENT").read_text().strip()
    except FileNotFoundError:
        raise IndexStoreError(
            f"{root}: not an index directory (no CURRENT file; build one with 'twotower index build')"
        ) from None
    if version_number(name) is None:
        raise DataError(root / "CURRENT", f"expected a version name like 'v000001', got {name[:40]!r}",
                        line=1, hint=_HINT)
    return name


def open_live(root: Path, open_version: Callable[[Path, dict], T]) -> T:
    """``open_version(version_dir, manifest)`` of the live version of ``root`` (every backend opens through here).
    A version that vanishes before it is held (writers switched versions and collected the old one between our read
    of ``CURRENT`` and :func:`hold`) is tried again at the new ``CURRENT``; missing files of the version ``CURRENT``
    still names are an error."""
    attempts = 5
    for attempt in range(attempts):
        version = current_version(root)
        version_dir = root / "versions" / version
        try:
            return open_version(version_dir, read_manifest(version_dir / "manifest.json"))
        except FileNotFoundError:
            if attempt == attempts - 1 or current_version(root) == version:
                raise IndexStoreError(
                    f"{version_dir}: the version named by {root / 'CURRENT'} is missing files "
                    f"(restore the directory or rebuild with 'twotower index build')"
                ) from None
    raise AssertionError("unreachable")


def read_manifest(path: Path) -> dict:
    """A version's manifest, checked field by field (``FileNotFoundError`` propagates: see :func:`open_live`)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(path, f"corrupt manifest: {exc.msg} at column {exc.colno}", line=exc.lineno,
                        hint="restore the file or rebuild the index with 'twotower index build'") from None
    if not isinstance(manifest, dict):
        raise DataError(path, f"corrupt manifest: expected a JSON object, got {type(manifest).__name__}", hint=_HINT)
    for name, typ in REQUIRED.items():
        if name not in manifest:
            raise DataError(path, "corrupt manifest: missing field", field=name, hint=_HINT)
        if not isinstance(manifest[name], typ) or isinstance(manifest[name], bool):
            raise DataError(path, f"corrupt manifest: expected {typ.__name__}, got {type(manifest[name]).__name__}",
                            field=name, hint=_HINT)
    if manifest["format"] != FORMAT:
        raise DataError(path, f"not a twotower index manifest (format {manifest['format']!r})", field="format")
    if manifest["format_version"] > FORMAT_VERSION:
        raise DataError(path, f"index format {manifest['format_version']} is newer than this twotower "
                              f"understands ({FORMAT_VERSION})", field="format_version", hint="upgrade twotower")
    return manifest


def version_number(name: str) -> int | None:
    return int(name[1:]) if name.startswith("v") and name[1:].isdigit() else None


def new_temp_dir(root: Path) -> Path:
    """A fresh ``versions/.tmp-*`` dir; temp dirs of writers that were killed are swept first (call under
    the writer lock)."""
    versions = root / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    for stale in versions.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = versions / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    tmp.mkdir()
    return tmp


def publish(root: Path, tmp: Path, manifest: dict) -> Path:
    """Number the complete version in ``tmp``, write its manifest, rename it into place and point
    ``CURRENT`` at it. Returns the version dir."""
    versions = root / "versions"
    numbers = [n for n in (version_number(p.name) for p in versions.iterdir()) if n is not None]
    number = max(numbers, default=0) + 1
    manifest["version"] = number
    atomic_write_json(tmp / "manifest.json", manifest)
    fsync_dir(tmp)
    final = versions / f"v{number:06d}"
    os.rename(tmp, final)
    try:
        fsync_dir(versions)
        atomic_write_text(root / "CURRENT", final.name + "\n")
    except BaseException:  # CURRENT still names the old version: the new one goes back to be removed as a temp
        os.rename(final, tmp)
        raise
    fsync_dir(root)
    return final


class Lease:
    """A reader's hold on one version: a shared ``flock`` on its file in ``INDEX/.readers`` (module docstring), until
    :meth:`close` (or until the object is dropped, or the process ends: the kernel releases the lock with the file)."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:  # no contextlib here: at interpreter exit this module's globals may be gone (None) before the lease
            self.close()
        except Exception:  # noqa: BLE001 (then the kernel releases the lock with the process)
            pass


_NO_LOCK_FILE = (errno.EACCES, errno.EPERM, errno.EROFS)  # a read-only index: no writer to collect it either


def hold(root: Path, version: str) -> Lease:
    """A :class:`Lease` on ``root``'s version ``version``, taken before any of its files is read;
    ``FileNotFoundError`` when the version is gone (collected by a writer: open the new ``CURRENT``). Where the lock
    file cannot be made (a read-only folder) the lease holds nothing."""
    folder = root / READERS
    try:
        folder.mkdir(exist_ok=True)
        fd: int | None = os.open(folder / version, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError as exc:
        if exc.errno not in _NO_LOCK_FILE:
            raise
        fd = None
    lease = Lease(fd)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a writer holds it exclusively only while it renames the version away
    if not (root / "versions" / version).is_dir():  # collected before our lock was granted
        lease.close()
        raise FileNotFoundError(errno.ENOENT, "index version collected by a writer", str(root / "versions" / version))
    return lease


def _collect(root: Path, name: str) -> bool:
    """Remove version ``name`` unless a reader holds it (call under the writer lock); whether it was removed."""
    folder = root / READERS
    try:
        folder.mkdir(exist_ok=True)
        fd = os.open(folder / name, os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:
        return False  # readers' holds cannot be seen: keep it
    doomed = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False  # held by a reader: a later write collects it
            raise
        version_dir = root / "versions" / name
        if version_dir.is_dir():
            doomed = root / "versions" / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                os.rename(version_dir, doomed)  # gone from its name at once: a reader finds it whole or not at all
            except OSError:
                doomed = None
                shutil.rmtree(version_dir, ignore_errors=True)
        (folder / name).unlink(missing_ok=True)
    finally:
        os.close(fd)
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)  # a crash midway leaves a temp dir the next write sweeps
    return True


def collect_garbage(versions: Path, current: str, keep: int) -> None:
    """Delete versions other than ``current`` and the ``keep`` before it, except those a reader still holds
    (:class:`Lease`; a later write collects them once released), and the lock files of versions already gone."""
    root = versions.parent
    cur = version_number(current)
    older = sorted(n for n in (version_number(p.name) for p in versions.iterdir()) if n is not None and n != cur)
    keep_set = {n for n in older if n < cur}
    keep_set = set(sorted(keep_set)[-keep:]) if keep > 0 else set()
    for n in older:
        if n not in keep_set:
            _collect(root, f"v{n:06d}")
    with contextlib.suppress(OSError):
        stale = [p.name for p in (root / READERS).iterdir()
                 if version_number(p.name) is not None and not (versions / p.name).is_dir()]
        for name in stale:  # a reader that came too late left its lock file behind
            _collect(root, name)


def check_target(root: Path) -> None:
    """``root`` can take a new index version: missing, empty, or an index directory already."""
    if root.exists() and not root.is_dir():
        raise IndexStoreError(f"{root}: exists and is not a directory; choose an empty or new {_out()}")
    if root.is_dir() and any(root.iterdir()) and not (root / "CURRENT").exists() and not (root / "versions").exists():
        what = next((f" (it holds {name}: {kind})" for name, kind in (
            ("fit.json", f"a fit folder; index its model with {given('encoder', str(root / 'model'), '--model')}"),
            ("twotower.json", "a model"), ("train_log.json", "a training run"), ("corpus.jsonl", "a data set"))
            if (root / name).exists()), "")
        raise IndexStoreError(f"{root}: exists and is not an index directory{what}; choose an empty or new {_out()}")


def _out() -> str:
    """The index folder as the caller names it: ``path`` of tt.Index.build, ``--out`` of index build."""
    return flag("path", "--out")


def discard_unfinished(root: Path, *, created: bool) -> None:
    """After a first build failed: remove what it left (lock file, empty ``versions/``, ``root`` itself if
    the build created it), so that no directory without ``CURRENT`` stays behind."""
    if (root / "CURRENT").exists():
        return  # another writer finished a version meanwhile
    with contextlib.suppress(OSError):
        (root / "versions").rmdir()  # only if empty: another writer's temp dir stays
    if (root / "versions").exists():
        return
    (root / LOCK_NAME).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (root / READERS).rmdir()
    if created:
        with contextlib.suppress(OSError):
            root.rmdir()
