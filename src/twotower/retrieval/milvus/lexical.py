"""twotower's own BM25 as sparse vectors, so that BM25 on Milvus ranks as the local store's BM25 does.

At build time the corpus goes through :class:`twotower.retrieval.bm25.BM25` (the same analyzers, stopwords,
stemmers, n-grams and Lucene weights the local store uses); each document becomes the sparse vector of its bm25s
term weights ``idf(t) · tf / (tf + k1·(1 − b + b·|d| / avgdl))`` over the index's term ids, and a query becomes the
count of each of its term ids. Their inner product, which Milvus computes over a ``SPARSE_INVERTED_INDEX``, *is* the
bm25s score. Only the vocabulary and the corpus statistics (idf per term, average length, number of documents) stay
in the index directory, for the query side.

Why not Milvus' built-in BM25 function: its analyzers are not twotower's (Milvus Lite knows only the ``standard``
and ``jieba`` tokenizers, applies no stemmer, and scores with Robertson's idf, which is negative for terms in over
half the documents), so its rankings differ from the local store's; ``benchmarks/milvus_scifact.py`` measures both.

Documents added later are weighted with the statistics frozen at build time (their new terms get ids after the
vocabulary's and an idf from their document frequency among the added documents); rebuilding the index refreshes the
statistics, as the local store does on every write.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from twotower.io import atomic_write_json
from twotower.retrieval.bm25 import BM25, BM25Params

STATS_FILE = "bm25_stats.npz"
VOCAB_FILE = "bm25_vocab.json"  # ngram=2: term -> id (ngram=1 keeps the bm25s tokenizer's own vocabulary files)
PARAMS_FILE = "bm25_params.json"

Sparse = dict[int, float]


class SparseBM25:
    """The query side of twotower's BM25 over Milvus sparse vectors, and the weighting of new documents."""

    def __init__(self, bm: BM25, idf: np.ndarray, avgdl: float, n_docs: int) -> None:
        self.bm = bm
        self.params = bm.params
        self.idf = np.asarray(idf, dtype=np.float32)
        self.avgdl = float(avgdl)
        self.n_docs = int(n_docs)
        self.vocab: dict[str, int] = dict(bm.index_.vocab_dict) if bm.params.ngram == 2 else {}

    # ---- building ---------------------------------------------------------------------

    @classmethod
    def build(cls, ids: Sequence[str], texts: Sequence[str], params: BM25Params, *,
              show_progress: bool = False) -> tuple["SparseBM25", list[Sparse]]:
        """The lexicon of a corpus and each document's sparse vector (the local BM25's weights, exactly)."""
        from scipy import sparse
        from bm25s.scoring import _select_idf_scorer

        bm = BM25(params).index(list(ids), list(texts), show_progress=show_progress)
        scores = bm.index_.scores
        n_docs = int(scores["num_docs"])
        indptr = np.asarray(scores["indptr"])
        matrix = sparse.csc_matrix((np.asarray(scores["data"], dtype=np.float32), np.asarray(scores["indices"]),
                                    indptr), shape=(n_docs, len(indptr) - 1)).tocsr()
        lengths = [len(t) for t in cls._term_ids(bm, texts, grow=False)]
        idf_of = _select_idf_scorer(bm.params.method)
        df = np.diff(indptr)
        idf = np.array([idf_of(int(d), n_docs) for d in df], dtype=np.float32)
        lexicon = cls(bm, idf, float(np.mean(lengths)) if lengths else 1.0, n_docs)
        rows = [
            {int(j): float(w) for j, w in zip(matrix.indices[matrix.indptr[i]:matrix.indptr[i + 1]],
                                              matrix.data[matrix.indptr[i]:matrix.indptr[i + 1]])}
            for i in range(n_docs)
        ]
        return lexicon, rows

    @staticmethod
    def _term_ids(bm: BM25, texts: Sequence[str], *, grow: bool, vocab: dict[str, int] | None = None) -> list[list[int]]:
        """Each text's term ids in order (``grow``: unknown terms get new ids, else they are dropped)."""
        if bm.params.ngram == 2:
            vocab = vocab if vocab is not None else bm.index_.vocab_dict
            out = []
            for toks in bm._ngram_tokens(list(texts), show_progress=False):
                if grow:
                    for t in toks:
                        vocab.setdefault(t, len(vocab))
                out.append([vocab[t] for t in toks if t in vocab])
            return out
        ids = bm.tokenizer.tokenize(list(texts), update_vocab=grow, return_as="ids", show_progress=False)
        return [list(map(int, x)) for x in ids]

    def doc_vectors(self, texts: Sequence[str]) -> list[Sparse]:
        """Sparse vectors of new documents under the frozen statistics; their new terms join the vocabulary (save
        the lexicon again to keep them)."""
        from bm25s.scoring import _select_idf_scorer, _select_tfc_scorer

        term_ids = self._term_ids(self.bm, texts, grow=True, vocab=self.vocab if self.params.ngram == 2 else None)
        size = 1 + max((max(t) for t in term_ids if t), default=-1)
        if size > len(self.idf):  # terms the corpus did not have: idf from their frequency among the new documents
            df = Counter(j for t in term_ids for j in set(t) if j >= len(self.idf))
            idf_of = _select_idf_scorer(self.params.method)
            extra = np.array([idf_of(df.get(j, 0), self.n_docs) for j in range(len(self.idf), size)], dtype=np.float32)
            self.idf = np.concatenate([self.idf, extra])
        tfc = _select_tfc_scorer(self.params.method)
        out = []
        for ids in term_ids:
            counts = Counter(ids)
            if not counts:
                out.append({})
                continue
            keys = np.fromiter(counts.keys(), dtype=np.int64)
            tf = np.fromiter(counts.values(), dtype=np.float32)
            weights = self.idf[keys] * tfc(tf, len(ids), self.avgdl, self.params.k1, self.params.b)
            out.append({int(j): float(w) for j, w in zip(keys, weights.astype(np.float32))})
        return out

    # ---- searching --------------------------------------------------------------------

    def query_vectors(self, queries: Sequence[str]) -> list[Sparse]:
        """Each query's term ids with their counts: the inner product with a document's vector is its BM25 score
        (what bm25s sums for the local store). A query with no known term gets ``{}``."""
        if self.params.ngram == 2:
            term_ids = [[self.vocab[t] for t in toks if t in self.vocab]
                        for toks in self.bm._ngram_tokens(list(queries), show_progress=False)]
        else:
            term_ids = self._term_ids(self.bm, queries, grow=False)
        known = len(self.idf)
        return [{int(j): float(c) for j, c in Counter(t).items() if j < known} for t in term_ids]

    # ---- storing ----------------------------------------------------------------------

    def save(self, directory: Path) -> list[str]:
        """Write the vocabulary, params and statistics into ``directory``; the file names written."""
        directory = Path(directory)
        written = [PARAMS_FILE, STATS_FILE]
        atomic_write_json(directory / PARAMS_FILE, asdict(self.params))
        with open(directory / STATS_FILE, "wb") as f:
            np.savez(f, idf=self.idf, avgdl=np.float64(self.avgdl), n_docs=np.int64(self.n_docs))
        if self.params.ngram == 2:
            atomic_write_json(directory / VOCAB_FILE, self.vocab)
            written.append(VOCAB_FILE)
        else:
            self.bm.tokenizer.save_vocab(directory)
            self.bm.tokenizer.save_stopwords(directory)
            written += [p.name for p in directory.iterdir() if p.name.endswith(".tokenizer.json")]
        return sorted(set(written))

    @classmethod
    def load(cls, directory: Path) -> "SparseBM25":
        directory = Path(directory)
        params = BM25Params.from_dict(json.loads((directory / PARAMS_FILE).read_text(encoding="utf-8")))
        bm = BM25(params)
        if params.ngram == 2:
            bm.index_.vocab_dict = {str(k): int(v) for k, v in
                                    json.loads((directory / VOCAB_FILE).read_text(encoding="utf-8")).items()}
        else:
            bm.tokenizer.load_vocab(directory)
            bm.tokenizer.load_stopwords(directory)
        with np.load(directory / STATS_FILE) as stats:
            return cls(bm, stats["idf"], float(stats["avgdl"]), int(stats["n_docs"]))

