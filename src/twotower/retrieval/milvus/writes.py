"""Writing to a Milvus-backed index: documents upserted in batches and flushed (durable when a write returns), and
the manifest's next version (with the BM25 vocabulary) published in the index directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.index.files import describe
from twotower.retrieval.index.versions import collect_garbage, new_temp_dir, publish
from twotower.retrieval.index.writer import NewDocs
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.lexical import SparseBM25

BATCH = 256  # rows per upsert / ids per query


def check_sizes(docs: NewDocs) -> None:
    """Ids, titles and texts within Milvus' VARCHAR limits (bytes of UTF-8), each too long one named."""
    for doc_id, title, text in zip(docs.ids, docs.titles, docs.texts):
        for name, value, limit in (("id", doc_id, mc.MAX_ID_BYTES), ("title", title, mc.MAX_VARCHAR),
                                   ("text", text, mc.MAX_VARCHAR)):
            size = len(value.encode("utf-8"))
            if size > limit:
                raise IndexStoreError(f"document '{doc_id[:80]}': its {name} is {size} bytes of UTF-8; a Milvus index "
                                      f"holds at most {limit} (split the document, or use --backend faiss)")


def upsert(client, uri: str, collection: str, docs: NewDocs, sparse: list | None, *, show_progress: bool,
           insert: bool = False) -> None:
    """Write ``docs`` (with their BM25 ``sparse`` vectors) in batches, then flush: durable when this returns."""
    from tqdm.auto import tqdm

    vectors = np.asarray(docs.vectors, dtype=np.float32)
    with mc.milvus_errors(uri, collection, "writing documents"), \
            tqdm(total=len(docs.ids), desc="milvus", unit="doc", disable=not show_progress) as bar:
        for i in range(0, len(docs.ids), BATCH):
            rows = []
            for j in range(i, min(i + BATCH, len(docs.ids))):
                row = {"id": docs.ids[j], "title": docs.titles[j], "text": docs.texts[j], mc.DENSE: vectors[j]}
                if sparse is not None:
                    row[mc.SPARSE] = sparse[j]
                rows.append(row)
            (client.insert if insert else client.upsert)(collection, rows)
            bar.update(len(rows))
        client.flush(collection)


def write_version(root: Path, manifest: dict, lexicon: SparseBM25 | None, *, keep: int = 2) -> Path:
    """Publish ``manifest`` (and the lexicon's files) as the next version of ``root`` (call under the writer lock)."""
    tmp = new_temp_dir(root)
    if lexicon is not None:
        lexicon.save(tmp)
    manifest["files"] = describe(tmp)
    final = publish(root, tmp, manifest)
    collect_garbage(root / "versions", final.name, keep)
    return final
