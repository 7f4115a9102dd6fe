"""Bring your own embeddings: an index whose vectors come from outside twotower's encoders.

:class:`ExternalEncoder` stands where a :class:`~twotower.encoders.towers.DualEncoder` stands for indexing and
searching (``encode_documents``, ``encode_queries``, ``dim``), over one of

- a **callable** from a list of texts to vectors (a list of lists or a 2-D array): the same function encodes
  documents and queries;
- a **LangChain** ``Embeddings`` (``embed_documents`` for documents, ``embed_query`` for queries);
- a **LlamaIndex** embedding model (``get_text_embedding_batch`` for documents, ``get_query_embedding`` for
  queries);
- nothing: an index of **precomputed vectors** (``vectors=``), searched with ``query_vector=``, or with an
  embedding given when it is opened.

Vectors are L2-normalised (scores are cosine similarities, whatever the embedding's own scale), and checked: one
per text, finite, not all zero, all of one size. The manifest records what the index was built with
(:meth:`ExternalEncoder.manifest_info`: the kind, the class or function's import path, the dimension), never the
object itself: a function or a client holding an API key cannot be stored safely. So an index built with an
embedding needs it again at :meth:`Index.open <twotower.Index.open>` (``embedding=``), where it is checked
against the record: another class or function, or vectors of another size, are refused.

Example::

    import numpy as np
    from twotower.encoders.external import ExternalEncoder

    enc = ExternalEncoder(lambda texts: np.ones((len(texts), 4)))
    assert enc.encode_documents(["a", "b"]).shape == (2, 4) and enc.manifest_info()["embedding"]["kind"] == "callable"
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from twotower.errors import TwoTowerError

__all__ = ["ExternalEncoder", "describe", "is_external", "check_vectors", "real_array"]

KINDS = ("callable", "langchain", "llama_index", "vectors")


def describe(embedding) -> tuple[str, str]:
    """``(kind, import path)`` of an embedding: ``langchain`` (an object with ``embed_documents`` and
    ``embed_query``), ``llama_index`` (``get_text_embedding_batch`` and ``get_query_embedding``) or ``callable``;
    a :class:`TwoTowerError` naming ``embedding`` for anything else."""
    if hasattr(embedding, "embed_documents") and hasattr(embedding, "embed_query"):
        kind = "langchain"
    elif hasattr(embedding, "get_text_embedding_batch") and hasattr(embedding, "get_query_embedding"):
        kind = "llama_index"
    elif callable(embedding):
        kind = "callable"
    else:
        raise TwoTowerError(f"embedding: give a function from a list of texts to vectors, a LangChain Embeddings or "
                            f"a LlamaIndex embedding model, not {type(embedding).__name__}")
    named = embedding if kind == "callable" and hasattr(embedding, "__qualname__") else type(embedding)
    return kind, f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', type(named).__name__)}"


def real_array(values, where: str, what: str = "vectors of numbers, all of one size") -> np.ndarray:
    """``values`` (an array, a list of lists, anything numpy reads) as float32, refusing what a float32 cast would
    change without a word: complex numbers (their imaginary part dropped), bools, text (``"1.5"`` parsed), dates;
    a :class:`TwoTowerError` naming ``where``."""
    import numbers

    try:
        raw = values if isinstance(values, np.ndarray) else np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TwoTowerError(f"{where}: expected {what} ({exc})") from None
    kind = raw.dtype.kind
    bad = None
    if kind == "O":  # mixed Python objects: each must be a real number (not a bool, not a complex, not a str)
        bad = next((v for v in raw.ravel() if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real)),
                   None)
        if bad is None:
            kind = "f"
    elif kind not in "iuf":
        bad = raw.ravel()[0] if raw.size else raw.dtype
    if kind == "c" or isinstance(bad, numbers.Complex) and not isinstance(bad, numbers.Real):
        shown = raw.dtype.name if kind == "c" else _short(bad)
        raise TwoTowerError(f"{where}: complex numbers ({shown}); vectors are real, and a cast would drop the "
                            "imaginary part: give real vectors (e.g. the real part, or the real and imaginary parts "
                            "side by side)")
    if kind != "f" and kind not in "iu":
        name = "a bool" if isinstance(bad, (bool, np.bool_)) else f"a {type(bad).__name__}"
        raise TwoTowerError(f"{where}: expected {what}, found {name} ({_short(bad)}): give the vectors as numbers "
                            "(e.g. a float32 array)")
    try:
        return raw.astype(np.float32, copy=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TwoTowerError(f"{where}: expected {what} ({exc})") from None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_vectors(vectors, count: int, where: str, dim: int | None = None, *, normalize: bool = True) -> np.ndarray:
    """``vectors`` as a C-contiguous float32 ``(count, dim)`` array, L2-normalised when ``normalize``; a
    :class:`TwoTowerError` naming ``where`` when there are not ``count`` of them, they are not all of ``dim``
    numbers (when given), or one is not finite or all zeros; complex numbers, bools and text are refused
    (:func:`real_array`)."""
    array = real_array(vectors, where, f"{count} vectors of numbers, all of one size")
    if array.ndim != 2 or array.shape[0] != count:
        raise TwoTowerError(f"{where}: expected {count} vectors (an array of shape ({count}, dim)), got shape "
                            f"{array.shape}")
    if array.shape[1] == 0:
        raise TwoTowerError(f"{where}: the vectors have no dimensions")
    if dim is not None and array.shape[1] != dim:
        raise TwoTowerError(f"{where}: {array.shape[1]}-d vectors, but the index holds {dim}-d vectors: encode "
                            "with the embedding the index was built with")
    bad = np.flatnonzero(~np.isfinite(array).all(axis=1))
    if bad.size:
        raise TwoTowerError(f"{where}: vector {int(bad[0])} holds NaN or infinity")
    if normalize:
        norms = np.linalg.norm(array, axis=1, keepdims=True)
        zero = np.flatnonzero(norms[:, 0] == 0)
        if zero.size:
            raise TwoTowerError(f"{where}: vector {int(zero[0])} is all zeros (it has no direction to compare)")
        array = array / norms
    return np.ascontiguousarray(array, dtype=np.float32)


def is_external(info: dict | None) -> bool:
    """Whether a manifest's ``model`` record is an :class:`ExternalEncoder`'s."""
    return bool(info) and isinstance(info.get("embedding"), dict)


class ExternalEncoder:
    """An embedding (or none: precomputed vectors) behind the interface indexing and searching use.

    ``embedding``: see the module; None for precomputed vectors (queries then come as vectors). ``dim``: the
    index's vector size when known (an index being opened), checked on every encoding. ``record``: the manifest's
    record of an index being opened: ``embedding`` must be of the kind and class it names."""

    multivector = None
    query_max_length = doc_max_length = None

    def __init__(self, embedding=None, *, dim: int | None = None, normalize: bool = True,
                 record: dict | None = None) -> None:
        self.embedding = embedding
        self.kind, self.source = describe(embedding) if embedding is not None else ("vectors", None)
        self.normalize = normalize
        self._dim = dim
        if record is not None:
            self._check_record(record)

    def _check_record(self, record: dict) -> None:
        built = record.get("embedding") or {}
        if self.kind == "vectors" or built.get("kind") == "vectors":
            return  # precomputed vectors: any embedding of their size may encode queries (checked per query)
        if (built.get("kind"), built.get("source")) != (self.kind, self.source):
            raise TwoTowerError(f"embedding: this index was built with the {built.get('kind')} embedding "
                                f"{built.get('source')}, and {self.source} ({self.kind}) is another encoder, whose "
                                "vectors are not comparable with the stored ones: give the index's own")

    # ------------------------------------------------------------------ what indexing reads
    @property
    def dim(self) -> int:
        if self._dim is None:
            raise TwoTowerError("embedding: the vector size is known once documents are encoded")
        return self._dim

    @property
    def doc_tower(self) -> SimpleNamespace:
        return SimpleNamespace(dim=self.dim, pooling=None, normalize=self.normalize)

    @property
    def query_tower(self):
        raise TwoTowerError("query_runtime: ONNX Runtime encodes twotower's own query tower; an index built with "
                            "your own embedding encodes queries with it (leave query_runtime out)")

    def manifest_info(self) -> dict:
        """What the manifest records: the kind, the class or function's import path and the dimension."""
        name = self.source or "precomputed vectors"
        return {"name": f"{self.kind}: {name}", "path": None, "pooling": None, "normalize": self.normalize,
                "query_max_length": None, "doc_max_length": None,
                "embedding": {"kind": self.kind, "source": self.source, "dim": self.dim, "normalize": self.normalize}}

    # ------------------------------------------------------------------ encoding
    def _need(self, what: str):
        if self.embedding is None:
            raise TwoTowerError(f"this index holds precomputed vectors and has no embedding to encode {what} with: "
                                + ("give vectors= with the documents" if what == "documents" else
                                   "search with query_vector=, or open it with embedding=")
                                + " (docs: Your documents, Bring your own embeddings)")
        return self.embedding

    def _checked(self, vectors, count: int, where: str) -> np.ndarray:
        out = check_vectors(vectors, count, where, self._dim, normalize=self.normalize)
        self._dim = out.shape[1]
        return out

    def encode_documents(self, texts: list[str], opts=None) -> np.ndarray:
        """Document vectors from the embedding (documents side), checked and normalised."""
        embedding = self._need("documents")
        texts = list(texts)
        if self.kind == "langchain":
            raw = embedding.embed_documents(texts)
        elif self.kind == "llama_index":
            raw = embedding.get_text_embedding_batch(texts)
        else:
            raw = embedding(texts)
        return self._checked(raw, len(texts), f"embedding ({self.source}) of {len(texts)} documents")

    def encode_queries(self, queries: list[str], opts=None) -> np.ndarray:
        """Query vectors from the embedding (query side), checked against the index's size and normalised."""
        embedding = self._need("queries")
        queries = list(queries)
        if self.kind == "langchain":
            raw = [embedding.embed_query(q) for q in queries]
        elif self.kind == "llama_index":
            raw = [embedding.get_query_embedding(q) for q in queries]
        else:
            raw = embedding(queries)
        return self._checked(raw, len(queries), f"embedding ({self.source}) of {len(queries)} queries")


class GivenVectors(ExternalEncoder):
    """Precomputed document vectors for one write (``vectors=``), taken in the order of the documents; queries (and
    the record) from ``base``, the index's own encoder."""

    def __init__(self, vectors, base: ExternalEncoder | None, count: int, dim: int | None = None) -> None:
        super().__init__(base.embedding if base is not None else None, dim=dim,
                         normalize=base.normalize if base is not None else True)
        self.kind, self.source = (base.kind, base.source) if base is not None else ("vectors", None)
        self._vectors = self._checked(vectors, count, "vectors")

    def encode_documents(self, texts: list[str], opts=None) -> np.ndarray:
        if len(texts) != len(self._vectors):
            raise TwoTowerError(f"vectors: {len(self._vectors)} vectors for {len(texts)} documents")
        return self._vectors
