"""Retrievers: BM25 (bm25s), exact dense search, and what builds on them."""
