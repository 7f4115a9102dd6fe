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
against the record (:meth:`ExternalEncoder.check_record`). An embedding's identity is its kind and its name, not
where it is defined: the function or class name (``__qualname__``) without its module, so that a function defined
in a script (module ``__main__``) reopens the index from the module it moved to; the name a user sets as a
``twotower_name`` attribute on the function or object instead, where it has one (recorded as ``name``: e.g.
``embed.twotower_name = "my-embedder-v1"``, which also lets a renamed function reopen an index); and the model
name a LangChain / LlamaIndex embedding carries (``model`` or ``model_name``, recorded as ``model``). Another kind,
name or model is refused at open; vectors of another size on every encoding.

Errors raised by the embedding itself reach a Python caller as they are (its own exception, to catch or retry);
inside :func:`embedding_errors` (the service: :mod:`twotower.serve.state`) they, and vectors of the wrong form
from it, come as :class:`EmbeddingFailed`, which names the embedding, the exception's type and message.

Example::

    import numpy as np
    from twotower.encoders.external import ExternalEncoder

    enc = ExternalEncoder(lambda texts: np.ones((len(texts), 4)))
    assert enc.encode_documents(["a", "b"]).shape == (2, 4) and enc.manifest_info()["embedding"]["kind"] == "callable"
"""

from __future__ import annotations

import contextlib
import contextvars
from types import SimpleNamespace

import numpy as np

from twotower.errors import TwoTowerError

__all__ = ["EmbeddingFailed", "ExternalEncoder", "check_vectors", "describe", "embedding_errors", "is_external",
           "real_array"]

KINDS = ("callable", "langchain", "llama_index", "vectors")
NAME_ATTRIBUTE = "twotower_name"  # the identity a user gives an embedding (a function's or an object's attribute)
MODEL_ATTRIBUTES = ("model", "model_name")  # LangChain (OpenAIEmbeddings.model, HuggingFaceEmbeddings.model_name),
# LlamaIndex (BaseEmbedding.model_name)
MAX_ERROR_CHARS = 500  # of the embedding's own exception message, in EmbeddingFailed

_WRAP_ERRORS = contextvars.ContextVar("twotower_embedding_errors", default=False)


class EmbeddingFailed(TwoTowerError):
    """The embedding of your own raised, or returned what is not vectors of the index's size, inside
    :func:`embedding_errors`: not the request's fault (the service answers 502)."""


@contextlib.contextmanager
def embedding_errors():
    """Within it (this thread or task), an :class:`ExternalEncoder`'s embedding that raises, or returns vectors
    that fail the checks, raises :class:`EmbeddingFailed` (the original as its ``__cause__``) instead."""
    token = _WRAP_ERRORS.set(True)
    try:
        yield
    finally:
        _WRAP_ERRORS.reset(token)


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
    named = _named(embedding, kind)
    return kind, f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', type(named).__name__)}"


def _named(embedding, kind: str):
    """What names an embedding: a function (or anything with a ``__qualname__``) itself, else its class."""
    return embedding if kind == "callable" and hasattr(embedding, "__qualname__") else type(embedding)


def _text_attribute(obj, names) -> str | None:
    """The first of ``names`` that ``obj`` holds as a non-empty string (None: none; an attribute that raises when
    read counts as absent)."""
    for name in names:
        try:
            value = getattr(obj, name, None)
        except Exception:  # noqa: BLE001 - a property of the user's object; its identity is then unknown
            value = None
        if isinstance(value, str) and value.strip():
            return value
    return None


