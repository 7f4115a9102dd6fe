"""The training loop: stages, optimizers, schedules, mixed precision, checkpoints, exact resume (each stage's
batches: training/batching.py; its optimizer: training/optimizer.py).

A run is one or more *stages* (e.g. generic pre-training, then in-domain fine-tuning), each
with its own data, steps, learning rate and temperature, sharing one model. Every
``checkpoint_every`` steps the model, optimizer, scheduler, RNG states and position are written
atomically; ``resume=True`` continues from the newest complete checkpoint with the same data order
and random state, so a killed and resumed run ends with the weights an uninterrupted run has.

Under ``torchrun`` (WORLD_SIZE > 1) each process takes its share of every global batch, the loss
gathers embeddings from all processes, and gradients are averaged across processes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from twotower.progress import progress_bar

from twotower.checks import given, switch
from twotower.data.pairs import TrainExample
from twotower.encoders.device import attention_kernels, describe, device_of, resolve_device
from twotower.encoders.inference import pad_id_of, pad_token_ids, resolve_precision, token_ids
from twotower.encoders.towers import DualEncoder
from twotower.errors import TwoTowerError
from twotower.io import atomic_write_json
from twotower.training.batching import batch_indices, false_negative_mask, steps_for
from twotower.training.buckets import embed_in_buckets, embed_together
from twotower.training.checkpoints import (
    check_resumable, check_run_dir, complete_checkpoints, newest_loadable, save_checkpoint)
from twotower.training.config import (  # noqa: F401 (StageConfig, TrainConfig re-exported)
    DEFAULT_BUCKET_SIZE, StageConfig, TrainConfig)
from twotower.training.gradcache import cached_backward
from twotower.training.losses import InBatchSoftmaxLoss, MatryoshkaLoss
from twotower.training.objective import Objective
from twotower.training.optimizer import freeze_token_embeddings, make_optimizer

log = logging.getLogger(__name__)

LOG_EVERY = 10  # steps per host synchronisation for the loss log (Trainer._flush_log)
# Training batches are padded to a multiple of this many tokens, by device: on a GPU every new (batch, length)
# shape may cost a kernel plan or a tuning pass, and multiples of 8 are what tensor cores take whole.
PAD_MULTIPLE = {"cuda": 8}
# Devices on which a step's groups that one tower embeds (shared towers, no length buckets) run as one padded batch
# (buckets.embed_together): on a GPU the padding's arithmetic is cheap and every forward pass costs launches; on a
# CPU the padding is the cost.
ONE_PASS_DEVICES = {"cuda"}

def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Trainer:
    def __init__(self, config: TrainConfig, model: DualEncoder | None = None,
                 objective: Objective | None = None, documents=None) -> None:
        config.validate()
        self.config = config
        # {id: Document} that the training pairs' ids name: a chosen passage keeps its document's title in front
        # (training.passage_choice); None: a BEIR stage's own corpus, or the pairs' texts as they stand
        self.documents = documents
        self.passage_choices: list[dict] = []  # per stage: what train_passage changed (passage_choice.py)
        if objective is None and config.multivector is not None:
            from twotower.training.multivector import MultiVectorObjective

            objective = MultiVectorObjective(config.multivector)
        self.objective = objective or Objective()
        self.out = Path(config.out)
        self.rank, self.world = _world()
        torch.manual_seed(config.seed)  # a new projection's initialisation is part of the run
        self.model = model or DualEncoder.build(
            config.model, towers=config.towers, dim=config.dim, layer_norm=config.layer_norm,
            similarity=config.similarity, pooling=config.pooling,
            query_max_length=config.query_max_length, doc_max_length=config.doc_max_length,
        )
        if config.attention_dropout is not None:
            from twotower.encoders.backbone import set_attention_dropout

            for backbone in {id(t.backbone): t.backbone for t in (self.model.query_tower, self.model.doc_tower)}.values():
                set_attention_dropout(backbone, config.attention_dropout)
        if config.matryoshka:
            from twotower.training.config import check_matryoshka

            check_matryoshka(config.matryoshka, config.matryoshka_weights, model_dim=self.model.dim)
        if config.freeze_embeddings:
            freeze_token_embeddings(self.model)
        # auto: the current GPU where there is one (under torchrun: LOCAL_RANK's); a model passed in stays where
        # it is unless a device is named
        if model is None or config.device != "auto":
            self.model.to(resolve_device(config.device))
        self.device = device_of(self.model)
        self.precision = resolve_precision(config.precision, self.device)
        self.writer = None
        self.history: list[dict] = []  # one record per step, the whole run (kept across resumes)
        self._pending: list[tuple[dict, torch.Tensor]] = []  # steps whose loss is still on the device
        self.clock = time.monotonic  # what checkpoint_minutes is measured with
        self._saved_at = self.clock()  # the run's start, then its last checkpoint

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        found = complete_checkpoints(self.checkpoint_dir)
        return found[-1] if found else None

    def _save_checkpoint(self, stage_idx: int, step: int, global_step: int, optimizer, scheduler) -> None:
        if self.rank != 0:
            return
        self._flush_log()
        self._saved_at = self.clock()
        save_checkpoint(self.checkpoint_dir, stage=stage_idx, step=step, global_step=global_step, model=self.model,
                        optimizer=optimizer, scheduler=scheduler, objective_state=self.objective.state_dict(),
                        history=self.history, config=self.config, keep=self.config.keep_checkpoints)

    def _checkpoint_due(self, done: int) -> bool:
        """Every ``checkpoint_every`` steps of a stage, and once ``checkpoint_minutes`` have passed since the last."""
        cfg = self.config
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
            return True
        return bool(cfg.checkpoint_minutes) and self.clock() - self._saved_at >= cfg.checkpoint_minutes * 60

    def _restore(self, state: dict) -> dict:
        self.model.load_state_dict(state["model"])
        self.objective.load_state_dict(state["objective"])
        self.history = state.get("history", [])
        return state

    # ---------------------------------------------------------------- one step
    def _tokenize(self, tower, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's token ids and mask on the device: through the fast tokenizer's backend and numpy padding
        (:func:`~twotower.encoders.inference.token_ids`, the ids of ``tower.tokenize``), padded on a GPU to a
        multiple of :data:`PAD_MULTIPLE` tokens (fewer distinct shapes for the kernels, aligned for tensor cores)."""
        tokenizer = tower.tokenizer
        if getattr(tokenizer, "padding_side", "right") == "right":
            ids, mask = pad_token_ids(token_ids(tokenizer, texts, max_length), pad_id_of(tokenizer),
                                      PAD_MULTIPLE.get(self.device.type, 1))
        else:
            batch = tower.tokenize(texts, max_length=max_length)
            ids, mask = batch["input_ids"], batch["attention_mask"]
        pin = self.device.type == "cuda"
        if pin:
            ids, mask = ids.pin_memory(), mask.pin_memory()
        return ids.to(self.device, non_blocking=pin), mask.to(self.device, non_blocking=pin)

    def bucket_size(self, stage: StageConfig) -> int:
        """Texts per length bucket: the stage's, or the device's default (8 on CPU, 0 = none on CUDA)."""
        if stage.bucket_size is not None:
            return stage.bucket_size
        return DEFAULT_BUCKET_SIZE.get(self.device.type, 0)

    @contextlib.contextmanager
    def _autocast(self):
        """The forward pass's context: autocast under bf16, and attention kernels that build nothing per shape on a
        GPU (:func:`~twotower.encoders.device.attention_kernels`)."""
        with attention_kernels(self.device), (torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
                                              if self.precision == "bf16" else contextlib.nullcontext()):
            yield

    def batch_texts(self, examples: list[TrainExample], stage: StageConfig,
                    rng: random.Random) -> tuple[list[str], list[str], list[str]]:
        """(queries, positives, hard negatives) of a batch; ``stage.hard_negatives`` negatives per
        example are drawn from ``rng`` (the step's seeded RNG, so resuming draws the same)."""
        queries = [e.query for e in examples]
        positives = [e.positive for e in examples]
        negatives: list[str] = []
        if stage.hard_negatives:
            for e in examples:
                if len(e.negatives) < stage.hard_negatives:
                    raise TwoTowerError(
                        f"stage '{stage.name}' asks for {stage.hard_negatives} hard negatives per query but an "
                        f"example has {len(e.negatives)} (mine more, or lower hard_negatives)"
                    )
                negatives.extend(rng.sample(e.negatives, stage.hard_negatives))
        return self.model.with_prompts(queries, positives, negatives)  # the model's "query: "/"passage: " prefixes

    def false_negative_mask(self, examples: list[TrainExample]) -> torch.Tensor | None:
        """In-batch copies of a query's positives to leave out of its denominator (one process only)."""
        return false_negative_mask(examples, self.device) if self.world == 1 else None

    def _step_loss(self, examples: list[TrainExample], stage: StageConfig, loss_fn, rng: random.Random) -> torch.Tensor:
        m = self.model
        queries, positives, negatives = self.batch_texts(examples, stage, rng)
        fn_mask = self.false_negative_mask(examples)
        # shared towers (SDE): queries go through the one tower as documents do, so backward can embed all at once
        embed_queries = m.forward_documents if m.query_tower is m.doc_tower else m.forward_queries
        groups = [(embed_queries, *self._tokenize(m.query_tower, queries, m.query_max_length)),
                  (m.forward_documents, *self._tokenize(m.doc_tower, positives, m.doc_max_length))]
        if negatives:
            groups.append((m.forward_documents, *self._tokenize(m.doc_tower, negatives, m.doc_max_length)))

        def loss_of(q, d, h=None):
            return loss_fn(q, d, h, false_negative_mask=fn_mask)

        return self.backward(groups, loss_of, stage)

    def backward(self, groups, loss_of, stage: StageConfig, *, buckets: bool = True) -> torch.Tensor:
        """Embed ``groups`` (``(embed_fn, input_ids, attention_mask)`` each) under the run's precision,
        backpropagate ``loss_of(*embeddings)`` (GradCache when the stage sets ``cache_chunk``) and
        return the detached loss. Without GradCache each group runs in length buckets of
        ``stage.bucket_size`` texts (``buckets=False``: whole, for embed functions that return tuples)."""
        if stage.cache_chunk:
            return cached_backward(groups, loss_of, stage.cache_chunk, autocast=self._autocast)
        size = self.bucket_size(stage) if buckets else None
        with self._autocast():
            if buckets and not size and self.device.type in ONE_PASS_DEVICES and len({g[0] for g in groups}) == 1:
                embs = embed_together(groups[0][0], [(ids, mask) for _, ids, mask in groups])
            else:
                embs = [embed_in_buckets(fn, ids, mask, size) for fn, ids, mask in groups]
        loss = loss_of(*embs)
        loss.backward()
        return loss.detach()

    def _sync_gradients(self) -> None:
        if self.world == 1:
            return
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world

    # ---------------------------------------------------------------- the run
    def train(self, *, resume: bool = False) -> DualEncoder:
        from transformers import get_linear_schedule_with_warmup

        cfg = self.config
        start = newest_loadable(self.checkpoint_dir, self.device) if resume else None
        check_run_dir(self.out, resume=resume, start=start)
        if start is not None:
            check_resumable(start.get("config"), cfg, start["path"])
        elif resume:
            log.warning("%s: no checkpoint in %s, starting from scratch", switch("resume"), self.checkpoint_dir)
        self.objective.setup(self)
        # every stage's data read and checked (enough to learn from?) before the run folder is written
        stage_examples = [self.objective.examples(stage) for stage in cfg.stages]
        # the passage of each long positive / negative to train on, chosen with the starting model (before a
        # checkpoint is restored, so a resumed run chooses the same)
        from twotower.training.passage_choice import stage_passages

        chosen = [stage_passages(self.model, stage, examples, cfg.train_passage, documents=self.documents,
                                 precision=cfg.precision, show_progress=cfg.show_progress and self.rank == 0)
                  for stage, examples in zip(cfg.stages, stage_examples)]
        stage_examples = [examples for examples, _ in chosen]
        self.passage_choices = [summary for _, summary in chosen if summary is not None]
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            from twotower.outputs import claim_output

            claim_output(self.out, "train", command="twotower train (or pretrain)")
            atomic_write_json(self.out / "train_config.json", {**asdict(cfg), "device_used": describe(self.device)})
            if self.passage_choices:  # which passages of long positives / negatives the run trains on
                atomic_write_json(self.out / "train_passages.json", self.passage_choices)
        if start is not None:
            self._restore(start)
            log.info("resuming from %s", start["path"])
        else:
            torch.manual_seed(cfg.seed)
            np.random.seed(cfg.seed)
            random.seed(cfg.seed)
        if cfg.tensorboard and self.rank == 0:
            from twotower.training.tensorboard_log import open_writer

            self.writer = open_writer(self.out / "tensorboard")
        global_step = 0
        self._saved_at = self.clock()
        for stage_idx, stage in enumerate(cfg.stages):
            examples = stage_examples[stage_idx]
            total, _ = steps_for(stage, len(examples), self.world)
            if start is not None and stage_idx < start["stage"]:
                global_step += total
                continue
            optimizer = make_optimizer(self.model, stage)
            scheduler = get_linear_schedule_with_warmup(optimizer, int(stage.warmup * total), total)
            first = 0
            if start is not None and stage_idx == start["stage"]:
                optimizer.load_state_dict(start["optim"]["optimizer"])
                scheduler.load_state_dict(start["optim"]["scheduler"])
                torch.set_rng_state(start["rng"]["torch"])
                np.random.set_state(start["rng"]["numpy"])
                random.setstate(start["rng"]["python"])
                if "cuda" in start["rng"] and self.device.type == "cuda":
                    torch.cuda.set_rng_state_all(start["rng"]["cuda"])
                first = start["step"]
                start = None
            # global_step: steps of the stages before this one; this stage's step s is global step global_step + s
            self._run_stage(stage_idx, stage, examples, total, first, global_step, optimizer, scheduler)
            global_step += total
            if self.rank == 0 and len(cfg.stages) > 1:
                self.model.save(self.out / "stages" / stage.name)
        if self.rank == 0:
            self.model.save(self.out / "model")
            atomic_write_json(self.out / "train_log.json", self.history)
        if self.writer is not None:
            self.writer.close()
        return self.model

    def _flush_log(self) -> None:
        """Turn the steps' loss tensors into log records: one host synchronisation for every ``LOG_EVERY``
        steps (and before a checkpoint or the end), not one per step, so the GPU never waits on logging."""
        if not self._pending:
            return
        losses = torch.stack([loss for _, loss in self._pending]).float().cpu().tolist()
        for (record, _), loss in zip(self._pending, losses):
            record["loss"] = loss
            self.history.append(record)
            if self.writer is not None:
                self.writer.add_scalar(f"{record['stage']}/loss", loss, record["global_step"])
                self.writer.add_scalar(f"{record['stage']}/lr", record["lr"], record["global_step"])
        bad = next((r for r in self.history[-len(self._pending):] if not math.isfinite(r["loss"])), None)
        self._pending.clear()
        if bad is not None:
            raise TwoTowerError(f"training diverged: loss {bad['loss']} at step {bad['step']} of stage '{bad['stage']}' "
                                "(lower the learning rate, raise the temperature, or use "
                                f"{given('precision', 'fp32')}); no model was saved")

    def loss_for(self, stage: StageConfig):
        """The stage's in-batch softmax; summed over the embedding's prefixes when the run sets ``matryoshka``."""
        loss_fn = InBatchSoftmaxLoss(stage.temperature, stage.bidirectional, gather_across_devices=self.world > 1)
        if not self.config.matryoshka:
            return loss_fn
        weights = self.config.matryoshka_weights
        return MatryoshkaLoss(loss_fn, tuple(self.config.matryoshka), tuple(weights) if weights else None,
                              normalize=bool(self.model.doc_tower.normalize))

    def _run_stage(self, stage_idx, stage, examples, total, first, global_step, optimizer, scheduler) -> None:
        cfg = self.config
        loss_fn = self.loss_for(stage)
        params = [p for p in self.model.parameters() if p.requires_grad]
        device = describe(self.device)
        self.model.train()
        bar = progress_bar(total=total, initial=first, desc=f"training [{stage.name}]", unit="step",
                   disable=not cfg.show_progress or self.rank != 0)
        seen, t0 = 0, time.perf_counter()
        for step in range(first, total):
            idx = batch_indices(cfg.seed, stage_idx, step, len(examples), stage.batch_size, self.rank, self.world)
            batch = [examples[i] for i in idx]
            neg_rng = random.Random(hash((cfg.seed, stage_idx, step)))
            optimizer.zero_grad(set_to_none=True)
            lr = optimizer.param_groups[0]["lr"]  # the rate this step's update uses (the scheduler moves it after)
            loss = self.objective.step_loss(self, batch, stage, loss_fn, neg_rng)
            self._sync_gradients()
            if stage.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(params, stage.max_grad_norm)
            optimizer.step()
            scheduler.step()
            seen += len(batch) * self.world
            done = step + 1
            rate = seen / (time.perf_counter() - t0)
            record = {"stage": stage.name, "step": done, "global_step": global_step + done,
                      "lr": lr, "examples_per_s": rate, "device": device}
            self._pending.append((record, loss.detach()))
            if len(self._pending) >= LOG_EVERY or done == total:
                self._flush_log()
                bar.set_postfix(loss=f"{self.history[-1]['loss']:.4f}", ex_s=f"{rate:.1f}")
            bar.update(1)
            if done < total and self._checkpoint_due(done):
                self._save_checkpoint(stage_idx, done, global_step + done, optimizer, scheduler)
        bar.close()
        self.model.eval()


def maybe_init_distributed() -> None:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
