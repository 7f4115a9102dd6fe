"""The encoder: text in, numpy vectors out (both towers, their prefixes, pooling and projection honoured)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from twotower.api._errors import user_errors
from twotower.checks import check_number
from twotower.data.ids import check_texts
from twotower.errors import TwoTowerError

__all__ = ["Encoder", "document_text"]


def document_text(doc) -> str:
    """A document as the models read it: a string as is; ``{"title", "text"}`` (or a
    :class:`~twotower.Document`) as title and text joined by a space, as BEIR and every twotower command do."""
    if isinstance(doc, str):
        return doc
    if isinstance(doc, Mapping):
        title, text = doc.get("title") or "", doc.get("text")
        if not isinstance(text, str) or not isinstance(title, str):
            raise TwoTowerError(f"a document dict needs a string 'text' (and optionally a string 'title'), got "
                                f"{ {k: type(v).__name__ for k, v in doc.items()} }")
        return f"{title} {text}".strip() if title else text
    if hasattr(doc, "full_text"):
        return doc.full_text
    raise TwoTowerError(f"a document is a string or a dict with 'title' and 'text', got {type(doc).__name__}")


def _texts(items, what: str) -> list[str]:
    if isinstance(items, (str, Mapping)):
        raise TwoTowerError(f"{what}: give a list (one item per text), not a single {type(items).__name__}")
    return list(items)


class Encoder:
    """A dual encoder ready to embed: its query tower for queries, its document tower for documents.

    Load a registered name (``all-MiniLM-L6-v2``, the default; ``mpnet-base``; ``multilingual-e5-small``), any
    Hugging Face or sentence-transformers directory, a model written by :func:`twotower.train` or
    :func:`twotower.fit` (``OUT/model``), or a hub id where the network is reachable. Vectors come back as float32
    numpy arrays, one row per text, L2-normalised when the model uses cosine similarity.

    Example::

        import twotower as tt

        enc = tt.Encoder.load("all-MiniLM-L6-v2", device="cpu")
        q = enc.encode_queries(["how is green tea made"])
        d = enc.encode_documents([{"title": "Tea", "text": "Green tea leaves are steamed."}, "Coffee is roasted."])
        print(q.shape, (q @ d.T).round(3))
    """

    def __init__(self, model, *, source: str | None = None, precision: str = "auto",
                 batch_size: int | None = None, runtime: str = "auto") -> None:
        """Wrap a loaded ``twotower`` dual encoder (most users call :meth:`load`). ``source``: the name or
        directory it was loaded from (what an index records to load it again)."""
        from twotower.encoders.inference import check_precision
        from twotower.encoders.runtimes import check_runtime

        check_precision(precision)
        check_number(batch_size, "batch_size", integer=True, minimum=1, optional=True)
        self.runtime = check_runtime(runtime)
        self.model = model
        self.source = source
        self.precision = precision
        self.batch_size = batch_size

    @classmethod
    @user_errors
    def load(
        cls, name_or_dir: str | Path | None = None, *, device: str = "auto", precision: str = "auto",
        batch_size: int | None = None, pooling: str | None = None, query_max_length: int | None = None,
        doc_max_length: int | None = None, runtime: str = "auto",
    ) -> "Encoder":
        """Load a model by name or directory (None: all-MiniLM-L6-v2) onto ``device`` (``auto`` | ``cpu`` |
        ``cuda`` | ``cuda:N``). ``precision``: ``auto`` (bf16 where the CPU or GPU has fast bf16), ``fp32`` or
        ``bf16``. ``pooling`` and the max lengths override the model's own. ``runtime``: ``auto`` | ``torch`` |
        ``onnx`` | ``openvino`` | ``onnx-int8`` | ``openvino-int8`` (CPU runtimes, docs/guides/cpu-runtimes.md).

        Example::

            enc = tt.Encoder.load(device="cpu", precision="fp32")
            print(enc.name, enc.dim, enc.similarity)
        """
        from twotower.encoders.device import resolve_device
        from twotower.encoders.towers import DualEncoder

        for name, value in (("batch_size", batch_size), ("query_max_length", query_max_length),
                            ("doc_max_length", doc_max_length)):
            check_number(value, name, integer=True, minimum=1, optional=True)
        name_or_dir = model_argument(name_or_dir, "name_or_dir")  # an Encoder's source, a FitResult's model
        target = resolve_device(device)
        model = DualEncoder.load(name_or_dir, pooling=pooling, query_max_length=query_max_length,
                                 doc_max_length=doc_max_length, device=target)
        return cls(model, source=str(name_or_dir) if name_or_dir is not None else None, precision=precision,
                   batch_size=batch_size, runtime=runtime)

    # ------------------------------------------------------------------ facts
    @property
    def name(self) -> str:
        """The name or directory the model was loaded from."""
        return self.model.name

    @property
    def dim(self) -> int:
        """Dimensions of a vector."""
        return int(self.model.dim)

    @property
    def similarity(self) -> str:
        """``cosine`` (vectors normalised) or ``dot``."""
        return self.model.similarity

    @property
    def device(self) -> str:
        """Where the model runs, e.g. ``cpu`` or ``cuda:0``."""
        return str(self.model.device)

    @property
    def prompts(self) -> dict[str, str]:
        """The prefixes the model puts before queries and documents (e.g. e5's ``query: ``), if any."""
        return self.model.prompts

    @property
    def multivector(self) -> int | None:
        """ME-BERT's m when the model was trained with ``--multivector`` (see :meth:`encode_multivector`)."""
        return self.model.multivector

    def __repr__(self) -> str:
        return f"Encoder({self.name!r}, dim={self.dim}, towers={self.model.kind!r}, device={self.device!r})"

    # ------------------------------------------------------------------ encoding
    def _options(self, show_progress: bool, batch_size: int | None):
        from twotower.encoders.towers import EncodeOptions

        check_number(batch_size, "batch_size", integer=True, minimum=1, optional=True)

        return EncodeOptions(batch_size=batch_size or self.batch_size, precision=self.precision,
                             show_progress=show_progress, runtime=self.runtime)

    @user_errors
    def encode_queries(self, queries: Sequence[str], *, batch_size: int | None = None,
                       show_progress: bool = False) -> np.ndarray:
        """Embed queries with the query tower (behind the model's query prefix): an ``(n, dim)`` float32 array.

        Example::

            vecs = enc.encode_queries(["vitamin D and bone density", "green tea"])
            assert vecs.shape == (2, enc.dim)
        """
        texts = check_texts(_texts(queries, "queries"), "queries")
        return self.model.encode_queries(texts, self._options(show_progress, batch_size))

    @user_errors
    def encode_documents(self, docs: Sequence, *, batch_size: int | None = None,
                         show_progress: bool = False) -> np.ndarray:
        """Embed documents with the document tower: strings, ``{"title", "text"}`` dicts or
        :class:`~twotower.Document` objects (title and text joined as every command joins them). An ``(n, dim)``
        float32 array.

        Example::

            vecs = enc.encode_documents(["plain text", {"title": "A title", "text": "and its text"}])
            assert vecs.shape == (2, enc.dim)
        """
        texts = check_texts([document_text(d) for d in _texts(docs, "documents")], "documents")
        return self.model.encode_documents(texts, self._options(show_progress, batch_size))

    @user_errors
    def encode_multivector(self, docs: Sequence, m: int | None = None, *, batch_size: int | None = None,
                           show_progress: bool = False) -> list[np.ndarray]:
        """ME-BERT document vectors: for each document its first ``m`` contextual token vectors (default: the m the
        model was trained with, else 8), one ``(≤ m, dim)`` array per document; a query scores a document by the
        largest inner product with them.

        Example::

            per_doc = enc.encode_multivector(["a longer document about tea and coffee"], m=4)
            q = enc.encode_queries(["tea"])
            score = float((per_doc[0] @ q[0]).max())
        """
        from twotower.retrieval.multivector import encode_multivector

        m = self.multivector or 8 if m is None else check_number(m, "m", integer=True, minimum=1,
                                                                 hint="ME-BERT keeps at least one vector a document")
        check_number(batch_size, "batch_size", integer=True, minimum=1, optional=True)
        texts = check_texts([document_text(d) for d in _texts(docs, "documents")], "documents")
        vectors, offsets = encode_multivector(
            self.model.doc_tower, texts, m, max_length=self.model.doc_max_length,
            batch_size=batch_size or self.batch_size, precision=self.precision, show_progress=show_progress)
        return [vectors[offsets[i]:offsets[i + 1]] for i in range(len(texts))]

    def save(self, directory: str | Path) -> Path:
        """Write the model (``twotower.json`` + sentence-transformers tower folders) atomically; :meth:`load`,
        every command and sentence-transformers read it back.

        Example::

            path = enc.save("my-encoder")
            again = tt.Encoder.load(path)
        """
        from twotower.io import check_output_dir

        check_output_dir(directory, "directory", replaced=True)
        self.model.save(directory)
        return Path(directory)


def model_argument(value, name: str) -> str | Path | None:
    """A model parameter's value as a name or directory: None, a str or path as given; an Encoder's source (the name
    or directory it was loaded from; the default model's name for ``Encoder.load()``); a FitResult's ``model`` (any
    path-like object's path)."""
    if value is None or isinstance(value, (str, Path)):
        return value
    if isinstance(value, os.PathLike):  # a FitResult: its model
        return Path(os.fspath(value))
    if isinstance(value, Encoder):
        from twotower.encoders.layout import DEFAULT_MODEL  # Encoder.load(): the default model

        return value.source or DEFAULT_MODEL
    raise TwoTowerError(f"{name}: a model name or directory (a str or pathlib.Path), a tt.Encoder or a tt.FitResult, "
                        f"not {type(value).__name__}")
