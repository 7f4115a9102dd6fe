"""BEIR-format data: corpus, queries, qrels."""

from twotower.data.beir import BeirDataset, Document, load_corpus, load_qrels, load_queries

__all__ = ["BeirDataset", "Document", "load_corpus", "load_qrels", "load_queries"]
