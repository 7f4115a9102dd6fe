"""Your own vectors in :class:`~twotower.Index`'s calls: precomputed document vectors (``build(vectors=)``,
``add(vectors=)``) and query vectors (``search(query_vector=)``); see :mod:`twotower.encoders.external`.

Example::

    import numpy as np
    from twotower.api.index_vectors import precomputed

    assert precomputed(np.zeros((2, 3))) and not precomputed("fp16")
"""

from __future__ import annotations

import numpy as np

from twotower.errors import TwoTowerError

__all__ = ["precomputed", "query_inputs", "add_encoder"]


def precomputed(vectors) -> bool:
    """Whether ``vectors`` (the option of :meth:`Index.build <twotower.Index.build>`) are precomputed vectors (an
    array or a list of lists) rather than the name of a compression (``"fp16"``, ``"int8"``, ``"binary"``)."""
    return vectors is not None and not isinstance(vectors, str)


def query_inputs(query, query_vector) -> tuple[list, bool, np.ndarray | None, bool]:
    """``(queries, single, vectors, texts_given)`` for :meth:`Index.search <twotower.Index.search>`: the query
    texts (placeholders when only vectors are given), whether one query was asked, the query vectors (None: encode
    the texts) and whether texts were given (BM25 and re-ranking need them)."""
    if query_vector is None:
        if query is None:
            raise TwoTowerError("search: give query (a text or a list of texts), or query_vector")
        single = isinstance(query, str)
        return ([query] if single else list(query)), single, None, True
    from twotower.encoders.external import real_array

    # complex numbers, bools and text refused, not cast (an imaginary part would be dropped without a word)
    vectors = real_array(query_vector, "query_vector", "a vector (a list of numbers) or a list of vectors")
    if vectors.ndim not in (1, 2) or vectors.size == 0:
        raise TwoTowerError(f"query_vector: a vector or a list of vectors, got shape {vectors.shape}")
    single = vectors.ndim == 1
    vectors = np.atleast_2d(vectors)
    if query is None:
        return [f"<query_vector {i}>" for i in range(len(vectors))], single, vectors, False
    queries = [query] if isinstance(query, str) else list(query)
    if len(queries) != len(vectors) or isinstance(query, str) != single:
        raise TwoTowerError(f"query_vector: {len(vectors)} vector(s) for {len(queries)} query text(s); give one "
                            "vector per text (a vector with a text, a list with a list)")
    return queries, single, vectors, True


def add_encoder(searcher, vectors, count: int):
    """The document writer for ``Index.add(..., vectors=)``: ``vectors``, checked one per document against the
    index's size, on an index of your own vectors (one built with ``embedding=`` or ``vectors=``)."""
    from twotower.encoders.external import GivenVectors, is_external
    from twotower.retrieval.searcher import index_dim

    store = searcher.store
    info = store.manifest.get("model") or {}
    if not is_external(info):
        raise TwoTowerError(f"vectors: {store.root} was built with the twotower encoder {info.get('name')}, which "
                            "encodes the documents added to it: leave vectors out")
    base = searcher._encoder  # the embedding given at open, if any (precomputed vectors need none)
    return GivenVectors(vectors, base, count, dim=index_dim(store))
