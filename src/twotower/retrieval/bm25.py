"""BM25 over bm25s: text analysis chosen per language (stopwords, Snowball stemming), Lucene scoring.

Document text is title + " " + text, as in BEIR. Defaults k1=1.5, b=0.75: a sweep on SciFact's
*train* queries (``benchmarks/experiments/bm25_params.py``) found NDCG@10 flat within 0.003 over k1 in
{0.9, 1.2, 1.5} and b in {0.4 … 0.9}; these kept the best MRR@10 and P@1.

``BM25Params(ngram=2)`` indexes unigrams plus bigrams of adjacent terms (after stopword removal
and stemming), the "BM25 uni+bi-gram" variant of Luan et al.; the default stays unigram.

``BM25Params(language=...)`` picks the text analysis (``twotower.retrieval.analyzers``: an ISO 639-1
code, ``multi`` or ``auto``); it is saved with the index (``params.json``) and used again at query time.
An index saved without it is English, analysed as before languages existed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import bm25s
import numpy as np

from twotower.checks import flag
from twotower.errors import TwoTowerError
from twotower.io import NPY_LOCK, atomic_write_json
from twotower.progress import worth_showing
from twotower.retrieval.analyzers import AUTO, Analyzer, analyzer_for, check_language, detect_language

log = logging.getLogger(__name__)
# bm25s sets its own logger to DEBUG at import; leave its chatter to the root logger's level.
logging.getLogger("bm25s").setLevel(logging.NOTSET)

Run = dict[str, dict[str, float]]
PARAMS_FILE = "params.json"  # BM25Params beside the bm25s files


@dataclass(frozen=True)
class BM25Params:
    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stopwords: str | None = None  # None: the language's own list; "": none; or the code of a bm25s list
    stemmer: str | None = None  # None: the language's Snowball stemmer; "": none; or a PyStemmer algorithm
    ngram: int = 1  # 1: unigrams; 2: unigrams + bigrams of adjacent (stemmed, non-stopword) terms
    language: str = "en"  # analyzers.LANGUAGES code, "multi", or "auto" (detected from the documents)

    def __post_init__(self) -> None:
        check_language(self.language)
        if not (isinstance(self.k1, (int, float)) and 0 <= self.k1 < float("inf")):
            raise ValueError(f"BM25 {flag('k1')} must be a finite number of 0 or more (usual: 0.9 to 2), got {self.k1}")
        if not (isinstance(self.b, (int, float)) and 0 <= self.b <= 1):
            raise ValueError(f"BM25 {flag('b')} must lie in [0, 1] (the share of length normalisation), got {self.b}")

    @classmethod
    def from_dict(cls, saved: dict) -> "BM25Params":
        """Params as saved (a manifest's ``bm25``, a ``params.json``); older ones lack ``language``: English."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})


class BM25:
    """A BM25 index over a list of document ids and texts."""

    def __init__(self, params: BM25Params | None = None) -> None:
        self.params = params or BM25Params()
        if self.params.ngram not in (1, 2):
            raise ValueError(f"BM25 ngram must be 1 or 2, got {self.params.ngram}")
        self.index_ = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        self.doc_ids: Sequence[str] = []
        self._set_language(self.params.language)

    def _set_language(self, language: str) -> None:
        """The analyzer and bm25s tokenizer of ``language`` (none yet for ``auto``: index() detects it)."""
        self.params = replace(self.params, language=language)
        self.analyzer: Analyzer | None = None
        self.tokenizer = None
        if language != AUTO:
            self.analyzer = analyzer_for(language, stopwords=self.params.stopwords, stemmer=self.params.stemmer)
            self.tokenizer = self.analyzer.tokenizer()

    def _ngram_tokens(self, texts: Sequence[str], *, show_progress: bool) -> list[list[str]]:
        """Stemmed, stopword-free unigrams plus ``"a b"`` bigrams of adjacent ones (ngram=2 only)."""
        unigrams = self.analyzer.analyze(texts)
        return [toks + [f"{a} {b}" for a, b in zip(toks, toks[1:])] for toks in unigrams]

    def index(self, doc_ids: Sequence[str], texts: Sequence[str], *, show_progress: bool = True) -> "BM25":
        if len(doc_ids) != len(texts):
            raise ValueError(f"{len(doc_ids)} ids but {len(texts)} texts")
        if self.params.language == AUTO:
            self._set_language(detect_language(texts))
            log.info("BM25 language detected from the documents: %s", self.params.language)
        show_progress = worth_showing(show_progress, len(texts))  # bm25s' bars have no delay: none for little work
        if self.params.ngram == 2:
            tokens = self._ngram_tokens(texts, show_progress=show_progress)
            if not any(tokens):  # no document has a usable term (all stopwords, punctuation): bm25s cannot build
                # an empty vocabulary, so each holds the empty placeholder term, which no query holds
                tokens = [[""] for _ in tokens]
            self.index_.index(tokens, show_progress=show_progress)
        else:
            tokens = self.tokenizer.tokenize(
                list(texts), update_vocab=True, return_as="tuple", show_progress=show_progress
            )
            self.index_.index(tokens, show_progress=show_progress)
        self.doc_ids = list(doc_ids)
        return self

    def search(
        self, queries: Sequence[str], k: int = 1000, *, show_progress: bool = True, n_threads: int = 0,
        mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ``(scores, doc indices)``, each (n_queries, min(k, n_docs)), best first. ``mask`` (bool, one per
        document: a metadata filter's) scores the documents where it is False 0 (bm25s' ``weight_mask``), so that
        :func:`matching_run` drops them: the top k of the matching documents."""
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
            # bm25s maps a query with no indexed term to the empty placeholder term, which every document without
            # a usable term (all stopwords, punctuation) holds: such a query would score exactly those documents
            empty = self.tokenizer.word_to_id.get("")
            if empty is not None:
                q_ids = [[t for t in ids if t != empty] for ids in q_ids]
                unmatched = [i for i, ids in enumerate(q_ids) if not ids]
                for i in unmatched:
                    q_ids[i] = [empty]
        weights = None if mask is None else np.asarray(mask, dtype=np.float32)
        indices, scores = self.index_.retrieve(
            q_ids, k=k, show_progress=worth_showing(show_progress, len(queries)), n_threads=n_threads,
            weight_mask=weights
        )
        if unmatched:
            scores[unmatched] = 0.0
        return scores, indices

    def search_run(self, query_ids: Sequence[str], queries: Sequence[str], k: int = 1000, *,
                   show_progress: bool = True) -> dict[str, dict[str, float]]:
        """A run ``{query_id: {doc_id: score}}`` of each query's ``k`` best that match it (:func:`matching_run`)."""
        scores, indices = self.search(queries, k, show_progress=show_progress)
        return matching_run(query_ids, self.doc_ids, scores, indices)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.index_.save(directory, show_progress=False)
        if self.params.ngram == 1:  # ngram=2 keeps its vocabulary in the bm25s index itself
            self.tokenizer.save_vocab(directory)
            self.tokenizer.save_stopwords(directory)
        atomic_write_json(directory / PARAMS_FILE, asdict(self.params))

    @classmethod
    def load(cls, directory: str | Path, doc_ids: Sequence[str], params: BM25Params | None = None, *,
             mmap: bool = True) -> "BM25":
        """Load a saved index. Its own ``params.json`` (absent before languages existed: English) gives the
        params unless ``params`` are given; a ``params.language`` other than the saved one is an error."""
        directory = Path(directory)
        saved = cls.saved_params(directory)
        if params is None:
            params = saved
        elif params.language != saved.language:
            raise TwoTowerError(f"{directory}: this BM25 index was built for language '{saved.language}', "
                                f"not '{params.language}' (rebuild it, or search it in '{saved.language}')")
        bm = cls(params)
        with NPY_LOCK:  # bm25s reads .npy files (twotower.io.NPY_LOCK: why)
            bm.index_ = bm25s.BM25.load(directory, mmap=mmap, show_progress=False, load_vocab=True)
        if params.ngram == 1:
            bm.tokenizer.load_vocab(directory)
            bm.tokenizer.load_stopwords(directory)
        bm.doc_ids = doc_ids  # as given: an opened index passes its compact ids (index.ids), not a list
        return bm

    @staticmethod
    def saved_params(directory: str | Path) -> BM25Params:
        """The params saved with an index; an index saved before they were: English, the defaults."""
        path = Path(directory) / PARAMS_FILE
        if not path.exists():
            return BM25Params()
        try:
            return BM25Params.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            raise TwoTowerError(f"{path}: cannot read the BM25 params ({exc}); rebuild the index") from exc


def matching_run(query_ids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray,
                 indices: np.ndarray) -> dict[str, dict[str, float]]:
    """BM25's search output as a run, without the documents that match nothing: every BM25 term weight is above
    0, so a score of 0 means no query term is in the document, and bm25s fills the top k with such documents in
    index order. Every BM25 ranking (eval, search, the service, fit, mining) goes through here, so a query whose
    terms are in no document gets no hits rather than k arbitrary ones."""
    return {qid: {doc_ids[j]: float(s) for s, j in zip(row_s, row_i) if s > 0 and j >= 0}
            for qid, row_s, row_i in zip(query_ids, scores, indices)}