def identity(embedding, kind: str) -> dict:
    """What names ``embedding`` beyond its import path: ``qualname`` (the function or class name, without its
    module), ``name`` (its ``twotower_name``, or None) and ``model`` (a LangChain / LlamaIndex model name, or
    None)."""
    named = _named(embedding, kind)
    return {"qualname": getattr(named, "__qualname__", type(named).__name__),
            "name": _text_attribute(embedding, (NAME_ATTRIBUTE,)),
            "model": _text_attribute(embedding, MODEL_ATTRIBUTES)}


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
        self.identity = identity(embedding, self.kind) if embedding is not None else {}
        self.normalize = normalize
        self._dim = dim
        if record is not None:
            self.check_record(record)

    def check_record(self, record: dict) -> None:
        """Refuse an embedding other than the one the manifest's ``record`` names: another kind (a function, a
        LangChain or a LlamaIndex embedding), another name (the function or class name, whatever its module; or
        the ``twotower_name`` recorded), another model name. Vectors of another size are refused per encoding."""
        built = record.get("embedding") or {}
        if self.kind == "vectors" or built.get("kind") == "vectors":
            return  # precomputed vectors: any embedding of their size may encode queries (checked per query)
        b_kind, b_source, b_name, b_model = (built.get("kind"), built.get("source") or "?", built.get("name"),
                                             built.get("model"))
        mine = self.identity.get("name") or self.identity.get("qualname") or ""
        if b_name:  # the user named the embedding at build: that name is its identity
            same_name = mine == b_name
            wanted = b_name
        else:  # the function or class name; its module may differ (a script's __main__, a module moved)
            same_name = b_source == self.source or (bool(mine) and b_source.endswith("." + mine))
            wanted = b_source.rsplit(".", 1)[-1]
        model = self.identity.get("model")
        same_model = not (b_model and model and b_model != model)
        if b_kind == self.kind and same_name and same_model:
            return
        recorded = f"the {b_kind} embedding {b_source}" + (f" (named {b_name!r})" if b_name else "") + (
            f" of model {b_model!r}" if b_model else "")
        given = f"{self.source} ({self.kind}" + (f", named {self.identity['name']!r}" if self.identity.get("name")
                                                  else "") + (f", model {model!r}" if model else "") + ")"
        if b_kind != self.kind:
            why = f"a {self.kind} embedding, not a {b_kind} one"
        elif not same_model:
            why = f"model {model!r}, not {b_model!r}"
        else:
            why = f"named {mine!r}, not {wanted!r}"
        hint = (f"give tt.Index.open(path, embedding=...) the {b_kind} embedding the index was built with (the same "
                f"{'twotower_name' if b_name else 'function or class name; its module may differ'}"
                + (f", model {b_model!r}" if b_model else "") + "), or search with query_vector=")
        if b_kind == self.kind and same_model and not same_name:
            hint += (f"; if it is the same embedding under another name, say so: set its twotower_name attribute to "
                     f"{wanted!r} (e.g. my_embedding.twotower_name = {wanted!r})")
        raise TwoTowerError(f"embedding: this index was built with {recorded}, and {given} is another encoder "
                            f"({why}), whose vectors are not comparable with the stored ones: {hint}")

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
        """What the manifest records: the kind, the class or function's import path and the dimension; the
        embedding's ``twotower_name`` (``name``) and model name (``model``) where it has them."""
        name = self.source or "precomputed vectors"
        named = {key: self.identity[key] for key in ("name", "model") if self.identity.get(key)}
        return {"name": f"{self.kind}: {name}", "path": None, "pooling": None, "normalize": self.normalize,
                "query_max_length": None, "doc_max_length": None,
                "embedding": {"kind": self.kind, "source": self.source, "dim": self.dim, "normalize": self.normalize,
                              **named}}

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

    def _embed(self, call, texts: list[str], what: str) -> np.ndarray:
        """``call(texts)`` (the embedding's side for ``what``), its vectors checked; within
        :func:`embedding_errors` an exception from it, or vectors that fail the checks, as :class:`EmbeddingFailed`."""
        where = f"embedding ({self.source}) of {len(texts)} {what}"
        try:
            return self._checked(call(texts), len(texts), where)
        except Exception as exc:  # the user's code: anything it raises is its own
            if not _WRAP_ERRORS.get():
                raise
            if isinstance(exc, TwoTowerError) and str(exc).startswith(where):  # its vectors, refused by the checks
                raise EmbeddingFailed(f"the index's embedding returned unusable vectors: {exc}") from exc
            message = " ".join(str(exc).split())
            if len(message) > MAX_ERROR_CHARS:
                message = message[:MAX_ERROR_CHARS - 3] + "..."
            count = f"{len(texts)} {what}" if len(texts) != 1 else {"queries": "a query", "documents": "a document"}[what]
            raise EmbeddingFailed(f"the index's embedding ({self.kind}: {self.source}) failed on {count}: "
                                  f"{type(exc).__name__}" + (f": {message}" if message else "")) from exc

    def encode_documents(self, texts: list[str], opts=None) -> np.ndarray:
        """Document vectors from the embedding (documents side), checked and normalised."""
        embedding = self._need("documents")
        if self.kind == "langchain":
            call = embedding.embed_documents
        elif self.kind == "llama_index":
            call = embedding.get_text_embedding_batch
        else:
            call = embedding
        return self._embed(call, list(texts), "documents")

    def encode_queries(self, queries: list[str], opts=None) -> np.ndarray:
        """Query vectors from the embedding (query side), checked against the index's size and normalised."""
        embedding = self._need("queries")
        if self.kind == "langchain":
            def call(texts):
                return [embedding.embed_query(q) for q in texts]
        elif self.kind == "llama_index":
            def call(texts):
                return [embedding.get_query_embedding(q) for q in texts]
        else:
            call = embedding
        return self._embed(call, list(queries), "queries")


class GivenVectors(ExternalEncoder):
    """Precomputed document vectors for one write (``vectors=``), taken in the order of the documents; queries (and
    the record) from ``base``, the index's own encoder."""

    def __init__(self, vectors, base: ExternalEncoder | None, count: int, dim: int | None = None) -> None:
        super().__init__(base.embedding if base is not None else None, dim=dim,
                         normalize=base.normalize if base is not None else True)
        self.kind, self.source = (base.kind, base.source) if base is not None else ("vectors", None)
        self.identity = dict(base.identity) if base is not None else {}
        self._vectors = self._checked(vectors, count, "vectors")

    def encode_documents(self, texts: list[str], opts=None) -> np.ndarray:
        if len(texts) != len(self._vectors):
            raise TwoTowerError(f"vectors: {len(self._vectors)} vectors for {len(texts)} documents")
        return self._vectors
