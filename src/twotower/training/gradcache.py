"""Gradient caching (Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup").

A large contrastive batch is trained in three passes with memory bounded by one chunk:
1. embed every chunk without an autograd graph, remembering each chunk's RNG state;
2. compute the loss on the cached embeddings and backpropagate it to them only;
3. re-embed chunk by chunk *with* a graph, replaying the RNG state (so dropout masks match),
   and backpropagate the cached embedding gradients into the parameters.
The parameter gradients equal those of the plain full-batch step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch

EmbedFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The random state dropout draws from on ``device``: the CPU generator's, and the GPU's where it runs on one."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@contextmanager
def _replay_rng(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device):
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        _set_rng_state(state, device)
        yield


def _chunks(ids: torch.Tensor, mask: torch.Tensor, size: int):
    for start in range(0, len(ids), size):
        yield ids[start : start + size], mask[start : start + size]


def cached_backward(
    inputs: Sequence[tuple[EmbedFn, torch.Tensor, torch.Tensor]],
    loss_fn: Callable[..., torch.Tensor],
    chunk_size: int,
    autocast=None,
) -> torch.Tensor:
    """Run a GradCache step. ``inputs`` lists ``(embed_fn, input_ids, attention_mask)`` groups
    (e.g. queries, positives, hard negatives); ``loss_fn`` takes their embeddings in that order.
    Gradients are accumulated into the parameters; the (detached) loss is returned."""
    from contextlib import nullcontext

    autocast = autocast or nullcontext
    cached: list[torch.Tensor] = []
    states: list[list[tuple]] = []
    device = inputs[0][1].device
    with torch.no_grad():
        for fn, ids, mask in inputs:
            parts, group_states = [], []
            for c_ids, c_mask in _chunks(ids, mask, chunk_size):
                group_states.append(_rng_state(device))
                with autocast():
                    parts.append(fn(c_ids, c_mask).float())
            cached.append(torch.cat(parts) if parts else torch.empty(0, device=device))
            states.append(group_states)
    leaves = [c.detach().requires_grad_() for c in cached]
    loss = loss_fn(*leaves)
    loss.backward()
    end_state = _rng_state(device)
    for (fn, ids, mask), leaf, group_states in zip(inputs, leaves, states):
        for (c_ids, c_mask), state, start in zip(_chunks(ids, mask, chunk_size), group_states,
                                                 range(0, len(ids), chunk_size)):
            with _replay_rng(state, device), autocast():
                emb = fn(c_ids, c_mask).float()
            emb.backward(gradient=leaf.grad[start : start + len(c_ids)])
    _set_rng_state(end_state, device)
    return loss.detach()
