"""``{"$text": {"$contains": phrase}}`` on a local index version: the rows whose text holds the phrase.

The reference is ``phrase in document["text"]`` (exact, case-sensitive: :mod:`twotower.retrieval.filter_ops`).
Parsing every line of ``docs.jsonl`` for each filter would cost a ``json.loads`` per document, so the scan looks
for the phrase as JSON writes it (``json.dumps`` escapes character by character, so a text holding the phrase holds
its escaped form; both the ``ensure_ascii`` spellings are tried) in the memory-mapped file, jumps to the next line
after each find, and then checks each candidate line exactly (the find may lie in the title, the id or the
metadata): one ``bytes.find`` per candidate document, one ``json.loads`` per candidate.
"""

from __future__ import annotations

import json
import weakref

import numpy as np


class TextScan:
    """``phrase -> bool mask`` over the rows of one (immutable) local index version."""

    def __init__(self, store) -> None:
        # weakly: the store keeps this scan (its metadata columns' text_source), and a cycle would keep a dropped
        # store, and with it the hold on its version (index.versions.Lease), until Python's cycle collector ran
        self._store = weakref.ref(store)

    @property
    def store(self):
        store = self._store()
        if store is None:
            raise RuntimeError("the index version these metadata columns were read from is no longer open: read them again")
        return store

    def __call__(self, phrase: str) -> np.ndarray:
        store = self.store
        n = len(store)
        offsets = np.asarray(store._doc_offsets)
        data = store._docs_map if store._docs_map is not None else b""
        needles = {json.dumps(phrase, ensure_ascii=flag)[1:-1].encode() for flag in (False, True)}
        candidates: set[int] = set()
        for needle in needles:
            pos = data.find(needle)
            while pos >= 0:
                row = int(np.searchsorted(offsets, pos, side="right")) - 1
                candidates.add(row)
                if row + 1 >= n:
                    break
                pos = data.find(needle, int(offsets[row + 1]))
        mask = np.zeros(n, dtype=bool)
        for row in candidates:
            if phrase in store.document(row)["text"]:
                mask[row] = True
        return mask


__all__ = ["TextScan"]
