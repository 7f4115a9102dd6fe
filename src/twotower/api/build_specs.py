"""The option groups of :meth:`Index.build <twotower.Index.build>`, one small frozen dataclass each, checked when it
is made: the ANN structure (:class:`ANN`), compressed vectors (:class:`Compression`), long documents as passages
(:class:`Passages`), where the encoding runs (:class:`Ray`) and which backend holds the index (:class:`Milvus`).
A plain build needs none of them: ``tt.Index.build("my-index", "my-folder")``.

A wrong field is a :class:`~twotower.TwoTowerError` naming it as you wrote it (``ANN.m=1: a whole number at least
2``); from the command line, its flag (``--hnsw-m 1``).

Example::

    import twotower as tt

    index = tt.Index.build("my-index", "my-folder", kind="hnsw", ann=tt.ANN(m=48, ef_construction=400),
                           compression=tt.Compression("int8"), passages=tt.Passages(window=128))
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields

from twotower.checks import check_number, flag, given, naming
from twotower.errors import TwoTowerError

__all__ = ["ANN", "Compression", "Passages", "Ray", "Milvus"]

# True while old keywords (Index.build(hnsw_m=...)) are turned into specs: messages name the keyword the caller wrote
_KEYWORDS: ContextVar[bool] = ContextVar("twotower_build_keywords", default=False)


@contextmanager
def keyword_names():
    """Within this block a spec's messages name its fields by :meth:`Index.build`'s old keywords (``hnsw_m=``)."""
    token = _KEYWORDS.set(True)
    try:
        yield
    finally:
        _KEYWORDS.reset(token)


def _label(spec, field: str) -> str:
    """A field as the caller wrote it: ``ANN.m`` (rendered ``ANN.m=``), or the old keyword (``hnsw_m=`` in Python,
    ``--hnsw-m`` from the command line) when it came from one."""
    if naming() == "cli" or _KEYWORDS.get():
        return spec._keywords[field]
    return f"{type(spec).__name__}.{field}"


def _number(spec, field: str, **rule):
    return check_number(getattr(spec, field), _label(spec, field), **rule)


def _choice(spec, field: str, choices: tuple, optional: bool = False) -> None:
    value = getattr(spec, field)
    if (value is None and optional) or (isinstance(value, str) and value in choices):
        return
    raise TwoTowerError(f"{given(_label(spec, field), value)}: choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class ANN:
    """How an approximate (ANN) index is built; ``kind=`` of :meth:`Index.build <twotower.Index.build>` picks it
    (``hnsw`` | ``ivf`` | ``ivfpq``), this tunes it. A field applies to its kind only (``m`` to hnsw, ``nlist`` to
    ivf and ivfpq, ``pq_m`` to ivfpq): a value the kind would not use is refused at the build.

    Example::

        index = tt.Index.build("my-index", docs, kind="hnsw", ann=tt.ANN(m=48, ef_construction=400))
        index = tt.Index.build("my-ivf", docs, kind="ivfpq", ann=tt.ANN(nlist=1024, pq_m=48))
    """

    m: int = 32  # HNSW: links per node (the graph's degree); more: better recall, more memory
    ef_construction: int = 200  # HNSW: candidates weighed per node while the graph is built
    nlist: int | None = None  # IVF: lists (centroids); None: about 4·√n, at most n / 39
    pq_m: int | None = None  # IVF-PQ: sub-quantizers, a divisor of the dimension; None: about dim / 8
    train_size: int = 200_000  # IVF / PQ: vectors sampled to train the centroids and codes

    _keywords = {"m": "hnsw_m", "ef_construction": "ef_construction", "nlist": "nlist", "pq_m": "pq_m",
                 "train_size": "train_size"}

    def __post_init__(self) -> None:
        for field, least in (("m", 2), ("ef_construction", 1), ("nlist", 1), ("pq_m", 1), ("train_size", 1)):
            _number(self, field, integer=True, minimum=least, maximum=1 << 24, optional=field in ("nlist", "pq_m"))


@dataclass(frozen=True)
class Compression:
    """How the index stores its vectors (:mod:`twotower.retrieval.index.codecs`): ``vectors`` ``fp32`` (as
    encoded), ``fp16``, ``int8`` (per-dimension ranges from the corpus) or ``binary`` (sign bits searched by
    Hamming distance, the top ``k × rescore_factor`` then rescored against ``rescore`` vectors read from disk:
    ``int8`` (default), ``fp32``, or ``none``); ``dim``: keep each vector's first ``dim`` dimensions, re-normalised
    (queries are cut alike; Matryoshka-trained models keep most of their quality).

    Example::

        index = tt.Index.build("small-index", docs, compression=tt.Compression("int8", dim=256))
        index = tt.Index.build("bits-index", docs, compression=tt.Compression("binary", rescore="fp32"))
    """

    vectors: str = "fp32"  # fp32 | fp16 | int8 | binary
    dim: int | None = None  # keep the first dim dimensions; None: all
    rescore: str | None = None  # binary only: int8 (None: the default) | fp32 | none
    rescore_factor: int = 4  # binary only: rescore k × this many Hamming candidates

    _keywords = {"vectors": "vectors", "dim": "dim", "rescore": "rescore", "rescore_factor": "rescore_factor"}

    def __post_init__(self) -> None:
        from twotower.retrieval.index.codecs import DEFAULT_RESCORE_FACTOR, RESCORE_TYPES, VECTOR_TYPES

        _choice(self, "vectors", VECTOR_TYPES)
        _number(self, "dim", integer=True, minimum=1, optional=True)
        _number(self, "rescore_factor", integer=True, minimum=1, maximum=1 << 20,
                hint="the binary search fetches k × factor candidates to rescore")
        binary = given(_label(self, "vectors"), "binary")
        if self.rescore_factor != DEFAULT_RESCORE_FACTOR and self.vectors != "binary":
            raise TwoTowerError(f"{flag(_label(self, 'rescore_factor'))} applies to binary vectors, not "
                                f"'{self.vectors}': drop it or pass {binary}")
        _choice(self, "rescore", RESCORE_TYPES, optional=True)
        if self.rescore is not None and self.vectors != "binary":
            raise TwoTowerError(f"{flag(_label(self, 'rescore'))} applies to {binary}, not '{self.vectors}': drop it "
                                f"or pass {binary}")


@dataclass(frozen=True)
class Passages:
    """How a document longer than the encoder's window is split into passages, one vector each
    (:mod:`twotower.encoders.passages`); ``passages=True`` is ``Passages()``, ``passages=False`` keeps each
    document's first window only. ``window``: tokens per passage, title included (None: the encoder's document
    length); ``overlap``: tokens two neighbours share (None: an eighth of the window); ``max_passages``: the most a
    document may make (a longer one is refused); ``score``: ``max`` (a document scores as its best passage) or
    ``first`` (as its first, close to truncation's ranking; hits still carry their best passages). With an embedding
    of your own, ``window`` and ``overlap`` count characters.

    Example::

        index = tt.Index.build("long-docs", docs, passages=tt.Passages(window=128, overlap=16))
    """

    window: int | None = None  # tokens per passage, title included; None: the encoder's document length
    overlap: int | None = None  # tokens shared by neighbouring passages; None: an eighth of the window
    max_passages: int = 1000  # passages a document may make at most (encoders.passages.MAX_PASSAGES)
    score: str = "max"  # max (its best passage) | first (its first passage)

    _keywords = {"window": "passage_window", "overlap": "passage_overlap", "max_passages": "max_passages",
                 "score": "passage_score"}

    def __post_init__(self) -> None:
        from twotower.encoders.passages import SCORES

        _number(self, "window", integer=True, minimum=1, optional=True)
        _number(self, "overlap", integer=True, minimum=0, optional=True)
        _number(self, "max_passages", integer=True, minimum=1)
        if not isinstance(self.score, str) or self.score not in SCORES:  # worded as PassageSpec words it
            raise TwoTowerError(f"{flag(_label(self, 'score'))} is one of {', '.join(SCORES)}, not {self.score!r}")

    def spec(self):
        """The :class:`~twotower.encoders.passages.PassageSpec` the index is written with."""
        from twotower.encoders.passages import PassageSpec

        return PassageSpec(window=self.window, overlap=self.overlap, max_passages=self.max_passages, score=self.score)


@dataclass(frozen=True)
class Ray:
    """Encode on a Ray cluster instead of here: an actor pool holding the model (:mod:`twotower.scale.ray_encode`);
    ``ray=True`` is ``Ray()``. The corpus and the encoder are given as paths or names (every worker reads them);
    the index is written to a local FAISS folder, one vector per document. ``address``: ``auto`` | ``local`` |
    ``ray://host:port`` (None: Ray's default); ``workers``: actors (None: one per CPU or GPU);
    ``gpus_per_worker``: GPUs each actor holds (0: CPU).

    Example::

        index = tt.Index.build("big-index", "corpus.jsonl", ray=tt.Ray(address="auto", workers=8, gpus_per_worker=1))
    """

    address: str | None = None  # auto | local | ray://host:port; None: Ray's default
    workers: int | None = None  # actors; None: one per CPU or GPU
    gpus_per_worker: float = 0.0  # GPUs per actor (a fraction shares one)

    _keywords = {"address": "ray_address", "workers": "workers", "gpus_per_worker": "gpus_per_worker"}

    def __post_init__(self) -> None:
        if self.address is not None and not isinstance(self.address, str):
            raise TwoTowerError(f"{flag(_label(self, 'address'))}: auto, local or ray://host:port, not "
                                f"{type(self.address).__name__}")
        _number(self, "workers", integer=True, minimum=1, optional=True)
        _number(self, "gpus_per_worker", minimum=0, maximum=1024)


@dataclass(frozen=True)
class Milvus:
    """Keep the vectors, documents and BM25 in a Milvus collection (:mod:`twotower.retrieval.milvus`); the index
    folder keeps the manifest. ``uri``: a Milvus Lite file (a path ending in ``.db``) or a server
    ``http(s)://host:19530`` (token from ``TWOTOWER_MILVUS_TOKEN``, never in the URI); ``collection``: its name
    (None: ``twotower_`` and the folder's name). ``backend="milvus"`` alone names no ``uri``.

    Example::

        index = tt.Index.build("my-index", docs, kind="hnsw", backend=tt.Milvus("http://localhost:19530",
                                                                              collection="docs"))
    """

    uri: str  # a Milvus Lite .db file or http(s)://host:19530
    collection: str | None = None  # None: twotower_<the index folder's name>

    _keywords = {"uri": "uri", "collection": "collection"}

    def __post_init__(self) -> None:
        if isinstance(self.uri, os.PathLike):
            object.__setattr__(self, "uri", os.fspath(self.uri))
        if not isinstance(self.uri, str) or not self.uri:
            raise TwoTowerError(f"{flag(_label(self, 'uri'))}: give a Milvus Lite file (a path ending in .db) or a "
                                f"Milvus server (http://host:19530), not {self.uri!r}")
        if self.collection is not None and (not isinstance(self.collection, str) or not self.collection):
            raise TwoTowerError(f"{flag(_label(self, 'collection'))}: a collection name (letters, digits and _), not "
                                f"{self.collection!r}")


SPECS = (ANN, Compression, Passages, Ray, Milvus)


def spec_fields(spec) -> dict:
    """``{field: value}`` of a spec (the dataclass fields only)."""
    return {f.name: getattr(spec, f.name) for f in fields(spec)}
