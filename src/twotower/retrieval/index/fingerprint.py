"""Which corpus an index holds: a fingerprint of its documents, kept up to date by every write.

The fingerprint is the sum, modulo 2^256, of one sha256 per document over ``[id, title, text]``
(JSON): independent of order, and updated by adding and subtracting documents without re-reading the
rest. It tells an index apart from a corpus that differs by a document, a title or a text (it is no
defence against a forger).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

SCHEME = "sum-sha256-v1"
_MOD = 1 << 256


def document_digest(doc_id: str, title: str, text: str) -> int:
    data = json.dumps([doc_id, title, text], ensure_ascii=False).encode("utf-8")
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def combine(docs: Iterable[tuple[str, str, str]]) -> int:
    """The fingerprint (an int) of ``(id, title, text)`` triples."""
    total = 0
    for doc_id, title, text in docs:
        total += document_digest(doc_id, title, text)
    return total % _MOD


def of_corpus(corpus: dict) -> int:
    """The fingerprint of a loaded corpus (``{id: Document}``, as :func:`twotower.data.beir.load_corpus`)."""
    return combine((d.id, d.title, d.text) for d in corpus.values())


def entry(*parts: int) -> dict:
    """The manifest's ``corpus`` entry for the sum of ``parts`` (fingerprints; negate one to subtract)."""
    return {"scheme": SCHEME, "fingerprint": f"{sum(parts) % _MOD:064x}"}


def parse(value: object) -> int | None:
    """The fingerprint in a manifest's ``corpus`` entry; None when missing or of another scheme."""
    if not isinstance(value, dict) or value.get("scheme") != SCHEME:
        return None
    try:
        return int(str(value.get("fingerprint")), 16)
    except ValueError:
        return None
