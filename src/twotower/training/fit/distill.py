"""``twotower fit --reranker``'s distillation: the fitted cross-encoder teaches the dual encoder, so that dense and
hybrid retrieval improve without a re-ranker at query time (RocketQAv2's listwise distillation; margin-MSE is its
pairwise cousin).

For each training example (query, judged positive) the chosen encoder's own top ``recipe.distill_candidates``
documents for the query (judged ones left out) form, with the positive first, a candidate list; the cross-encoder
scores every (query, candidate) pair once (the *teacher*). The student, starting from the chosen encoder, is
trained on

    loss = KL( softmax(teacher scores) ‖ softmax(student scores / τ) )  +  in-batch softmax (the list as hard negatives)

over each list (τ: the recipe's temperature). The distilled encoder is then scored on dev like every other
candidate (its dense run, every fusion with BM25), and it replaces the chosen retriever only where it raises the
dev score; otherwise fit.json says why it was left out.
"""

from __future__ import annotations

import json
import random

import numpy as np
import torch
import torch.nn.functional as F

from twotower.data.pairs import TrainExample, load_pairs, save_pairs
from twotower.io import atomic_write_json
from twotower.training.fit.refine import candidate_lists, keep_if_better
from twotower.training.objective import Objective


def listwise_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) ‖ softmax(student)) per list, averaged: ``student``, ``teacher`` (B, C) scores."""
    return F.kl_div(F.log_softmax(student.float(), dim=-1), F.log_softmax(teacher.float(), dim=-1),
                    reduction="batchmean", log_target=True)


class DistillObjective(Objective):
    """Trainer objective over ``(example, teacher scores)`` items: each example's positive then its negatives (all of
    them, in order: the teacher scored that list), ``teacher[i]`` the cross-encoder's score of the i-th."""

    def __init__(self, items: list[tuple[TrainExample, list[float]]]) -> None:
        self.items = items
        self.last_teacher: torch.Tensor | None = None  # the teacher scores of the last step (tests check them)

    def examples(self, stage):
        return self.items

    def step_loss(self, trainer, batch, stage, loss_fn, rng: random.Random) -> torch.Tensor:
        m = trainer.model
        examples = [e for e, _ in batch]
        teacher = torch.tensor([t for _, t in batch], dtype=torch.float32, device=trainer.device)
        self.last_teacher = teacher
        queries, docs = m.with_prompts([e.query for e in examples],
                                       [d for e in examples for d in [e.positive, *e.negatives]])
        embed_queries = m.forward_documents if m.query_tower is m.doc_tower else m.forward_queries
        groups = [(embed_queries, *trainer._tokenize(m.query_tower, queries, m.query_max_length)),
                  (m.forward_documents, *trainer._tokenize(m.doc_tower, docs, m.doc_max_length))]
        fn_mask = trainer.false_negative_mask(examples)
        size = teacher.shape[1]

        def loss_of(q, d):
            d = d.view(len(examples), size, -1)
            student = torch.einsum("bh,bch->bc", q.float(), d.float()) / stage.temperature
            contrastive = loss_fn(q, d[:, 0], d[:, 1:].reshape(-1, d.shape[-1]), false_negative_mask=fn_mask)
            return listwise_kl(student, teacher) + contrastive

        return trainer.backward(groups, loss_of, stage)


def distill_stage(fit) -> dict:
    """The distill stage of the running fit (``run._Fit``, single dev split): teacher scores, the student's
    training, its dev candidates and whether it replaced the chosen retriever."""
    from twotower.retrieval.rerank import Reranker
    from twotower.training.fit import select
    from twotower.training.fit.reranker import ensure_reranker, train_ids

    r = fit.recipe
    before = fit.chosen()  # the select stage's choice, or the refined encoder where that won
    ce_dir, ce_train_s = ensure_reranker(fit)
    start = fit.model_path(before["model"])
    model = fit.load_model(start)
    docs = fit.doc_vectors(before["model"], model)
    folder = fit.stages.dir("distill")
    teacher_path = folder / "teacher.json"
    if not teacher_path.is_file():
        examples = candidate_lists(fit, model, docs, sorted(train_ids(fit)), r.distill_candidates)
        ce = Reranker(ce_dir, batch_size=fit.opts.batch_size or 32, precision=fit.opts.precision,
                      device=fit.opts.device)
        flat = ce.score([(e.query, d) for e in examples for d in [e.positive, *e.negatives]],
                        show_progress=fit.opts.show_progress) if examples else []
        size = 1 + (len(examples[0].negatives) if examples else 0)
        if examples:
            save_pairs(examples, folder / "lists.jsonl")
        atomic_write_json(teacher_path, [[round(float(x), 5) for x in flat[i * size:(i + 1) * size]]
                                         for i in range(len(examples))])
    teacher = json.loads(teacher_path.read_text())
    examples = load_pairs(folder / "lists.jsonl") if teacher else []
    if not examples:
        return {"settings": r.rerank_settings(), "kept": False, "chosen": before, "lists": 0,
                "why": f"no training query has {r.distill_candidates} unjudged documents to rank: nothing to distil"}
    objective = DistillObjective(list(zip(examples, teacher)))
    path = fit.train("distill", None if start is None else str(start), folder / "lists.jsonl", r.distill_epochs,
                     0, objective=objective, batch_size=max(2, r.batch_size // 4))
    dense = fit.dense_dev("distill", fit.load_model(path))
    best, kept = keep_if_better(fit, "distill", before, dense, path)
    flat = [x for t in teacher for x in t]
    return {"settings": r.rerank_settings(), "model": str(path.relative_to(fit.out)), "kept": kept,
            "chosen": best if kept else before, "dev_before": before["dev"], "dev_best_distilled": best["dev"],
            "dev_dense": select.score(fit.dev_qrels(), dense), "lists": len(examples),
            "list_size": len(teacher[0]), "teacher_mean": round(float(np.mean(flat)), 4) if flat else None,
            "teacher_std": round(float(np.std(flat)), 4) if flat else None,
            "teacher_positive_first": round(float(np.mean([t[0] >= max(t[1:]) for t in teacher])), 4) if teacher else None,
            "examples_per_s": fit.last_rate, "reranker_train_s": round(ce_train_s, 1),
            "why": ("the distilled encoder's best retrieval beats the chosen one on dev" if kept else
                    "the distilled encoder does not beat the chosen retrieval on dev: left out")}
