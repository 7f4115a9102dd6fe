"""The ``twotower fit`` recipe (everything that decides its result, so a resumed run must not change it) and
its dev split: a seeded part of the judged *train* queries, held out by query id (all of a query's
judgements on one side), used only to score stages and make choices, never for gradients or mining."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from twotower.errors import TwoTowerError
from twotower.training.passage_choice import DEFAULT as DEFAULT_TRAIN_PASSAGE

DEFAULT_LAMBDAS = tuple(round(i / 20, 2) for i in range(21))
DEFAULT_MARGINS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
# the optional last stage's settings: a finished fit may add, change or drop its re-ranker on a rerun
RERANK_KEYS = ("reranker", "rerank_depth", "reranker_epochs", "reranker_negatives", "reranker_lr", "distill",
               "distill_candidates", "distill_epochs")
# the third training round's settings: a rerun may add, change or drop it (it comes after the select stage)
REFINE_KEYS = ("refine", "refine_candidates", "refine_epochs")
TUPLE_KEYS = ("margins", "lambdas", "matryoshka", "matryoshka_weights")  # lists in JSON, tuples in the recipe
STAGE_NAMES = {"mine": "mining and retraining", "reranker": "re-ranker", "refine": "refine (third training round)"}
RERANK_WEIGHTS = tuple(round(i / 10, 1) for i in range(1, 11))  # the re-ranker's share in the blend, chosen on dev


@dataclass(frozen=True)
class FitRecipe:
    """Everything :func:`twotower.fit` does, as settings: the starting model and the dev split (or, below
    ``cv_below`` judged queries, the cross-validation folds), the fine-tuning, the mining and retraining, the
    retriever candidates (λ grid, n-best) and the optional re-ranker and its distillation. Stored in
    ``fit.json``; a rerun with another recipe is refused (the re-ranker settings excepted).

    Example::

        recipe = tt.FitRecipe(epochs=2, lambdas=(0.3, 0.5, 0.7))
        print(recipe.to_json()["epochs"])
        result = tt.fit("my-beir-dir", "fitted", epochs=2, lambdas=(0.3, 0.5, 0.7))  # the same, by name
    """

    model: str | None = None  # the starting encoder (default all-MiniLM-L6-v2)
    split: str = "train"  # the judged queries fit learns from; the test split is never read
    dev_fraction: float = 0.2
    min_dev: int = 50  # at least this many dev queries (half the judged queries when there are fewer than 2×)
    seed: int = 42
    language: str = "auto"  # BM25's text analysis (retrieval.analyzers); auto: detected from the documents
    # below cv_below judged queries the choices are made by cv_folds-fold cross-validation (fit/cv.py), not on one
    # dev split, and the final model trains on every judged query; 0: never
    cv_below: int = 300
    cv_folds: int = 3
    # stage 1: fine-tune on the training part's judged pairs
    epochs: float = 4.0  # dev NDCG@10 on SciFact: 0.758 at 2 epochs, 0.792 at 4 (README, fit)
    lr: float = 1e-4  # dev NDCG@10 after fine-tuning 4 epochs: 0.792 at 5e-5, 0.825 at 1e-4
    batch_size: int = 32
    temperature: float = 0.05
    attention_dropout: float | None = 0.0  # 0: fused attention, 1.5x faster steps on CPU
    bucket_size: int | None = None  # None: the device's default (training/config.py)
    # both training rounds: which passage of a positive / mined negative longer than the window to train on
    # (first | best: training/passage_choice.py)
    train_passage: str = DEFAULT_TRAIN_PASSAGE
    # Matryoshka (MRL) in both training rounds: the loss on each prefix of the embedding (e.g. (384, 192, 96, 48)),
    # summed with these weights (default 1 each); the fitted model can then be cut with 'index build --dim'
    matryoshka: tuple[int, ...] | None = None
    matryoshka_weights: tuple[float, ...] | None = None
    # stage 2: mine negatives with the fine-tuned model (ranks a..b, the margin rule), retrain from it
    mine: bool = True  # False: stop after fine-tuning (no mining, no retraining)
    mined_epochs: float = 2.0
    mined_per_query: int = 8
    num_negatives: int = 1
    rank_from: int = 3
    rank_to: int = 50
    margins: tuple[float, ...] = DEFAULT_MARGINS
    # stage 3: the retriever (dense / hybrid λ / RRF) and the model it uses, chosen on dev
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    n_best: int = 100
    metric: str = "ndcg@10"
    # stage 4: the chosen encoder trained once more on lists of its own top refine_candidates unjudged documents
    # per training query (fit/refine.py), kept only where it improves dev. SciFact (test NDCG@10, hybrid): see the
    # fit guide, "the third round"
    refine: bool = True
    refine_candidates: int = 8
    refine_epochs: float = 2.0
    # stage 5 (optional): a cross-encoder trained on the training part, blended with the retriever's scores by a
    # weight chosen on dev (RERANK_WEIGHTS; 1: alone), kept only where it improves dev
    reranker: bool = False
    rerank_depth: int = 100
    reranker_epochs: int = 4  # SciFact: 1 epoch at 3e-5 leaves the loss at chance (1.385 → 1.356); 4 at 1e-4 → 0.092
    reranker_negatives: int = 3
    reranker_lr: float = 1e-4
    # with the re-ranker: its scores distilled into the dual encoder (KL over each training query's top
    # distill_candidates of the chosen retriever, fit/distill.py), kept only where it improves dev
    distill: bool = True
    distill_candidates: int = 8
    distill_epochs: float = 2.0

    def validate(self) -> None:
        """TwoTowerError for a setting that cannot fit, naming it (``--epochs`` on the CLI, ``epochs=`` in Python):
        every number finite, whole where a count is meant, inside its bounds; checked before any work."""
        from twotower.checks import check_number, check_numbers, option_name

        n = check_number
        n(self.dev_fraction, "dev_fraction", above=0, below=1)
        n(self.min_dev, "min_dev", integer=True, minimum=1)
        n(self.seed, "seed", integer=True, minimum=0, maximum=2**32 - 1)
        for key in ("epochs", "mined_epochs", "lr", "temperature"):
            n(getattr(self, key), key, above=0)
        n(self.batch_size, "batch_size", integer=True, minimum=2, hint="in-batch negatives")
        n(self.attention_dropout, "attention_dropout", minimum=0, below=1, optional=True)
        n(self.bucket_size, "bucket_size", integer=True, minimum=0, optional=True)
        for key in ("mined_per_query", "num_negatives", "rank_from", "rank_to", "rerank_depth", "reranker_epochs",
                    "reranker_negatives"):
            n(getattr(self, key), key, integer=True, minimum=1)
        n(self.n_best, "n_best", integer=True, minimum=10)
        n(self.reranker_lr, "reranker_lr", above=0)
        n(self.cv_below, "cv_below", integer=True, minimum=0)
        n(self.cv_folds, "cv_folds", integer=True, minimum=2)
        n(self.distill_candidates, "distill_candidates", integer=True, minimum=2)
        n(self.distill_epochs, "distill_epochs", above=0)
        n(self.refine_candidates, "refine_candidates", integer=True, minimum=1)
        n(self.refine_epochs, "refine_epochs", above=0)
        check_numbers(self.margins, "margins", minimum=0, below=1)
        check_numbers(self.lambdas, "lambdas", minimum=0, maximum=1)
        for key in ("mine", "reranker", "distill", "refine"):
            if not isinstance(getattr(self, key), bool):
                raise TwoTowerError(f"{option_name(key)} {getattr(self, key)!r}: True or False")
        defaults = FitRecipe()
        for flag, keys in (("mine", ("mined_epochs", "mined_per_query", "num_negatives", "rank_from", "rank_to",
                                     "margins")),
                           ("reranker", ("rerank_depth", "reranker_epochs", "reranker_negatives", "reranker_lr", "distill",
                                         "distill_candidates", "distill_epochs")),
                           ("refine", ("refine_candidates", "refine_epochs"))):
            unused = [k for k in keys if not getattr(self, flag) and getattr(self, k) != getattr(defaults, k)]
            if unused:  # set, yet never read with that stage off
                raise TwoTowerError(f"{', '.join(option_name(k).rstrip('=') for k in unused)} set the "
                                    f"{STAGE_NAMES[flag]} stage, which "
                                    f"{option_name(flag).rstrip('=')} off skips: drop them or turn it on")
        checks = [
            (not self.rank_from <= self.rank_to, f"mining ranks {self.rank_from}..{self.rank_to}: need 1 <= a <= b"),
            (self.mined_per_query < self.num_negatives,
             f"{option_name('num_negatives')} {self.num_negatives}: at most the mined {self.mined_per_query}"),
            (not self.margins, "margins: give at least one"),
            (not self.lambdas, "lambdas: give at least one"),
        ]
        from twotower.retrieval.analyzers import check_language
        from twotower.training.config import check_matryoshka

        check_language(self.language)  # names the codes there are
        from twotower.training.passage_choice import resolve_choice

        resolve_choice(self.train_passage)
        if self.matryoshka is not None:
            check_numbers(self.matryoshka, "matryoshka", integer=True, minimum=1)
        if self.matryoshka_weights is not None:
            check_numbers(self.matryoshka_weights, "matryoshka_weights", minimum=0)
        check_matryoshka(list(self.matryoshka) if self.matryoshka is not None else None,
                         list(self.matryoshka_weights) if self.matryoshka_weights is not None else None)
        for bad, message in checks:
            if bad:
                raise TwoTowerError(message)

    def to_json(self) -> dict:
        out = asdict(self)
        for key in TUPLE_KEYS:
            out[key] = list(out[key]) if out[key] is not None else None
        return out

    def rerank_settings(self) -> dict:
        return {k: getattr(self, k) for k in RERANK_KEYS if k != "reranker"}

    def refine_settings(self) -> dict:
        return {k: getattr(self, k) for k in REFINE_KEYS if k != "refine"}


def dev_size(n_queries: int, fraction: float, minimum: int) -> int:
    """How many of ``n_queries`` judged queries the dev part gets: ``fraction`` of them, at least ``minimum``,
    at most half (so that training keeps at least as many); 0 when there are fewer than 2."""
    if n_queries < 2:
        return 0
    return min(n_queries // 2, max(minimum, round(n_queries * fraction)))


def split_queries(query_ids, fraction: float, minimum: int, seed: int) -> tuple[list[str], list[str]]:
    """``(dev, train)`` query ids: a seeded shuffle of the sorted ids, the first :func:`dev_size` to dev.
    By id, so a query's judgements all land on one side; the same ids and seed always give the same split."""
    ids = sorted(set(query_ids))
    random.Random(seed).shuffle(ids)
    cut = dev_size(len(ids), fraction, minimum)
    return sorted(ids[:cut]), sorted(ids[cut:])
