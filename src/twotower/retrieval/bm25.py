"""BM25 over bm25s: English stopwords, Snowball stemming (PyStemmer), Lucene scoring.

Document text is title + " " + text, as in BEIR. Defaults k1=1.5, b=0.75: a sweep on SciFact's
*train* queries (``benchmarks/bm25_params.py``) found NDCG@10 flat within 0.003 over k1 in
{0.9, 1.2, 1.5} and b in {0.4 … 0.9}; these kept the best MRR@10 and P@1.

``BM25Params(ngram=2)`` indexes unigrams plus bigrams of adjacent terms (after stopword removal
and stemming), the "BM25 uni+bi-gram" variant of Luan et al.; the default stays unigram.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import Tokenizer

log = logging.getLogger(__name__)
# bm25s sets its own logger to DEBUG at import; leave its chatter to the root logger's level.
logging.getLogger("bm25s").setLevel(logging.NOTSET)

Run = dict[str, dict[str, float]]


@dataclass(frozen=True)
class BM25Params:
    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stopwords: str = "en"
    stemmer: str = "english"
    ngram: int = 1  # 1: unigrams; 2: unigrams + bigrams of adjacent (stemmed, non-stopword) terms


class BM25:
    """A BM25 index over a list of document ids and texts."""

    def __init__(self, params: BM25Params | None = None) -> None:
        self.params = params or BM25Params()
        stemmer = Stemmer.Stemmer(self.params.stemmer) if self.params.stemmer else None
        self.tokenizer = Tokenizer(stopwords=self.params.stopwords, stemmer=stemmer)
        self.index_ = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        self.doc_ids: list[str] = []
        if self.params.ngram not in (1, 2):
            raise ValueError(f"BM25 ngram must be 1 or 2, got {self.params.ngram}")

    def _ngram_tokens(self, texts: Sequence[str], *, show_progress: bool) -> list[list[str]]:
        """Stemmed, stopword-free unigrams plus ``"a b"`` bigrams of adjacent ones (ngram=2 only)."""
        stemmer = Stemmer.Stemmer(self.params.stemmer) if self.params.stemmer else None
        unigrams = bm25s.tokenize(
            list(texts), stopwords=self.params.stopwords, stemmer=stemmer, return_ids=False,
            show_progress=show_progress,
        )
        return [[t for t in toks if t] + [f"{a} {b}" for a, b in zip(toks, toks[1:]) if a and b] for toks in unigrams]

    def index(self, doc_ids: Sequence[str], texts: Sequence[str], *, show_progress: bool = True) -> "BM25":
        if len(doc_ids) != len(texts):
            raise ValueError(f"{len(doc_ids)} ids but {len(texts)} texts")
        if self.params.ngram == 2:
            tokens = self._ngram_tokens(texts, show_progress=show_progress)
            self.index_.index(tokens, show_progress=show_progress)
        else:
            tokens = self.tokenizer.tokenize(
                list(texts), update_vocab=True, return_as="tuple", show_progress=show_progress
            )
            self.index_.index(tokens, show_progress=show_progress)
        self.doc_ids = list(doc_ids)
        return self

    def search(
        self, queries: Sequence[str], k: int = 1000, *, show_progress: bool = True, n_threads: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ``(scores, doc indices)``, each (n_queries, min(k, n_docs)), best first."""
        if not self.doc_ids:
            raise ValueError("the BM25 index is empty: call index() first")
        k = min(k, len(self.doc_ids))
        unmatched: list[int] = []
        if self.params.ngram == 2:
            vocab = self.index_.vocab_dict
            q_ids = [[vocab[t] for t in toks if t in vocab] for toks in self._ngram_tokens(queries, show_progress=False)]
            unmatched = [i for i, ids in enumerate(q_ids) if not ids]
            for i in unmatched:  # no indexed term: any id to keep bm25s going; the scores are zeroed below
                q_ids[i] = [0]
        else:
            q_ids = self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        indices, scores = self.index_.retrieve(
            q_ids, k=k, show_progress=show_progress, n_threads=n_threads
        )
        if unmatched:
            scores[unmatched] = 0.0
        return scores, indices

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.index_.save(directory, show_progress=False)
        if self.params.ngram == 1:  # ngram=2 keeps its vocabulary in the bm25s index itself
            self.tokenizer.save_vocab(directory)
            self.tokenizer.save_stopwords(directory)

    @classmethod
    def load(cls, directory: str | Path, doc_ids: Sequence[str], params: BM25Params, *, mmap: bool = True) -> "BM25":
        directory = Path(directory)
        bm = cls(params)
        bm.index_ = bm25s.BM25.load(directory, mmap=mmap, show_progress=False, load_vocab=True)
        if params.ngram == 1:
            bm.tokenizer.load_vocab(directory)
            bm.tokenizer.load_stopwords(directory)
        bm.doc_ids = list(doc_ids)
        return bm
