"""``twotower fit``'s second training round: the false-negative margin measured on dev (margin.py), negatives
mined with the fine-tuned model, the retraining on them. A mixin of ``run._Fit`` (its stages; the recipe, data and
training rounds of context.py), kept apart so that each module holds one idea."""

from __future__ import annotations

import numpy as np

from twotower.data.pairs import load_pairs, save_pairs
from twotower.training.fit import select
from twotower.training.fit.corpus import CorpusVectors
from twotower.training.fit.margin import choose_margin, measure_margins, mine_negatives


class MiningStages:
    def _rankings(self, model, qids: list[str], docs: CorpusVectors) -> tuple[dict, np.ndarray]:
        q = model.encode_queries([self.ds.queries[x] for x in qids], self.encode_opts())
        scores, idx = docs.search(q, self.recipe.rank_to)
        rankings = {x: [(self.doc_ids[j], float(s)) for s, j in zip(rs, ri)] for x, rs, ri in zip(qids, scores, idx)}
        return rankings, q

    def stage_margin(self) -> dict:
        r = self.recipe
        model = self.load_model(self.model_path("finetune"))
        docs = self.doc_vectors("finetune", model)
        dev = self.split()["dev"]
        rankings, q = self._rankings(model, dev, docs)
        row = {d: i for i, d in enumerate(self.doc_ids)}
        positives = {x: {d: docs.score(q[i], row[d]) for d, rel in self.ds.qrels[x].items() if rel > 0}
                     for i, x in enumerate(dev)}
        measured = measure_margins(rankings, positives, r.margins, (r.rank_from, r.rank_to))
        margin, why = choose_margin(measured)
        return {"margin": margin, "why": why, "measured": measured}

    def stage_mine(self) -> dict:
        r = self.recipe
        model = self.load_model(self.model_path("finetune"))
        docs = self.doc_vectors("finetune", model)
        train = self.split()["train"]  # never a dev query
        rankings, q = self._rankings(model, train, docs)
        row, qrow = {d: i for i, d in enumerate(self.doc_ids)}, {x: i for i, x in enumerate(train)}
        pairs = load_pairs(self.out / "stages" / "split" / "train_pairs.jsonl")
        pos_scores = {(p.qid, p.pid): docs.score(q[qrow[p.qid]], row[p.pid]) for p in pairs}
        mined, stats = mine_negatives(
            pairs, rankings, pos_scores, self.ds.qrels, self.doc_text, margin=self.stages.done("margin")["margin"],
            rank_range=(r.rank_from, r.rank_to), per_query=r.mined_per_query, seed=r.seed,
            at_least=r.num_negatives, corpus_ids=self.doc_ids)
        save_pairs(mined, self.stages.dir("mine") / "mined_pairs.jsonl")
        return stats

    def stage_retrain(self) -> dict:
        start = str(self.model_path("finetune"))
        pairs = self.out / "stages" / "mine" / "mined_pairs.jsonl"
        path = self.train("retrain", start, pairs, self.recipe.mined_epochs, self.recipe.num_negatives)
        dense = self.dense_dev("retrain", self.load_model(path))
        return {"model": str(path.relative_to(self.out)), "examples_per_s": self.last_rate,
                "dev_dense": select.score(self.dev_qrels(), dense)}
