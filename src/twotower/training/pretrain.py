"""Unsupervised contrastive pre-training on raw text (Contriever), on the regular Trainer.

:class:`ContrastivePretraining` is a trainer :class:`~twotower.training.objective.Objective`: its
examples are corpus chunks (``twotower.data.augment``); each step draws two views of every chunk
in the batch from the step's seeded RNG (so a resumed run sees the same views) and then

- ``negatives="inbatch"``: the in-batch softmax (the stage's temperature and direction), gradient
  through both views — the same loss as supervised training, views as (query, positive);
- ``negatives="moco"``: queries through the model, keys through a momentum copy of it with no
  gradient, negatives from a FIFO queue of past keys (``twotower.training.moco``). The key encoder
  and the queue are saved with every checkpoint and restored on resume. MoCo needs shared towers.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from twotower.checks import flag
from twotower.data.augment import Chunk, ViewConfig, Vocab, load_chunks, make_views
from twotower.errors import TwoTowerError
from twotower.io import atomic_write_json
from twotower.training.losses import InBatchSoftmaxLoss, moco_loss
from twotower.training.moco import KeyQueue, gather_keys, momentum_copy, momentum_update
from twotower.training.trainer import Objective, StageConfig, TrainConfig, Trainer

log = logging.getLogger(__name__)

NEGATIVES = ("inbatch", "moco")


@dataclass
class PretrainConfig:
    """What :func:`twotower.pretrain` learns from: the ``corpus`` (a BEIR folder, JSONL or plain text), how two
    views of a chunk are made (:class:`~twotower.ViewConfig`), and the negatives: ``inbatch`` or ``moco`` (a queue
    of ``queue_size`` keys from a momentum encoder updated with ``momentum``).

    Example::

        pre = tt.PretrainConfig(corpus="my-beir-dir/corpus.jsonl", views=tt.ViewConfig(augment="ict"),
                                negatives="moco", queue_size=1024)
    """

    corpus: str
    views: ViewConfig = field(default_factory=ViewConfig)
    negatives: str = "inbatch"
    queue_size: int = 131072
    momentum: float = 0.9995
    limit_docs: int | None = None

    def validate(self) -> None:
        self.views.validate()
        if self.negatives not in NEGATIVES:
            raise TwoTowerError(f"unknown negatives '{self.negatives}': choose one of {', '.join(NEGATIVES)}")
        from twotower.checks import check_number

        check_number(self.queue_size, "queue_size", integer=True, minimum=1)
        check_number(self.momentum, "momentum", minimum=0, maximum=1)
        check_number(self.limit_docs, "limit_docs", integer=True, minimum=1, optional=True)


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single text (BERT: [CLS] … [SEP]; T5: … </s>)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return list(full[:i]), list(full[i + len(bare) :])
    raise TwoTowerError(f"cannot tell which special tokens {type(tokenizer).__name__} adds around a text")


class ContrastivePretraining(Objective):
    def __init__(self, config: PretrainConfig) -> None:
        config.validate()
        self.config = config
        self.trainer: Trainer | None = None
        self.key_encoder: torch.nn.Module | None = None
        self.queue: KeyQueue | None = None
        self._chunks: list[Chunk] | None = None
        self._vocab: Vocab | None = None

    # ------------------------------------------------------------ Objective
    def setup(self, trainer: Trainer) -> None:
        self.trainer = trainer
        model = trainer.model
        tokenizer = model.query_tower.tokenizer
        self._vocab = Vocab.from_tokenizer(tokenizer)
        if self.config.negatives == "moco":
            if not model.shared:
                raise TwoTowerError(f"MoCo pre-training needs shared towers (sde), not '{model.kind}': the key "
                                    "encoder follows the one query/document encoder")
            self.key_encoder = momentum_copy(model.query_tower).to(trainer.device)
            self.queue = KeyQueue(self.config.queue_size, model.dim, device=trainer.device)

    def examples(self, stage: StageConfig) -> list[Chunk]:
        if self._chunks is None:
            tokenizer = self.trainer.model.query_tower.tokenizer
            self._chunks = load_chunks(self.config.corpus, tokenizer, self.config.views,
                                       limit_docs=self.config.limit_docs,
                                       show_progress=self.trainer.config.show_progress)
            check_chunks(self._chunks, self.config.corpus, stage)
        return self._chunks

    def views(self, batch: list[Chunk], rng: random.Random) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The (query, key) views of a batch, drawn from the step's RNG."""
        gen = np.random.default_rng(rng.getrandbits(64))
        pairs = [make_views(c, self.config.views, gen, self._vocab) for c in batch]
        return [a for a, _ in pairs], [b for _, b in pairs]

    def inputs(self, tower, views: list[np.ndarray], max_length: int,
               role: str = "query") -> tuple[torch.Tensor, torch.Tensor]:
        """Token-id views → padded ``input_ids`` / ``attention_mask`` with the tokenizer's special tokens, behind
        the model's prompt for ``role`` where it has one (multilingual-e5: query view "query:", key view
        "passage:"), as every other training and encoding path puts it in front of the text."""
        tok = tower.tokenizer
        prefix, suffix = special_tokens(tok)
        prompt = tower.prompts.get(role, "").strip()
        prefix = prefix + (tok(prompt, add_special_tokens=False)["input_ids"] if prompt else [])
        room = max(1, max_length - len(prefix) - len(suffix))
        ids = [prefix + [int(t) for t in v[:room]] + suffix for v in views]
        input_ids = torch.full((len(ids), max(map(len, ids))), tok.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, seq in enumerate(ids):  # right padding, as the tokenizer pads text batches
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        device = self.trainer.device
        return input_ids.to(device), mask.to(device)

    def step_loss(self, trainer: Trainer, batch: list[Chunk], stage: StageConfig, loss_fn: InBatchSoftmaxLoss,
                  rng: random.Random) -> torch.Tensor:
        m = trainer.model
        q_views, k_views = self.views(batch, rng)
        q_ids, q_mask = self.inputs(m.query_tower, q_views, m.query_max_length, "query")
        k_ids, k_mask = self.inputs(m.doc_tower, k_views, m.doc_max_length, "document")
        if self.config.negatives == "inbatch":
            groups = [(m.forward_queries, q_ids, q_mask), (m.forward_documents, k_ids, k_mask)]
            return trainer.backward(groups, lambda q, d: loss_fn(q, d), stage)
        return self._moco_step(trainer, (q_ids, q_mask), (k_ids, k_mask), stage)

    def _moco_step(self, trainer: Trainer, queries, keys, stage: StageConfig) -> torch.Tensor:
        m = trainer.model
        # θk follows θq as it is after the previous optimizer step (MoCo updates before encoding keys)
        momentum_update(self.key_encoder, m.query_tower, self.config.momentum)
        self.key_encoder.train(m.training)
        with torch.no_grad(), trainer._autocast():
            k = self._encode_keys(*keys, stage.cache_chunk or len(keys[0])).float()
        negatives = self.queue.negatives().clone()
        loss = trainer.backward([(m.forward_queries, *queries)],
                                lambda q: moco_loss(q, k, negatives, stage.temperature), stage)
        self.queue.push(gather_keys(k))
        return loss

    def _encode_keys(self, ids: torch.Tensor, mask: torch.Tensor, chunk: int) -> torch.Tensor:
        return torch.cat([self.key_encoder(ids[i : i + chunk], mask[i : i + chunk])
                          for i in range(0, len(ids), chunk)])

    def state_dict(self) -> dict:
        if self.config.negatives != "moco":
            return {}
        return {"key_encoder": self.key_encoder.state_dict(), "queue": self.queue.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.config.negatives != "moco":
            return
        if "key_encoder" not in state or "queue" not in state:
            raise TwoTowerError("the checkpoint holds no MoCo key encoder and queue: it was written by a run "
                                f"with other {flag('negatives')}; resume with the same options or start a new "
                                f"{flag('out')}")
        self.key_encoder.load_state_dict(state["key_encoder"])
        self.queue.load_state_dict(state["queue"])


def pretrain(train: TrainConfig, config: PretrainConfig, *, resume: bool = False) -> Path:
    """Pre-train ``train.model`` on ``config.corpus``; returns the final model directory (``OUT/model``)."""
    train.validate()
    objective = ContrastivePretraining(config)
    out = Path(train.out)
    trainer = Trainer(train, objective=objective)  # the model and its settings (lengths...) checked first
    created, config_path = not out.exists(), out / "pretrain_config.json"
    had_config = config_path.exists()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(config_path, asdict(config))
    try:
        trainer.train(resume=resume)
    except TwoTowerError:  # refused (the corpus, a checkpoint): leave no run folder that looks started
        if not had_config and not (out / "train_log.json").exists():
            config_path.unlink(missing_ok=True)
            if created and not any(out.iterdir()):
                out.rmdir()
        raise
    return out / "model"


def check_chunks(chunks: list[Chunk], corpus, stage: StageConfig) -> None:
    """Refuse a corpus that gives one chunk (its two views are each other's only candidates: the loss is exactly 0
    and nothing is learned); warn where every chunk comes from one document (the negatives are its own passages)."""
    from twotower.errors import DataError

    docs = {c.doc_id for c in chunks}
    if len(chunks) < 2:
        raise DataError(corpus, f"{len(chunks)} chunk to pre-train on ({len(docs)} document): its two views are each "
                                "other's only candidates, so the loss is exactly 0 and nothing is learned",
                        hint=f"give a corpus of many documents (at least a batch, {stage.batch_size}; pre-training "
                             f"uses thousands), or shorter chunks ({flag('chunk_tokens')})")
    if len(docs) < 2:
        log.warning("%s: every one of the %d chunks comes from one document: the in-batch negatives are that "
                    "document's own passages; pre-training wants many documents (thousands)", corpus, len(chunks))
    elif len(chunks) < stage.batch_size:
        log.warning("%s: %d chunks, fewer than a batch (%d): every step sees the same few negatives", corpus,
                    len(chunks), stage.batch_size)
