"""``twotower fit``: split → zero-shot → fine-tune → margin → mine → retrain → select → refine (refine.py) → (with
the re-ranker: distill, distill.py; re-rank, reranker.py), each stage resumable (stages.py), every choice made on the dev part of
the judged train queries (recipe.py); with fewer than ``recipe.cv_below`` judged queries: split → zero-shot → cv →
fine-tune on all of them (only where cv chose it) → select, the choices by cross-validation (cv.py). The result: a
model directory whose twotower.json carries the chosen retrieval (retrieval/defaults.py), and ``fit.json``. What
every stage shares (the data, the corpus encoded once per stage, a training round, the model written from a choice)
is context.py's.

The test split is never read: only ``qrels/<recipe.split>.tsv``, the corpus and the queries are.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from twotower.checks import flag, given, option_name
from twotower.data.pairs import pairs_from_beir, save_pairs
from twotower.errors import TwoTowerError
from twotower.io import atomic_write_json
from twotower.training.fit import cv, select
from twotower.training.fit.context import FitContext
from twotower.training.fit.label_free import fit_without_labels
from twotower.training.fit.mined import MiningStages
from twotower.training.fit.recipe import REFINE_KEYS, RERANK_KEYS, FitRecipe, split_queries
from twotower.training.fit.reranker import drop_reranker, rerank_stage

log = logging.getLogger(__name__)

STAGES = ("split", "zeroshot", "cv", "finetune", "margin", "mine", "retrain", "select", "refine", "distill", "rerank")
# the stages a rerun redoes when one of them changes its settings or is turned off after its encoder was kept
REDONE_WITH = {"refine": ("refine", "distill", "rerank"), "distill": ("distill", "rerank"), "rerank": ("rerank",)}
FEW_DEV = 10  # dev queries below which fit warns that its choices rest on too few
ZERO_SHOT_LAMBDA = 0.5  # retrieval.searcher.DEFAULT_LAMBDA (kept in step by tests/test_fit.py)


@dataclass
class FitOptions:
    """How to run (not what to compute: a resumed run may change these)."""

    precision: str = "auto"
    device: str = "auto"
    show_progress: bool = True
    batch_size: int | None = None  # encoding batch (None: the device's default)
    # GradCache chunk for both training rounds (None: whole batches): the same loss in memory bounded by this many
    # texts (docs/guides/fit.md: mpnet-base's retraining without it)
    cache_chunk: int | None = None


@dataclass
class FitResult:
    out: Path
    model: Path
    report: dict
    computed: list[str] = field(default_factory=list)  # stages run by this call (the rest were resumed)
    message: str | None = None  # a note for the user (e.g. no training labels)


class _Fit(MiningStages, FitContext):
    # ------------------------------------------------------------------ stages
    def stage_split(self) -> dict:
        r = self.recipe
        folds = None
        if cv.use_cv(len(self.ds.qrels), r.cv_below, r.cv_folds):  # few labels: folds, and all of them train
            folds = cv.make_folds(self.ds.qrels, r.cv_folds, r.seed)
            dev, train = [], sorted(self.ds.qrels)
        else:
            dev, train = split_queries(self.ds.qrels, r.dev_fraction, r.min_dev, r.seed)
        keep = set(train)
        pairs = [p for p in pairs_from_beir(self.ds) if p.qid in keep]
        if not pairs:
            raise TwoTowerError(f"{self.data}/qrels/{r.split}.tsv: no relevant judgement left for training after "
                                f"holding out {len(dev)} dev queries (add judgements, or lower {flag('dev_fraction')})")
        from twotower.training.config import StageConfig
        from twotower.training.objective import check_learnable

        # before the zero-shot stage's encoding: pairs the fine-tune cannot learn from are refused here
        check_learnable(pairs, StageConfig(name="finetune", batch_size=r.batch_size),
                        where=f"{self.data}/qrels/{r.split}.tsv, the {len(train)} training queries left after "
                              f"holding out {len(dev)} for dev")
        if folds is None and len(dev) < FEW_DEV:
            log.warning("%s/qrels/%s.tsv: %d dev queries: fit chooses the model, the fusion and its λ on them, and "
                        "a dev score on so few (%s) says little; about %d judged train queries (%s on each "
                        "side) make the choices reliable", self.data, r.split, len(dev), ", ".join(dev[:5]),
                        2 * r.min_dev, given("min_dev", r.min_dev))
        save_pairs(pairs, self.stages.dir("split") / "train_pairs.jsonl")
        out = {"dev": dev, "train": train, "dev_queries": len(dev), "train_queries": len(train),
               "train_pairs": len(pairs), "seed": r.seed}
        if folds is not None:
            out.update(folds=folds, why=(f"{len(train)} judged queries, fewer than {given('cv_below', r.cv_below)}: "
                                         f"choices by {len(folds)}-fold cross-validation, the final model trained on "
                                         "all of them"))
        return out

    def stage_zeroshot(self) -> dict:
        from twotower.retrieval.bm25 import BM25, BM25Params

        model = self.load_model(self.recipe.model)
        if self.recipe.matryoshka:  # dimensions above the model's stop here, before any encoding
            from twotower.training.config import check_matryoshka

            check_matryoshka(list(self.recipe.matryoshka), None, model_dim=model.dim)
        dense = self.dense_dev("zeroshot", model)
        dev = self.eval_ids()
        bm = BM25(BM25Params(language=self.recipe.language)).index(
            self.doc_ids, [self.doc_text(d) for d in self.doc_ids], show_progress=self.opts.show_progress)
        sparse = bm.search_run(dev, [self.ds.queries[q] for q in dev], self.recipe.n_best, show_progress=False)
        atomic_write_json(self.stages.dir("zeroshot") / "bm25_dev_run.json", sparse)
        qrels = self.dev_qrels()
        return {"dev_dense": select.score(qrels, dense), "dev_bm25": select.score(qrels, sparse),
                "bm25_language": bm.params.language}  # auto: the one detected

    def stage_finetune(self) -> dict:
        pairs = self.out / "stages" / "split" / "train_pairs.jsonl"
        path = self.train("finetune", self.recipe.model, pairs, self.recipe.epochs, 0)
        if self.cv:  # trained on every judged query: nothing left to score it on (cv did, out-of-fold)
            return {"model": str(path.relative_to(self.out)), "examples_per_s": self.last_rate, "dev_dense": None,
                    "note": "trained on every judged query (cross-validation chose it: stages.cv)"}
        dense = self.dense_dev("finetune", self.load_model(path))
        return {"model": str(path.relative_to(self.out)), "examples_per_s": self.last_rate,
                "dev_dense": select.score(self.dev_qrels(), dense)}

    def model_stages(self) -> list[str]:
        return [s for s in ("zeroshot", "finetune", "retrain") if self.stages.done(s) is not None]

    def stage_cv(self) -> dict:
        return cv.cv_stage(self)

    def stage_refine(self) -> dict:
        from twotower.training.fit.refine import refine_stage

        return refine_stage(self)

    def stage_distill(self) -> dict:
        from twotower.training.fit.distill import distill_stage

        return distill_stage(self)

    def stage_select(self) -> dict:
        r = self.recipe
        if self.cv:
            best = self.stages.done("cv")["chosen"]
            best = {"model": best["model"], "mode": best["mode"], "lambda": best["lambda"], "norm": best["norm"],
                    "dev": {r.metric: best["mean"], "spread": best["spread"], "folds": best["folds"]}}
            self.write_choice(best)
            return {"chosen": best, "by": "cross-validation (stages.cv: every candidate's folds)"}
        runs = {s: self.dev_run(s) for s in self.model_stages()}
        best, rows = select.choose_retriever(runs, self.bm25_dev(), self.dev_qrels(), lambdas=r.lambdas,
                                             n_best=r.n_best, metric=r.metric)
        self.write_choice(best)
        return {"chosen": best, "candidates": rows}

    def stage_rerank(self) -> dict:
        return rerank_stage(self)

    # ------------------------------------------------------------------ driver
    def skipped(self, name: str) -> bool:
        """Whether this fit leaves stage ``name`` out (asked when it comes up: cv's choice decides the fine-tune)."""
        r = self.recipe
        if name in ("distill", "rerank") and not r.reranker or name == "distill" and not r.distill:
            return True
        if name == "cv":
            return not self.cv
        if name == "refine" and not r.refine:
            return True
        if self.cv:  # few labels: no mined retraining (cv.py says why), no refining or distillation (no dev to keep
            if name in ("margin", "mine", "retrain", "refine", "distill"):  # them by)
                return True
            if name == "finetune":
                return self.stages.done("cv")["chosen"]["model"] == "zeroshot"
        return not r.mine and name in ("margin", "mine", "retrain")

    def settings(self, name: str) -> dict | None:
        """The settings stage ``name`` ran with that a rerun may change (then it and the stages after it run again)."""
        r = self.recipe
        return r.refine_settings() if name == "refine" else r.rerank_settings() if name in ("distill", "rerank") else None

    def redo(self, name: str, *, keep_cross_encoder: bool = True) -> None:
        """Forget stage ``name`` and those built on it (:data:`REDONE_WITH`), the model back to what is left chosen.
        The cross-encoder the re-ranker stage trained stays (``stages/rerank/reranker``: it never depended on the
        chosen encoder) unless ``keep_cross_encoder`` is False (the re-ranker's own settings changed)."""
        for stale in REDONE_WITH[name]:
            if stale == "rerank" and keep_cross_encoder:
                (self.out / "stages" / "rerank" / "done.json").unlink(missing_ok=True)
            else:
                shutil.rmtree(self.out / "stages" / stale, ignore_errors=True)
        if self.stages.done("select") is not None:
            self.write_choice(self.chosen())

    def run(self) -> dict:
        report = {}
        for name in STAGES:
            result = self.stages.done(name)
            if name != "split" and self.skipped(name):
                if name in ("refine", "distill") and result is not None and result.get("kept"):
                    self.redo(name)  # an encoder an earlier run put into the model, now turned off
                continue
            if name in REDONE_WITH and result is not None and result.get("settings") != self.settings(name):
                # other settings than last time: this stage and those after it again
                self.redo(name, keep_cross_encoder=name == "refine")
                result = None
            if result is None:
                log.info("fit: stage %s", name)
                started = time.perf_counter()
                result = self.stages.finish(name, getattr(self, f"stage_{name}")(), started)
            report[name] = {k: v for k, v in result.items() if k not in ("dev", "train")}  # ids: in stages/split
        return report


def _has_labels(data: Path, split: str) -> bool:
    path = data / "qrels" / f"{split}.tsv"
    if not path.is_file():
        return False
    from twotower.data.beir import load_qrels

    return len(load_qrels(path)) >= 2


def run_fit(data: str | Path, out: str | Path, recipe: FitRecipe | None = None,
            opts: FitOptions | None = None) -> FitResult:
    """Fit a retriever to ``data`` (a BEIR directory) into ``out``: ``out/model`` and ``out/fit.json``.
    Rerunning with the same ``out`` and recipe resumes after the last finished stage."""
    from twotower.encoders.device import resolve_device

    recipe, opts = recipe or FitRecipe(), opts or FitOptions()
    recipe.validate()
    resolve_device(opts.device)  # a bad --device stops before any work
    data, out = Path(data), Path(out)
    if not (data / "corpus.jsonl").is_file():
        raise TwoTowerError(f"{given('data', data)}: no corpus.jsonl (pass a BEIR-format directory)")
    from twotower.io import check_output_dir
    from twotower.outputs import MARKER, claim_output

    check_output_dir(out, option_name("out"))  # a folder that takes files, said before any work
    claim_output(out, "fit", option=option_name("out").rstrip("="), command="twotower fit")  # never into a
    # training run, an index, analyses or a model
    if not (out / "recipe.json").is_file():  # not a fit run started here: its files are someone else's
        held = sorted(p.name for p in out.iterdir() if p.name not in (MARKER, "data"))
        if held:
            raise TwoTowerError(f"{option_name('out')} {out} holds {', '.join(held[:5])}"
                                f"{' …' if len(held) > 5 else ''} but no fit run (no recipe.json): fit would replace "
                                "model/ and fit.json; choose a new or empty folder")
    fit = _Fit(data, out, recipe, opts)
    resumed = fit.stages.claim(recipe.to_json(), str(data.resolve()), ignore=RERANK_KEYS + REFINE_KEYS)
    t0 = time.perf_counter()
    message = None
    if _has_labels(data, recipe.split):
        stages = fit.run()
        if not recipe.reranker:
            drop_reranker(out)
        chosen = fit.chosen()
        kept_ce = stages.get("rerank", {}).get("kept", False)
        choices = {"model": chosen["model"], "mode": chosen["mode"], "lambda": chosen["lambda"],
                   "norm": select.stored_norm(chosen), "rerank": "reranker" if kept_ce else None,
                   "rerank_weight": stages["rerank"]["weight"] if kept_ce else None, "language": fit.bm25_language(),
                   "dev": stages["rerank"]["dev_after"] if kept_ce else chosen["dev"]}
    else:
        stages, choices, message = fit_without_labels(fit, ZERO_SHOT_LAMBDA)
    report = {"data": str(data.resolve()), "recipe": recipe.to_json(), "stages": stages, "choices": choices,
              "resumed": resumed, "computed_now": fit.stages.computed,
              "wall_s_this_call": round(time.perf_counter() - t0, 1)}
    atomic_write_json(out / "fit.json", report)
    return FitResult(out=out, model=out / "model", report=report, computed=fit.stages.computed, message=message)
