"""The text match: ``{"$text": {"$contains": phrase}}``, its argument, and the rows of a local index version whose text
holds the phrase.

It lets through the documents whose text holds the phrase: an exact, case-sensitive substring of the document's
``text`` (not its title, not its metadata; no analyzer, no stemming: ``"Tea"`` does not find ``"tea"``); the reference
is ``phrase in document["text"]``. On Milvus it is ``text like "%phrase%"``
(:func:`twotower.retrieval.filters.milvus.text_expr`).

Locally (:class:`TextScan`), parsing every line of ``docs.jsonl`` for each filter would cost a ``json.loads`` per
document, so the scan looks for the phrase as JSON writes it (``json.dumps`` escapes character by character, so a
text holding the phrase holds its escaped form; both the ``ensure_ascii`` spellings are tried) in the memory-mapped
file, jumps to the next line after each find, and then checks each candidate line exactly (the find may lie in the
title, the id or the metadata): one ``bytes.find`` per candidate document, one ``json.loads`` per candidate.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import numpy as np

from twotower.errors import DataError


def text_phrase(value: Any) -> str:
    """The phrase of ``{"$text": {"$contains": phrase}}`` (a non-empty string), or a DataError naming ``$text``."""
    example = '{"$text": {"$contains": "green tea"}}'
    if not isinstance(value, dict) or set(value) != {"$contains"}:
        raise DataError("filter", f"$text takes {{\"$contains\": \"phrase\"}}, got "
                        f"{json.dumps(value, default=str)[:60]}", field="$text", hint=f"e.g. {example}")
    phrase = value["$contains"]
    if not isinstance(phrase, str) or not phrase:
        raise DataError("filter", "$text.$contains takes a non-empty string, got "
                        f"{json.dumps(phrase, default=str)[:60]}", field="$text.$contains", hint=f"e.g. {example}")
    return phrase


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


__all__ = ["TextScan", "text_phrase"]
