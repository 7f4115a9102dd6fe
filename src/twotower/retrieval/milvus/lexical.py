"""twotower's own BM25 as sparse vectors, so that BM25 on Milvus ranks as the local store's BM25 does.

The corpus goes through :class:`twotower.retrieval.bm25.BM25` (the same analyzers, stopwords, stemmers, n-grams and
Lucene weights the local store uses). BM25 splits into a document part and a query part:
``score(q, d) = Σ_t count_q(t) · idf(t) · tf / (tf + k1·(1 − b + b·|d| / avgdl))``. Each document is stored as the
sparse vector of its term-frequency parts (the fraction), a query becomes ``count_q(t) · idf(t)`` over its term ids,
and their inner product, which Milvus computes over a ``SPARSE_INVERTED_INDEX``, *is* the bm25s score.

The idf lives on the query side, so it is always exact: the lexicon keeps each term's document frequency and the
number of documents, updated by every add, replace and remove in the same write (:mod:`.writes`), and a query's idf
is computed from them. Only ``avgdl`` stays as the build measured it (the documents' vectors hold it); rebuilding the
index refreshes it. The vocabulary and these statistics are stored in the collection's state (:mod:`.state`); term
ids are assigned there, by the one writer holding the write lease. A write stores what it changed (:meth:`delta`:
the terms new to the vocabulary, the df of the terms its documents hold, the document count), not the whole lexicon.

Why not Milvus' built-in BM25 function: its analyzers are not twotower's (Milvus Lite knows only the ``standard``
and ``jieba`` tokenizers, applies no stemmer, and scores with Robertson's idf, which is negative for terms in over
half the documents), so its rankings differ from the local store's; ``benchmarks/milvus_scifact.py`` measures both.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
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

    def __init__(self, bm: BM25, df: np.ndarray, avgdl: float, n_docs: int) -> None:
        self.bm = bm
        self.params = bm.params
        self.df = np.asarray(df, dtype=np.int64)
        self.avgdl = float(avgdl)
        self.n_docs = int(n_docs)
        self.vocab: dict[str, int] = dict(bm.index_.vocab_dict) if bm.params.ngram == 2 else {}

    # ---- building ---------------------------------------------------------------------

    @classmethod
    def build(cls, ids: Sequence[str], texts: Sequence[str], params: BM25Params, *,
              show_progress: bool = False) -> tuple["SparseBM25", list[Sparse]]:
        """The lexicon of a corpus and each document's sparse vector (the local BM25's weights, exactly)."""
        bm = BM25(params).index(list(ids), list(texts), show_progress=show_progress)
        n_terms = len(bm.index_.scores["indptr"]) - 1
        term_ids = cls._term_ids(bm, texts, grow=False)
        avgdl = float(np.mean([len(t) for t in term_ids])) if term_ids else 1.0
        lexicon = cls(bm, np.zeros(n_terms, dtype=np.int64), avgdl, 0)
        return lexicon, lexicon._weigh(term_ids)

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

    def _weigh(self, term_ids: list[list[int]]) -> list[Sparse]:
        """The documents' sparse vectors (term-frequency parts); they join the statistics (df, number of docs)."""
        from bm25s.scoring import _select_tfc_scorer

        size = 1 + max((max(t) for t in term_ids if t), default=-1)
        if size > len(self.df):  # terms new to the vocabulary
            self.df = np.concatenate([self.df, np.zeros(size - len(self.df), dtype=np.int64)])
        tfc = _select_tfc_scorer(self.params.method)
        out = []
        for ids in term_ids:
            counts = Counter(ids)
            if not counts:
                out.append({})
                continue
            keys = np.fromiter(counts.keys(), dtype=np.int64)
            tf = np.fromiter(counts.values(), dtype=np.float32)
            self.df[keys] += 1
            weights = tfc(tf, len(ids), self.avgdl, self.params.k1, self.params.b)
            out.append({int(j): float(w) for j, w in zip(keys, np.asarray(weights, dtype=np.float32))})
        self.n_docs += len(term_ids)
        return out

    def doc_vectors(self, texts: Sequence[str]) -> list[Sparse]:
        """Sparse vectors of new documents (their new terms join the vocabulary; df and the document count grow:
        save the lexicon again to keep them)."""
        return self._weigh(self._term_ids(self.bm, texts, grow=True,
                                          vocab=self.vocab if self.params.ngram == 2 else None))

    def forget(self, vectors: Sequence[Sparse]) -> None:
        """Documents leaving the index (their stored sparse vectors): their terms' df and the count shrink."""
        for vector in vectors:
            keys = [int(j) for j in vector if int(j) < len(self.df)]
            self.df[keys] -= 1
        self.n_docs -= len(vectors)

    # ---- what a write changed ---------------------------------------------------------

    def _vocabularies(self) -> dict[str, dict]:
        """The dicts that map terms to ids. They only grow, and keep their order (a new term comes last)."""
        if self.params.ngram == 2:
            return {"vocab": self.vocab}
        t = self.bm.tokenizer
        return {"word_to_stem": t.word_to_stem, "stem_to_sid": t.stem_to_sid, "word_to_id": t.word_to_id}

    def mark(self) -> None:
        """Remember the lexicon as it is now: :meth:`delta` says what changed since."""
        self._marked = (self.df.copy(), {name: len(d) for name, d in self._vocabularies().items()})

    def delta(self) -> dict:
        """What changed since :meth:`mark` (JSON): the document count, the df of every term whose df changed or that
        is new, and each vocabulary's new entries in order."""
        df0, sizes = self._marked
        ids = np.concatenate([np.flatnonzero(self.df[: len(df0)] != df0), np.arange(len(df0), len(self.df))])
        return {"n_docs": self.n_docs, "df_ids": ids.tolist(), "df": self.df[ids].tolist(),
                "vocab": {name: list(islice(d.items(), sizes[name], None))
                          for name, d in self._vocabularies().items()}}

    def apply(self, delta: dict) -> None:
        """Bring the lexicon a :meth:`delta` was taken from (as it was at :meth:`mark`) to where the delta ends."""
        ids = np.asarray(delta["df_ids"], dtype=np.int64)
        size = int(ids.max()) + 1 if len(ids) else 0
        if size > len(self.df):
            self.df = np.concatenate([self.df, np.zeros(size - len(self.df), dtype=np.int64)])
        self.df[ids] = np.asarray(delta["df"], dtype=np.int64)
        self.n_docs = int(delta["n_docs"])
        vocabularies = self._vocabularies()
        for name, items in delta["vocab"].items():
            vocabularies[name].update((k, v) for k, v in items)

    # ---- searching --------------------------------------------------------------------

    def query_vectors(self, queries: Sequence[str]) -> list[Sparse]:
        """Each query's term ids weighted ``count · idf`` (idf from the current df and document count): the inner
        product with a document's vector is its BM25 score (what bm25s sums for the local store). A query with no
        term any document holds gets ``{}``."""
        from bm25s.scoring import _select_idf_scorer

        if self.params.ngram == 2:
            term_ids = [[self.vocab[t] for t in toks if t in self.vocab]
                        for toks in self.bm._ngram_tokens(list(queries), show_progress=False)]
        else:
            term_ids = self._term_ids(self.bm, queries, grow=False)
        idf_of = _select_idf_scorer(self.params.method)
        known = len(self.df)
        return [{int(j): float(np.float32(c * idf_of(int(self.df[j]), self.n_docs))) for j, c in Counter(t).items()
                 if j < known and self.df[j] > 0} for t in term_ids]

    # ---- storing ----------------------------------------------------------------------

    def save(self, directory: Path) -> list[str]:
        """Write the vocabulary, params and statistics into ``directory``; the file names written."""
        directory = Path(directory)
        written = [PARAMS_FILE, STATS_FILE]
        atomic_write_json(directory / PARAMS_FILE, asdict(self.params))
        with open(directory / STATS_FILE, "wb") as f:
            np.savez(f, df=self.df, avgdl=np.float64(self.avgdl), n_docs=np.int64(self.n_docs))
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
            return cls(bm, stats["df"], float(stats["avgdl"]), int(stats["n_docs"]))
