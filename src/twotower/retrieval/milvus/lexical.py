"""twotower's own BM25 as sparse vectors, so that BM25 on Milvus ranks as the local store's BM25 does.

The corpus goes through :class:`twotower.retrieval.bm25.BM25` (the same analyzers, stopwords, stemmers, n-grams and
Lucene weights the local store uses). BM25 splits into a document part and a query part:
``score(q, d) = Σ_t count_q(t) · idf(t) · tf / (tf + k1·(1 − b + b·|d| / avgdl))``. Each document is stored as the
sparse vector of its term-frequency parts (the fraction), a query becomes ``count_q(t) · idf(t)`` over its term ids,
and their inner product, which Milvus computes over a ``SPARSE_INVERTED_INDEX``, *is* the bm25s score.

Exact after any writes: the lexicon keeps each term's document frequency, the number of documents and their total
length, updated by every add, replace and remove in the same write (:mod:`.writes`), so the idf and ``avgdl`` are
always a fresh index's. The idf lives on the query side, so Milvus' scores use it at once. ``avgdl`` lives in the
documents' weights, which a write does not rewrite: each row keeps its length and the ``avgdl`` its weights were
computed with. When the two differ, :meth:`SparseBM25.rescore` recovers each candidate's term counts from its weights
and scores it as a fresh index would, and :meth:`SparseBM25.bound` says how far beyond the candidates a document can
rise, so the search widens until no unseen document can enter the top k (:class:`.lexical_search.MilvusBM25`). The vocabulary
and these statistics are stored in the collection's state (:mod:`.state`); term ids are assigned there, by the
attempt that becomes the write. A write stores what it changed (:meth:`delta`: the terms new to the vocabulary, the
df of the terms its documents hold, the count and total length), not the whole lexicon.

Why not Milvus' built-in BM25 function: its analyzers are not twotower's (Milvus Lite knows only the ``standard``
and ``jieba`` tokenizers, applies no stemmer, and scores with Robertson's idf, which is negative for terms in over
half the documents), so its rankings differ from the local store's; ``benchmarks/milvus_scifact.py`` measures both.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from twotower.io import NPY_LOCK, atomic_write_json
from twotower.retrieval.bm25 import BM25, BM25Params

STATS_FILE = "bm25_stats.npz"
VOCAB_FILE = "bm25_vocab.json"  # ngram=2: term -> id (ngram=1 keeps the bm25s tokenizer's own vocabulary files)
PARAMS_FILE = "bm25_params.json"

Sparse = dict[int, float]
EXACT_METHODS = ("robertson", "lucene", "atire")  # tf · s / (tf + k1·(1 − b + b·|d|/avgdl)): counts recoverable


@dataclass
class Weighed:
    """New documents' sparse vectors, their lengths (terms) and the ``avgdl`` their weights were computed with."""

    vectors: list[Sparse]
    lengths: list[int]
    avgdl: float


