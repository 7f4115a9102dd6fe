"""What a stage's optimizer updates and how: the trainable parameters in two groups, weight decay on the weight
matrices and none on biases and norms (each shared parameter once); AdamW (one fused kernel on a GPU) or Adafactor at
the stage's rate; and, on request, the backbones' token embeddings frozen so that the optimizer holds no state for
them.

Example::

    frozen = freeze_token_embeddings(model)  # TrainConfig(freeze_embeddings=True)
    optimizer = make_optimizer(model, StageConfig(name="finetune", lr=2e-5, optimizer="adamw"))
"""

from __future__ import annotations

import torch

from twotower.checks import switch
from twotower.encoders.towers import DualEncoder
from twotower.errors import TwoTowerError
from twotower.training.config import OPTIMIZERS, StageConfig


def make_optimizer(model: torch.nn.Module, stage: StageConfig) -> torch.optim.Optimizer:
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": stage.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if stage.optimizer == "adamw":
        # on a GPU one fused kernel updates every parameter (a small model's step is bound by kernel launches)
        fused = all(p.is_cuda and p.is_floating_point() for g in groups for p in g["params"]) or None
        return torch.optim.AdamW(groups, lr=stage.lr, fused=fused)
    if stage.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(groups, lr=stage.lr, scale_parameter=False, relative_step=False, warmup_init=False)
    raise TwoTowerError(f"unknown optimizer '{stage.optimizer}': choose one of {', '.join(OPTIMIZERS)}")


def freeze_token_embeddings(model: DualEncoder) -> int:
    """Stop gradients to each backbone's token-embedding matrix (``TrainConfig.freeze_embeddings``); the
    optimizer then holds no state for it. Returns the number of parameters frozen."""
    frozen = 0
    for backbone in {id(t.backbone): t.backbone for t in (model.query_tower, model.doc_tower)}.values():
        try:
            weight = backbone.get_input_embeddings().weight
        except (AttributeError, NotImplementedError):
            raise TwoTowerError(f"{switch('freeze_embeddings')}: the backbone {type(backbone).__name__} has no "
                                "token-embedding matrix to freeze; train without the option") from None
        weight.requires_grad_(False)
        frozen += weight.numel()
    return frozen
