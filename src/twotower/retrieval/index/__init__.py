"""The parts of a stored index directory (:mod:`twotower.retrieval.store` is the one to import):
``errors``, ``kinds`` (FAISS index kinds), ``versions`` (manifest, version dirs, CURRENT), ``files``
(file sizes and checksums), ``lock`` (one writer at a time), ``writer`` (writing a version), ``search`` (reading
and searching a version's FAISS index), ``fingerprint`` (the corpus an index holds) and ``eval_check`` (what
``eval --index`` checks)."""
