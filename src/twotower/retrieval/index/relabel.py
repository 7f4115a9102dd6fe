"""A version that changes documents' metadata and nothing else: no re-encoding, the same rows in the same order.

Every file of the previous version but ``manifest.json``, ``docs.jsonl`` and ``docs.offsets.npy`` goes into the new
version unchanged — vectors, FAISS, BM25, ids, offsets, and any file a later format adds — as a hard link where the
file system allows (versions are immutable, so sharing the bytes is safe, and a metadata update on a million
documents copies no vectors), else as a byte copy. Each is checked against its sha256 first, as every write checks
what it copies (:mod:`.files`), and keeps its manifest entry. ``docs.jsonl`` is rewritten: the lines of documents
not updated are copied as bytes, the others rebuilt with the new metadata. The version is published like any other
(:func:`.versions.publish`): readers see the old metadata or the new, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from twotower.io import file_digest
from twotower.retrieval.index.files import fsync_dir, fsync_file, save_npy
from twotower.retrieval.index.versions import collect_garbage, new_temp_dir, publish

REWRITTEN = ("manifest.json", "docs.jsonl", "docs.offsets.npy")


def _carry(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # no hard links here (another file system, a limit): a copy
        shutil.copyfile(src, dst)
        fsync_file(dst)


def write_metadata(root: Path, previous, updates: dict[int, dict], *, keep: int) -> tuple[Path, dict]:
    """A new version of ``root`` (call under the writer lock) that is ``previous`` (an opened
    :class:`~twotower.retrieval.store.IndexStore`) with the metadata of the rows in ``updates`` replaced; returns
    its directory and manifest."""
    previous.files.check_all(writing=True)  # nothing corrupt is carried into a version with fresh sums
    from twotower.io import reporting_full_disk

    with reporting_full_disk(root, "the index is as it was"):
        tmp = new_temp_dir(root)
        try:
            files = {}
            for src in sorted(p for p in previous.dir.rglob("*") if p.is_file()):
                name = str(src.relative_to(previous.dir))
                if name in REWRITTEN:
                    continue
                _carry(src, tmp / name)
                if name in previous.manifest["files"]:
                    files[name] = previous.manifest["files"][name]
            for sub in sorted(p for p in tmp.rglob("*") if p.is_dir()):
                fsync_dir(sub)
            _write_docs(tmp, previous, updates)
            fresh = {}
            for name in sorted({str(f.relative_to(tmp)) for f in tmp.rglob("*") if f.is_file()} - set(files)):
                fsync_file(tmp / name)  # the rewritten files (and any unlisted one carried): fresh sums
                fresh[name] = {"bytes": (tmp / name).stat().st_size, "sha256": file_digest(tmp / name)}
            manifest = dict(previous.manifest, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                            files=dict(sorted({**files, **fresh}.items())))
            final = publish(root, tmp, manifest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    collect_garbage(root / "versions", final.name, keep)
    return final, manifest


def _write_docs(out: Path, previous, updates: dict[int, dict]) -> None:
    """docs.jsonl with the rows of ``updates`` rebuilt (``"metadata"`` only when non-empty, as the writer does) and
    the others copied as bytes; its line offsets."""
    offsets = [0]
    with (out / "docs.jsonl").open("wb") as handle:
        for row in range(len(previous)):
            if row in updates:
                doc = previous.document(row)
                record = {"_id": doc["_id"], "title": doc["title"], "text": doc["text"]}
                if updates[row]:
                    record["metadata"] = updates[row]
                line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
            else:
                line = previous.document_bytes(row)
            handle.write(line)
            offsets.append(offsets[-1] + len(line))
        handle.flush()
        os.fsync(handle.fileno())
    save_npy(out / "docs.offsets.npy", np.asarray(offsets, dtype=np.int64))


__all__ = ["write_metadata"]
