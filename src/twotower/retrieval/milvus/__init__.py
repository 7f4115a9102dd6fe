"""The index on Milvus: Milvus Lite (a local ``.db`` file, embedded) or a Milvus server by URI.

- :mod:`.client`: connecting (token from ``TWOTOWER_MILVUS_TOKEN``), Milvus errors as :class:`TwoTowerError`,
  the collection's schema, its index types and the checks that a collection belongs to an index.
- :mod:`.lexical`: twotower's own BM25 (the local store's analyzers and weights) as sparse vectors.
- :mod:`.store`: :class:`~.store.MilvusStore`, the store the Searcher, the API and the service use when an index
  directory's manifest says ``"backend": "milvus"`` (``backends.open_store`` opens it).
- :mod:`.rows`: the rows a store numbers the ids it meets with (Milvus keys documents by id).
- :mod:`.build`: what ``MilvusStore.build`` and ``.attach`` do: check the options, create and fill the collections,
  write the manifest; an index folder from the URI and collection alone (encoding: ``indexing.build_milvus_from``).
- :mod:`.lexical_search`: ``store.bm25``, BM25 searched in Milvus, exact after any writes.
- :mod:`.state`: the ``<collection>__state`` collection (the decided writes, each attempt's manifest, removals and
  BM25 vocabulary and statistics) and the step hook the fault-injection and pause tests use.
- :mod:`.consensus`: which write attempt becomes write N (Disk Paxos over state rows: safe under any pause).
- :mod:`.lease`: the writers' lease (they take turns; safety does not depend on it).
- :mod:`.writes`: add / replace / remove as writes no crash and no pause can half-do.
- :mod:`.passages`: long documents as a row per passage tied to its document; a document scored by its best.
- :mod:`.filtering`: metadata filters as Milvus expressions, refused where Milvus would answer differently.

Everything lives in Milvus: vectors, ids, titles, texts, metadata, BM25 sparse vectors and the index's state. The index
directory names the URI and collection and keeps a copy of the manifest (a cache).
"""
