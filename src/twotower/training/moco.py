"""MoCo (He et al.; Contriever §3.2): a FIFO queue of keys and a momentum key encoder.

The key encoder is a copy of the query encoder that receives no gradient and follows it by an
exponential moving average, ``θk ← m·θk + (1 − m)·θq``, so the keys in the queue change slowly
and can serve as negatives for many steps. The loss is ``twotower.training.losses.moco_loss``:
InfoNCE of each query against its key, the other keys of the batch and the queue.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from twotower.checks import flag


class KeyQueue:
    """A fixed-size FIFO ring buffer of key embeddings: pushing past ``size`` overwrites the oldest."""

    def __init__(self, size: int, dim: int, device: torch.device | str = "cpu") -> None:
        if size < 1:
            raise ValueError(f"queue size must be ≥ 1, got {size}")
        self.size = size
        self.keys = torch.zeros((size, dim), dtype=torch.float32, device=device)
        self.ptr = 0  # the next row written
        self.count = 0  # rows filled so far (≤ size)

    def __len__(self) -> int:
        return self.count

    @torch.no_grad()
    def push(self, keys: torch.Tensor) -> None:
        """Append ``keys`` (n, dim), oldest first; when ``n > size`` only the newest ``size`` stay."""
        keys = keys.detach().float()[-self.size :]
        n = len(keys)
        first = min(n, self.size - self.ptr)
        self.keys[self.ptr : self.ptr + first] = keys[:first]
        self.keys[: n - first] = keys[first:]
        self.ptr = (self.ptr + n) % self.size
        self.count = min(self.size, self.count + n)

    def contents(self) -> torch.Tensor:
        """The stored keys, oldest first."""
        if self.count < self.size:
            return self.keys[: self.count]
        return torch.cat([self.keys[self.ptr :], self.keys[: self.ptr]])

    def negatives(self) -> torch.Tensor:
        """The stored keys in storage order (what the loss needs: order does not matter there)."""
        return self.keys[: self.count]

    def state_dict(self) -> dict:
        return {"keys": self.keys[: self.count].clone(), "ptr": torch.tensor(self.ptr),
                "count": torch.tensor(self.count), "size": torch.tensor(self.size)}

    def load_state_dict(self, state: dict) -> None:
        size, count = int(state["size"]), int(state["count"])
        if size != self.size or state["keys"].shape[1] != self.keys.shape[1]:
            raise ValueError(f"checkpoint queue is {size}×{state['keys'].shape[1]}, this run's is "
                             f"{self.size}×{self.keys.shape[1]}: resume with the same "
                             f"{flag('queue_size')} and model")
        self.keys.zero_()
        self.keys[:count] = state["keys"].to(self.keys.device)
        self.ptr, self.count = int(state["ptr"]), count


def momentum_copy(encoder: nn.Module) -> nn.Module:
    """A frozen copy of ``encoder`` to serve as the key encoder."""
    import copy

    key = copy.deepcopy(encoder)
    for p in key.parameters():
        p.requires_grad_(False)
    return key


@torch.no_grad()
def momentum_update(key: nn.Module, query: nn.Module, m: float) -> None:
    """``θk ← m·θk + (1 − m)·θq`` for every parameter (matched by name); buffers are copied."""
    if not 0 <= m <= 1:
        raise ValueError(f"momentum must lie in [0, 1], got {m}")
    q_params = dict(query.named_parameters())
    for name, pk in key.named_parameters():
        pk.mul_(m).add_(q_params[name].detach().to(pk.dtype), alpha=1 - m)
    q_buffers = dict(query.named_buffers())
    for name, bk in key.named_buffers():
        bk.copy_(q_buffers[name])


@torch.no_grad()
def gather_keys(keys: torch.Tensor) -> torch.Tensor:
    """All processes' keys (no gradient), concatenated in rank order, so every queue is the same."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return keys
    parts = [torch.empty_like(keys) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, keys.contiguous())
    return torch.cat(parts)
