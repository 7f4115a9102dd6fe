"""``twotower fit``'s shared pieces: the train split's data, the dev (or out-of-fold) queries, the corpus encoded
once per stage, a training round, and the model directory written from a choice. The base of ``run._Fit``, whose
stages (there, mined.py, cv.py, refine.py, distill.py, reranker.py) use them."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from twotower.data.beir import BeirDataset
from twotower.io import atomic_directory, atomic_write_json
from twotower.retrieval.defaults import RetrievalDefaults, write_defaults
from twotower.retrieval.dense import to_run
from twotower.training.fit import select
from twotower.training.fit.corpus import CorpusVectors
from twotower.training.fit.recipe import FitRecipe
from twotower.training.fit.stages import StageLog

log = logging.getLogger(__name__)

# a training round also checkpoints every 10 minutes: mpnet-base's retraining on 2 CPU cores took ~190 s a step,
# so 25 steps (the other rule) would be 80 minutes of work a kill could lose
CHECKPOINT_MINUTES = 10.0


class FitContext:
    def __init__(self, data: Path, out: Path, recipe: FitRecipe, opts) -> None:
        self.data, self.out, self.recipe, self.opts = data, out, recipe, opts  # opts: run.FitOptions
        self.stages = StageLog(out)
        self._ds: BeirDataset | None = None
        self._bm25_dev: dict | None = None

    @property
    def ds(self) -> BeirDataset:
        if self._ds is None:
            self._ds = BeirDataset.load(self.data, self.recipe.split)  # the train split only, never test
            self._doc_ids = list(self._ds.corpus)
        return self._ds

    @property
    def doc_ids(self) -> list[str]:
        self.ds  # noqa: B018 (loads the data set once)
        return self._doc_ids

    def doc_text(self, doc_id: str) -> str:
        return self.ds.corpus[doc_id].full_text

    def split(self) -> dict:
        return self.stages.done("split")

    @property
    def cv(self) -> bool:
        """Choices by cross-validation (cv.py): no dev split, every judged query in folds."""
        return self.split().get("folds") is not None

    def eval_ids(self) -> list[str]:
        """The queries the choices are scored on: the dev split, or (cv) every judged query, out-of-fold."""
        split = self.split()
        return sorted(q for fold in split["folds"] for q in fold) if self.cv else split["dev"]

    def dev_qrels(self) -> dict:
        dev = set(self.eval_ids())
        return {q: r for q, r in self.ds.qrels.items() if q in dev}

    def chosen(self) -> dict:
        """The retrieval chosen so far: the select stage's, or the refined / distilled encoder's where it won."""
        for stage in ("distill", "refine"):
            done = self.stages.done(stage)
            if done is not None and done.get("kept"):
                return done["chosen"]
        return self.stages.done("select")["chosen"]

    def model_path(self, stage: str):
        """The encoder a stage made (the zero-shot one: the recipe's)."""
        return self.recipe.model if stage == "zeroshot" else self.out / self.stages.done(stage)["model"]

    def load_model(self, path):
        from twotower.encoders.device import resolve_device
        from twotower.encoders.towers import DualEncoder

        return DualEncoder.load(path, device=resolve_device(self.opts.device))

    def encode_opts(self):
        from twotower.encoders.towers import EncodeOptions

        return EncodeOptions(batch_size=self.opts.batch_size, precision=self.opts.precision,
                             show_progress=self.opts.show_progress)

    def doc_vectors(self, stage: str, model) -> CorpusVectors:
        """The corpus encoded by ``model`` as an index splits it (:mod:`.corpus`), once: kept in
        ``stages/<stage>/`` (``doc_vectors.npy``, ``doc_offsets.npy``, ``doc_ids.json``)."""
        folder = self.stages.dir(stage)
        ids_path = folder / "doc_ids.json"
        if ids_path.is_file() and json.loads(ids_path.read_text()) == self.doc_ids:
            kept = CorpusVectors.load(folder)
            if kept is not None:
                return kept
        corpus = CorpusVectors.encode(model, [self.ds.corpus[d] for d in self.doc_ids], self.doc_ids,
                                      self.encode_opts())
        corpus.save(folder)
        atomic_write_json(ids_path, self.doc_ids)
        return corpus

    def dense_dev(self, stage: str, model) -> dict:
        """``model``'s dev run (n_best deep, each document by its best passage), saved beside its vectors for later
        stages."""
        dev = self.eval_ids()
        docs = self.doc_vectors(stage, model)
        q = model.encode_queries([self.ds.queries[x] for x in dev], self.encode_opts())
        scores, rows = docs.search(q, self.recipe.n_best)
        run = to_run(dev, self.doc_ids, scores, rows)
        atomic_write_json(self.stages.dir(stage) / "dev_run.json", run)
        return run

    def dev_run(self, stage: str) -> dict:
        return json.loads((self.out / "stages" / stage / "dev_run.json").read_text())

    def bm25_dev(self) -> dict:
        if self._bm25_dev is None:
            path = self.out / "stages" / "zeroshot" / "bm25_dev_run.json"
            self._bm25_dev = json.loads(path.read_text())
        return self._bm25_dev

    def bm25_language(self) -> str:
        """The BM25 language of this fit: the recipe's, or the one detected from the documents (auto)."""
        done = self.stages.done("zeroshot")
        if done and done.get("bm25_language"):
            return done["bm25_language"]
        from twotower.retrieval.analyzers import AUTO, detect_language

        if self.recipe.language != AUTO:
            return self.recipe.language
        from twotower.data.beir import load_corpus  # not self.ds: data without train labels has no split to load

        return detect_language([doc.full_text for doc in load_corpus(self.data / "corpus.jsonl").values()])

    def train(self, stage: str, model: str | None, pairs: Path, epochs: float, hard_negatives: int, *,
              objective=None, batch_size: int | None = None, train_passage: str | None = None) -> Path:
        from twotower.training.checkpoints import check_resumable, complete_checkpoints
        from twotower.training.config import StageConfig, TrainConfig
        from twotower.training.trainer import Trainer

        r = self.recipe
        run_dir = self.stages.dir(stage) / "run"
        cfg = TrainConfig(
            out=str(run_dir), model=model, precision=self.opts.precision, device=self.opts.device,
            attention_dropout=r.attention_dropout, seed=r.seed, show_progress=self.opts.show_progress,
            checkpoint_every=25, checkpoint_minutes=CHECKPOINT_MINUTES,
            matryoshka=list(r.matryoshka) if r.matryoshka else None,
            matryoshka_weights=list(r.matryoshka_weights) if r.matryoshka_weights else None,
            # distillation's items are scored candidates, not pairs: its teacher scored whole texts
            train_passage=train_passage or (r.train_passage if objective is None else "first"), stages=[StageConfig(
                name=stage.replace("/", "-"), pairs=str(pairs), epochs=epochs, batch_size=batch_size or r.batch_size, lr=r.lr,
                temperature=r.temperature, bucket_size=r.bucket_size, hard_negatives=hard_negatives,
                cache_chunk=self.opts.cache_chunk)],
        )
        if (run_dir / "train_log.json").is_file() and (run_dir / "model").is_dir():
            # the round finished (its log is written after the model) and the stage stopped later, in its dev
            # encoding: keep the model, made with these settings, instead of training again from a checkpoint
            check_resumable(json.loads((run_dir / "train_config.json").read_text()), cfg, run_dir)
            log.info("%s: training finished in an earlier run; using %s", stage, run_dir / "model")
            self.last_rate = _last_rate(json.loads((run_dir / "train_log.json").read_text()))
            return run_dir / "model"
        resume = bool(complete_checkpoints(run_dir / "checkpoints"))
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished attempt without a checkpoint: nothing to keep
        trainer = Trainer(cfg, objective=objective, documents=self.ds.corpus)  # titles kept in chosen passages
        trainer.train(resume=resume)
        self.last_rate = _last_rate(trainer.history)
        return run_dir / "model"

    def write_choice(self, choice: dict, path: Path | None = None) -> None:
        """``OUT/model``: the encoder of ``choice["model"]`` (at ``path`` before its stage is done) with the retrieval
        ``choice`` names (mode, λ, normalisation) and the fit's BM25 language."""
        r = self.recipe
        self.write_model(choice["model"], RetrievalDefaults(
            mode=choice["mode"], lam=choice["lambda"], norm=select.stored_norm(choice), rerank_depth=r.rerank_depth,
            language=self.bm25_language()), path=path)

    def write_model(self, stage: str, defaults: RetrievalDefaults, path: Path | None = None) -> None:
        target = self.out / "model"
        with atomic_directory(target) as tmp:
            if stage == "zeroshot":
                self.load_model(self.recipe.model).save(tmp / "m")
            else:
                shutil.copytree(path or self.model_path(stage), tmp / "m")
            for item in (tmp / "m").iterdir():
                item.rename(tmp / item.name)
            (tmp / "m").rmdir()
            write_defaults(tmp, defaults)


def _last_rate(history: list[dict]) -> float | None:
    """The last training speed (examples/s) in a run's log, rounded; None for a log without one."""
    rates = [h["examples_per_s"] for h in history if "examples_per_s" in h]
    return round(rates[-1], 2) if rates else None
