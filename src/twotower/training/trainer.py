"""The training loop: stages, optimizers, schedules, mixed precision, checkpoints, exact resume.

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
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from twotower.data.pairs import TrainExample
from twotower.encoders.inference import resolve_precision
from twotower.encoders.towers import DualEncoder
from twotower.errors import TwoTowerError
from twotower.io import atomic_directory, atomic_write_json
from twotower.training.buckets import embed_in_buckets
from twotower.training.gradcache import cached_backward
from twotower.training.losses import InBatchSoftmaxLoss

log = logging.getLogger(__name__)

OPTIMIZERS = ("adamw", "adafactor")


@dataclass
class StageConfig:
    """One training stage. Data: a BEIR directory + split (judged pairs), or a pairs JSONL file."""

    name: str = "finetune"
    data: str | None = None
    split: str = "train"
    pairs: str | None = None
    epochs: float | None = 1.0
    steps: int | None = None
    batch_size: int = 32
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup: float = 0.1
    temperature: float = 0.05
    bidirectional: bool = True
    hard_negatives: int = 0
    optimizer: str = "adamw"
    cache_chunk: int | None = None
    bucket_size: int | None = 8  # texts per length bucket in a step's forward pass (training/buckets.py); 0: none
    max_grad_norm: float | None = 1.0


@dataclass
class TrainConfig:
    out: str
    model: str | None = None
    towers: str = "sde"
    dim: int | None = None
    layer_norm: bool = False
    similarity: str = "cosine"
    pooling: str | None = None
    query_max_length: int | None = None
    doc_max_length: int | None = None
    precision: str = "auto"
    # dropout on attention probabilities while training (encoders.backbone.set_attention_dropout); None: the
    # backbone's own (0.1 for BERT-family models). 0 lets attention run fused: much faster steps on CPU.
    attention_dropout: float | None = None
    seed: int = 42
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    tensorboard: bool = False
    show_progress: bool = True
    # ME-BERT: train the max score over the document's first m token vectors
    # (twotower.training.multivector); None: the pooled single-vector in-batch softmax
    multivector: int | None = None
    stages: list[StageConfig] = field(default_factory=lambda: [StageConfig()])

    @classmethod
    def from_toml(cls, path: str | Path, **overrides) -> "TrainConfig":
        import tomllib

        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise TwoTowerError(f"{path}: invalid TOML ({exc})") from None
        stages_raw = raw.pop("stage", None) or raw.pop("stages", None)
        if not stages_raw:
            raise TwoTowerError(f"{path}: no [[stage]] tables: a run needs at least one stage")
        known = {f for f in cls.__dataclass_fields__ if f != "stages"}
        unknown = set(raw) - known
        if unknown:
            raise TwoTowerError(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        stages = []
        for i, st in enumerate(stages_raw, start=1):
            bad = set(st) - set(StageConfig.__dataclass_fields__)
            if bad:
                raise TwoTowerError(f"{path}: stage {i}: unknown keys {sorted(bad)}")
            stages.append(StageConfig(**st))
        values = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
        return cls(stages=stages, **values)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def stage_examples(stage: StageConfig) -> list[TrainExample]:
    from twotower.data.beir import BeirDataset
    from twotower.data.pairs import load_pairs, pairs_from_beir

    if stage.pairs:
        return load_pairs(stage.pairs)
    if stage.data:
        return pairs_from_beir(BeirDataset.load(stage.data, stage.split))
    raise TwoTowerError(f"stage '{stage.name}': give data (a BEIR directory) or pairs (a JSONL file)")


def steps_for(stage: StageConfig, n_examples: int, world: int) -> tuple[int, int]:
    """(total steps, steps per epoch) of a stage."""
    per_epoch = math.ceil(n_examples / (stage.batch_size * world))
    if stage.steps:
        return stage.steps, per_epoch
    return max(1, round((stage.epochs or 1.0) * per_epoch)), per_epoch


def batch_indices(seed: int, stage_idx: int, step: int, n: int, batch_size: int, rank: int, world: int) -> np.ndarray:
    """Example indices of this process's share of global batch ``step``: a pure function of its
    arguments, which is what makes resuming reproduce the data order."""
    global_bs = batch_size * world
    per_epoch = math.ceil(n / global_bs)
    epoch, pos = divmod(step, per_epoch)
    order = np.random.default_rng([seed, stage_idx, epoch]).permutation(n)
    batch = order[pos * global_bs : (pos + 1) * global_bs]
    if world > 1 and len(batch) < global_bs:  # equal shares for the all-gather: wrap around (as DistributedSampler)
        batch = np.concatenate([batch, np.resize(order, global_bs - len(batch))])
    return batch[rank::world]


def _false_negative_mask(examples: list[TrainExample]) -> torch.Tensor:
    """True where in-batch document j is (a copy of) a positive of query i, j ≠ i."""
    q = [e.qid or e.query for e in examples]
    p = [e.pid or e.positive for e in examples]
    n = len(examples)
    mask = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            if i != j and (q[i] == q[j] or p[i] == p[j]):
                mask[i, j] = True
    return mask


def make_optimizer(model: torch.nn.Module, stage: StageConfig) -> torch.optim.Optimizer:
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": stage.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if stage.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=stage.lr)
    if stage.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(groups, lr=stage.lr, scale_parameter=False, relative_step=False, warmup_init=False)
    raise TwoTowerError(f"unknown optimizer '{stage.optimizer}': choose one of {', '.join(OPTIMIZERS)}")


class Objective:
    """What a training step optimises; the Trainer keeps the loop, optimizer, schedule, precision,
    progress and checkpoints. This base class is supervised training on (query, positive[,
    negatives]) pairs with the in-batch softmax; others (e.g. Contriever pre-training in
    ``twotower.training.pretrain``) override:

    - :meth:`setup`, called once at the start of :meth:`Trainer.train`, before a checkpoint is loaded;
    - :meth:`examples`: the items a stage's batches index into (``batch_indices``);
    - :meth:`step_loss`: embed one batch, backpropagate (``Trainer.backward``), return the detached
      loss. ``rng`` is seeded by (seed, stage, step), so anything drawn from it is reproduced on resume;
    - :meth:`state_dict` / :meth:`load_state_dict`: extra state written with every checkpoint
      (``objective.pt``) and restored on resume.
    """

    def setup(self, trainer: "Trainer") -> None:
        pass

    def examples(self, stage: StageConfig) -> Sequence:
        return stage_examples(stage)

    def step_loss(self, trainer: "Trainer", batch: list, stage: StageConfig, loss_fn: InBatchSoftmaxLoss,
                  rng: random.Random) -> torch.Tensor:
        return trainer._step_loss(batch, stage, loss_fn, rng)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Trainer:
    def __init__(self, config: TrainConfig, model: DualEncoder | None = None,
                 objective: Objective | None = None) -> None:
        self.config = config
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
        if model is None and torch.cuda.is_available():  # the current GPU (under torchrun: LOCAL_RANK's)
            self.model.to(torch.device("cuda", torch.cuda.current_device()))
        self.device = next(self.model.parameters()).device
        self.precision = resolve_precision(config.precision, self.device)
        self.writer = None
        self.history: list[dict] = []

    # ---------------------------------------------------------------- checkpoints
    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def latest_checkpoint(self) -> Path | None:
        if not self.checkpoint_dir.is_dir():
            return None
        done = sorted(p for p in self.checkpoint_dir.glob("step-*") if (p / "state.json").is_file())
        return done[-1] if done else None

    def _save_checkpoint(self, stage_idx: int, step: int, global_step: int, optimizer, scheduler) -> None:
        if self.rank != 0:
            return
        target = self.checkpoint_dir / f"step-{global_step:08d}"
        with atomic_directory(target) as tmp:
            torch.save(self.model.state_dict(), tmp / "model.pt")
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
            torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
                       tmp / "rng.pt")
            extra = self.objective.state_dict()
            if extra:
                torch.save(extra, tmp / "objective.pt")
            atomic_write_json(tmp / "state.json", {"stage": stage_idx, "step": step, "global_step": global_step,
                                                   "history": self.history[-1000:]})
        old = sorted(p for p in self.checkpoint_dir.glob("step-*") if (p / "state.json").is_file())
        for stale in old[: -self.config.keep_checkpoints]:
            shutil.rmtree(stale, ignore_errors=True)

    def _load_checkpoint(self, path: Path) -> dict:
        state = json.loads((path / "state.json").read_text())
        self.model.load_state_dict(torch.load(path / "model.pt", map_location=self.device, weights_only=True))
        state["optim"] = torch.load(path / "optim.pt", map_location=self.device, weights_only=False)
        state["rng"] = torch.load(path / "rng.pt", weights_only=False)
        extra = path / "objective.pt"
        self.objective.load_state_dict(torch.load(extra, map_location=self.device, weights_only=True)
                                       if extra.is_file() else {})
        self.history = state.get("history", [])
        return state

    # ---------------------------------------------------------------- one step
    def _tokenize(self, tower, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = tower.tokenize(texts, max_length=max_length)
        return batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)

    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

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
        return _false_negative_mask(examples) if self.world == 1 else None

    def _step_loss(self, examples: list[TrainExample], stage: StageConfig, loss_fn, rng: random.Random) -> torch.Tensor:
        m = self.model
        queries, positives, negatives = self.batch_texts(examples, stage, rng)
        fn_mask = self.false_negative_mask(examples)
        groups = [(m.forward_queries, *self._tokenize(m.query_tower, queries, m.query_max_length)),
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
        size = stage.bucket_size if buckets else None
        with self._autocast():
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
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            atomic_write_json(self.out / "train_config.json", asdict(cfg))
        self.objective.setup(self)
        start = None
        if resume:
            ckpt = self.latest_checkpoint()
            if ckpt is None:
                log.warning("--resume: no checkpoint in %s, starting from scratch", self.checkpoint_dir)
            else:
                start = self._load_checkpoint(ckpt)
                log.info("resuming from %s", ckpt)
        if start is None:
            torch.manual_seed(cfg.seed)
            np.random.seed(cfg.seed)
            random.seed(cfg.seed)
        if cfg.tensorboard and self.rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tensorboard"))
        global_step = 0
        for stage_idx, stage in enumerate(cfg.stages):
            examples = self.objective.examples(stage)
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
                first = start["step"]
                global_step += first
                start = None
            self._run_stage(stage_idx, stage, examples, total, first, global_step, optimizer, scheduler)
            global_step += total - first
            if self.rank == 0 and len(cfg.stages) > 1:
                self.model.save(self.out / "stages" / stage.name)
        if self.rank == 0:
            self.model.save(self.out / "model")
            atomic_write_json(self.out / "train_log.json", self.history)
        if self.writer is not None:
            self.writer.close()
        return self.model

    def _run_stage(self, stage_idx, stage, examples, total, first, global_step, optimizer, scheduler) -> None:
        cfg = self.config
        loss_fn = InBatchSoftmaxLoss(stage.temperature, stage.bidirectional, gather_across_devices=self.world > 1)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        bar = tqdm(total=total, initial=first, desc=f"training [{stage.name}]", unit="step",
                   disable=not cfg.show_progress or self.rank != 0)
        seen, t0 = 0, time.perf_counter()
        for step in range(first, total):
            idx = batch_indices(cfg.seed, stage_idx, step, len(examples), stage.batch_size, self.rank, self.world)
            batch = [examples[i] for i in idx]
            neg_rng = random.Random(hash((cfg.seed, stage_idx, step)))
            optimizer.zero_grad(set_to_none=True)
            loss = self.objective.step_loss(self, batch, stage, loss_fn, neg_rng)
            self._sync_gradients()
            if stage.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(params, stage.max_grad_norm)
            optimizer.step()
            scheduler.step()
            seen += len(batch) * self.world
            rate = seen / (time.perf_counter() - t0)
            record = {"stage": stage.name, "step": step + 1, "loss": float(loss), "lr": scheduler.get_last_lr()[0],
                      "examples_per_s": rate}
            self.history.append(record)
            if self.writer is not None:
                self.writer.add_scalar(f"{stage.name}/loss", record["loss"], global_step + step + 1)
                self.writer.add_scalar(f"{stage.name}/lr", record["lr"], global_step + step + 1)
            bar.set_postfix(loss=f"{record['loss']:.4f}", ex_s=f"{rate:.1f}")
            bar.update(1)
            done = step + 1
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < total:
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