class SparseBM25:
    """The query side of twotower's BM25 over Milvus sparse vectors, and the weighting of new documents."""

    def __init__(self, bm: BM25, df: np.ndarray, n_docs: int, total_len: int, weighed_with: tuple[float, float]) -> None:
        self.bm = bm
        self.params = bm.params
        self.df = np.asarray(df, dtype=np.int64)
        self.n_docs = int(n_docs)
        self.total_len = int(total_len)
        # the least and greatest avgdl any row's weights were computed with (bounds: rows may have left since)
        self.weighed_with = (float(weighed_with[0]), float(weighed_with[1]))
        self.vocab: dict[str, int] = dict(bm.index_.vocab_dict) if bm.params.ngram == 2 else {}

    @property
    def avgdl(self) -> float:
        """The documents' average length now, as a fresh index over them computes it (1.0 when there are none)."""
        return self.total_len / self.n_docs if self.n_docs else 1.0

    @property
    def exact_in_milvus(self) -> bool:
        """Whether every row's weights were computed with today's ``avgdl``: Milvus' scores are then exact."""
        return self.weighed_with[0] == self.weighed_with[1] == self.avgdl

    # ---- building ---------------------------------------------------------------------

    @classmethod
    def build(cls, ids: Sequence[str], texts: Sequence[str], params: BM25Params, *,
              show_progress: bool = False) -> tuple["SparseBM25", Weighed]:
        """The lexicon of a corpus and each document's sparse vector (the local BM25's weights, exactly)."""
        bm = BM25(params).index(list(ids), list(texts), show_progress=show_progress)
        n_terms = len(bm.index_.scores["indptr"]) - 1
        term_ids = cls._term_ids(bm, texts, grow=False)
        avgdl = float(np.mean([len(t) for t in term_ids])) if term_ids else 1.0
        lexicon = cls(bm, np.zeros(n_terms, dtype=np.int64), 0, 0, (avgdl, avgdl))
        return lexicon, lexicon._weigh(term_ids, avgdl)

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

    def _weigh(self, term_ids: list[list[int]], avgdl: float) -> Weighed:
        """The documents' sparse vectors (term-frequency parts, computed with ``avgdl``); they join the statistics
        (df, number of documents, total length)."""
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
            weights = tfc(tf, len(ids), avgdl, self.params.k1, self.params.b)
            out.append({int(j): float(w) for j, w in zip(keys, np.asarray(weights, dtype=np.float32))})
        lengths = [len(t) for t in term_ids]
        self.n_docs += len(term_ids)
        self.total_len += sum(lengths)
        self.weighed_with = (min(self.weighed_with[0], avgdl), max(self.weighed_with[1], avgdl))
        return Weighed(out, lengths, float(avgdl))

    def doc_vectors(self, texts: Sequence[str]) -> Weighed:
        """Sparse vectors of new documents, weighed with today's ``avgdl`` (their new terms join the vocabulary; df,
        the document count and the total length grow: save the lexicon again to keep them)."""
        term_ids = self._term_ids(self.bm, texts, grow=True, vocab=self.vocab if self.params.ngram == 2 else None)
        if self.n_docs:
            avgdl = self.avgdl
        else:  # an index emptied by removes: the new documents' own average
            avgdl = float(np.mean([len(t) for t in term_ids])) if any(term_ids) else 1.0
        return self._weigh(term_ids, avgdl)

    def forget(self, vectors: Sequence[Sparse], lengths: Sequence[int]) -> None:
        """Documents leaving the index (their stored sparse vectors and lengths): their terms' df, the count and the
        total length shrink."""
        for vector in vectors:
            keys = [int(j) for j in vector if int(j) < len(self.df)]
            self.df[keys] -= 1
        self.n_docs -= len(vectors)
        self.total_len -= int(sum(lengths))

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
        return {"n_docs": self.n_docs, "total_len": self.total_len, "weighed_with": list(self.weighed_with),
                "df_ids": ids.tolist(), "df": self.df[ids].tolist(),
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
        self.total_len = int(delta["total_len"])
        self.weighed_with = (float(delta["weighed_with"][0]), float(delta["weighed_with"][1]))
        vocabularies = self._vocabularies()
        for name, items in delta["vocab"].items():
            vocabularies[name].update((k, v) for k, v in items)

    # ---- searching --------------------------------------------------------------------

    def query_terms(self, queries: Sequence[str]) -> list[list[int]]:
        """Each query's term ids in order, repeats kept (a repeated term counts each time, as in the local index),
        without the terms no document holds."""
        if self.params.ngram == 2:
            term_ids = [[self.vocab[t] for t in toks if t in self.vocab]
                        for toks in self.bm._ngram_tokens(list(queries), show_progress=False)]
        else:
            term_ids = self._term_ids(self.bm, queries, grow=False)
        known = len(self.df)
        return [[j for j in t if j < known and self.df[j] > 0] for t in term_ids]

    def idf(self, term: int) -> np.float32:
        """The term's idf now (float32, as the local index stores it)."""
        from bm25s.scoring import _select_idf_scorer

        return np.float32(_select_idf_scorer(self.params.method)(int(self.df[term]), self.n_docs))

    def query_vectors(self, queries: Sequence[str], terms: list[list[int]] | None = None) -> list[Sparse]:
        """Each query's term ids weighted ``count · idf`` (idf from the current df and document count): the inner
        product with a document's vector is its BM25 score (what bm25s sums for the local store). A query with no
        term any document holds gets ``{}``."""
        terms = self.query_terms(queries) if terms is None else terms
        return [{int(j): float(np.float32(c * float(self.idf(j)))) for j, c in Counter(t).items()} for t in terms]

    def bound(self) -> float:
        """How many times its Milvus score a document's exact score can be at most: ``max(1, avgdl / least avgdl of
        the weights)`` (a weight ``tf / (tf + k1·(1 − b + b·L/A0))`` grows by at most ``A / A0`` when ``A0`` becomes
        ``A``, and idf is positive), or infinity for a method whose weights this cannot bound."""
        if self.params.method not in EXACT_METHODS or self.weighed_with[0] <= 0:
            return float("inf")
        return max(1.0, self.avgdl / self.weighed_with[0])

    def rescore(self, terms: list[int], vector: Sparse, length: int, avgdl: float) -> float:
        """The exact score of a document (its stored ``vector``, weighed with ``avgdl``, and its ``length``) for a
        query of ``terms``, as a fresh local index over today's documents computes it: the term counts recovered from
        the weights, weighed again with today's ``avgdl``, summed in float32 in the query's order."""
        from bm25s.scoring import _select_tfc_scorer

        k1, b = self.params.k1, self.params.b
        c0 = k1 * ((1 - b) + b * length / avgdl)
        scale = k1 + 1 if self.params.method == "atire" else 1.0
        tfc = _select_tfc_scorer(self.params.method)
        entries: dict[int, np.float32] = {}
        for j in dict.fromkeys(terms):
            w = vector.get(j)
            if w is None:
                continue
            if c0 <= 0 or k1 == 0:
                tf = 1.0  # no length part: the weight does not depend on avgdl
            else:
                tf = float(round(w * c0 / (scale - w)))
            new = tfc(np.asarray([tf], dtype=np.float32), length, self.avgdl, k1, b) if c0 > 0 else np.float32(w)
            entries[j] = np.float32(self.idf(j) * np.float32(np.asarray(new).reshape(-1)[0]))
        score = np.float32(0.0)
        for j in terms:
            score = np.float32(score + entries.get(j, np.float32(0.0)))
        return float(score)

    # ---- storing ----------------------------------------------------------------------

    def save(self, directory: Path) -> list[str]:
        """Write the vocabulary, params and statistics into ``directory``; the file names written."""
        directory = Path(directory)
        written = [PARAMS_FILE, STATS_FILE]
        atomic_write_json(directory / PARAMS_FILE, asdict(self.params))
        with open(directory / STATS_FILE, "wb") as f:
            np.savez(f, df=self.df, n_docs=np.int64(self.n_docs), total_len=np.int64(self.total_len),
                     weighed_with=np.asarray(self.weighed_with, dtype=np.float64))
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
        with NPY_LOCK, np.load(directory / STATS_FILE) as stats:  # headers parsed on access (NPY_LOCK: why)
            return cls(bm, stats["df"], int(stats["n_docs"]), int(stats["total_len"]),
                       tuple(float(x) for x in stats["weighed_with"]))
