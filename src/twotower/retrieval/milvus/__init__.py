"""The index on Milvus: Milvus Lite (a local ``.db`` file, embedded) or a Milvus server by URI.

- :mod:`.client`: connecting (token from ``TWOTOWER_MILVUS_TOKEN``), Milvus errors as :class:`TwoTowerError`,
  the collection's schema, its index types and the checks that a collection belongs to an index.
- :mod:`.lexical`: twotower's own BM25 (the local store's analyzers and weights) as sparse vectors.
- :mod:`.store`: :class:`~.store.MilvusStore`, the store the Searcher, the API and the service use when an index
  directory's manifest says ``"backend": "milvus"`` (``IndexStore.open`` dispatches to it).
- :mod:`.build`: ``index build --backend milvus``: encode, create the collection, write the manifest.

The index directory keeps only the manifest and the lexical vocabulary; vectors, ids, titles, texts and the BM25
sparse vectors live in the collection.
"""
