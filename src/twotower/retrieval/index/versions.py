"""Versions of an index directory: the ``CURRENT`` pointer, ``versions/vNNNNNN`` dirs and their manifests.

A version is written into ``versions/.tmp-*``, renamed to the next ``vNNNNNN`` and only then named
by ``CURRENT`` (temp file + ``os.replace``), so ``CURRENT`` always names a complete version.
"""

from __future__ import annotations

import contextlib
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
    A version whose files vanish while it is opened (a writer switched versions and collected the old one between
    our reads) is tried again at the new ``CURRENT``; missing files of the version ``CURRENT`` still names are an
    error."""
    for attempt in range(3):
        version = current_version(root)
        version_dir = root / "versions" / version
        try:
            return open_version(version_dir, read_manifest(version_dir / "manifest.json"))
        except FileNotFoundError:
            if attempt == 2 or current_version(root) == version:
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


def collect_garbage(versions: Path, current: str, keep: int) -> None:
    """Delete versions other than ``current`` and the ``keep`` before it (readers may hold those)."""
    cur = version_number(current)
    older = sorted(n for n in (version_number(p.name) for p in versions.iterdir()) if n is not None and n != cur)
    keep_set = {n for n in older if n < cur}
    keep_set = set(sorted(keep_set)[-keep:]) if keep > 0 else set()
    for n in older:
        if n not in keep_set:
            shutil.rmtree(versions / f"v{n:06d}", ignore_errors=True)


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
    if created:
        with contextlib.suppress(OSError):
            root.rmdir()
