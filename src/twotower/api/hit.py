"""A search result (:class:`Hit`), and the lock one :class:`~twotower.Index` takes around each call."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Hit"]


@dataclass
class Hit:
    """One search result: the document's ``id``, its ``score`` (higher is better), ``title``, ``text`` and
    ``metadata`` (the document's metadata exactly as it was given, any key included, ``{}`` when it has none).

    Example::

        hit = index.search("green tea", k=1)[0]
        print(hit.id, round(hit.score, 3), hit.title, hit.metadata, hit.document)
    """

    id: str
    score: float
    title: str
    text: str
    metadata: dict = field(default_factory=dict)

    @property
    def document(self) -> dict:
        """``{"_id", "title", "text", **metadata}``, the flat form of a BEIR corpus (:meth:`Index.add` takes it back);
        a :class:`~twotower.DataError` naming the key when the metadata holds ``_id``, ``id``, ``title`` or ``text``,
        which the flat form cannot tell apart from the document's own (use ``id``, ``text``, ``metadata``)."""
        from twotower.data.metadata import flat_document

        return flat_document(self.id, self.title, self.text, self.metadata, f"hit {self.id!r}")


def _locked(method):
    """``method`` run under the index's lock: a tokenizer (Hugging Face's fast ones) and a version switch are not
    safe under concurrent calls, so one Index serves one call at a time (threads may share it)."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper
