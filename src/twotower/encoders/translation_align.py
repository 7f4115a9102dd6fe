"""Cross-lingual alignment from translation pairs, without relevance labels (mContriever's second stage, as a
linear map on a frozen multilingual encoder).

Given pairs of texts that translate each other (``a_i``, ``b_i``), a multilingual encoder's vectors ``x_i``, ``y_i``
are close but not closest: each language keeps its own region, so a question ranks sentences of its own language
above the answer in another one. A linear map ``W`` (dimension × dimension, started at the identity) is fitted so
that each text's translation is its nearest neighbour among the batch's texts in the other column — the
translation-ranking loss (symmetric InfoNCE over the batch, temperature ``τ``):

    L(W) = ½·mean_i[ CE(softmax_j(cos(Wx_i, Wy_j)/τ), i) + CE(softmax_j(cos(Wx_j, Wy_i)/τ), i) ] + ρ·‖W − I‖²_F / d

with pairs of one ``group`` (the same text in several pairs, e.g. an English pivot with its ten translations) left
out of each other's negatives, and ``ρ`` keeping ``W`` near the identity (the map is fitted on translations only;
questions and answers of one language should keep their geometry). The map is stored as the towers' projection
(composed with any projection the model has, as ``align-languages`` does), so every path that encodes applies it
to queries and documents alike, with no language detection.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from twotower.checks import flag, given
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)


@dataclass
class MapConfig:
    steps: int = 300
    batch_size: int = 512
    lr: float = 1e-3
    temperature: float = 0.05
    reg: float = 1.0  # ρ: weight of ‖W − I‖²_F / d
    seed: int = 0

    def validate(self) -> None:
        from twotower.checks import check_number

        check_number(self.steps, "steps", integer=True, minimum=1)
        check_number(self.batch_size, "batch_size", integer=True, minimum=2)
        check_number(self.lr, "lr", minimum=0)
        check_number(self.temperature, "temperature", minimum=1e-6)
        check_number(self.reg, "reg", minimum=0)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def translation_loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, temperature: float, reg: float = 0.0,
                     groups: torch.Tensor | None = None) -> torch.Tensor:
    """The loss above for one batch of pairs (rows of ``x`` and ``y``); ``groups[i] == groups[j]`` (i ≠ j) masks
    pair j out of pair i's negatives."""
    sim = _unit(x @ w.T) @ _unit(y @ w.T).T / temperature
    if groups is not None:
        same = (groups[:, None] == groups[None, :]) & ~torch.eye(len(groups), dtype=torch.bool, device=sim.device)
        sim = sim.masked_fill(same, float("-inf"))
    target = torch.arange(len(x), device=sim.device)
    loss = 0.5 * (torch.nn.functional.cross_entropy(sim, target) + torch.nn.functional.cross_entropy(sim.T, target))
    eye = torch.eye(w.shape[0], dtype=w.dtype, device=w.device)
    return loss + reg * ((w - eye) ** 2).sum() / w.shape[0]


def fit_translation_map(x: np.ndarray, y: np.ndarray, groups: Sequence[int] | None = None,
                        config: MapConfig | None = None, init: np.ndarray | None = None) -> tuple[np.ndarray, list]:
    """``(W, losses)``: the map fitted by Adam on seeded batches of the pairs (``x[i]``, ``y[i]``); ``init``: the
    map to start from (default the identity; the regulariser always pulls towards the identity)."""
    config = config or MapConfig()
    config.validate()
    if x.shape != y.shape or x.ndim != 2 or len(x) < 2:
        raise TwoTowerError(f"translation pairs: two (n, dim) arrays of equal shape and n ≥ 2 needed, got {x.shape} "
                            f"and {y.shape}")
    gen = torch.Generator().manual_seed(config.seed)
    xt, yt = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    gt = torch.as_tensor(np.arange(len(x)) if groups is None else np.asarray(groups), dtype=torch.long)
    dim = x.shape[1]
    w = torch.nn.Parameter(torch.eye(dim) if init is None else torch.as_tensor(init, dtype=torch.float32).clone())
    opt = torch.optim.Adam([w], lr=config.lr)
    losses = []
    batch = min(config.batch_size, len(x))
    for _ in range(config.steps):
        idx = torch.randperm(len(x), generator=gen)[:batch]
        loss = translation_loss(w, xt[idx], yt[idx], config.temperature, config.reg, gt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(float(loss.detach()), 5))
    return w.detach().numpy().astype(np.float32), losses


def mutual_nearest_pairs(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int]]:
    """``(i, j)`` where ``b[j]`` is ``a[i]``'s nearest row by inner product and ``a[i]`` is ``b[j]``'s: sentence
    alignment of two texts known to translate each other (bitext mining, no labels)."""
    if len(a) == 0 or len(b) == 0:
        return []
    sim = a @ b.T
    best_b, best_a = sim.argmax(1), sim.argmax(0)
    return [(i, int(j)) for i, j in enumerate(best_b) if best_a[j] == i]


def read_pairs(path: str | Path) -> tuple[list[str], list[str]]:
    """A TSV of translation pairs: one pair a line, the two texts separated by a tab (no header)."""
    path = Path(path)
    if not path.is_file():
        raise TwoTowerError(f"{given('pairs', path)}: not a file (a TSV: text, tab, its translation, one pair a line)")
    a, b = [], []
    with path.open(encoding="utf-8", newline="") as fh:
        for n, row in enumerate(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) != 2 or not row[0].strip() or not row[1].strip():
                raise TwoTowerError(f"{path}:{n}: expected two non-empty texts separated by one tab")
            a.append(row[0].strip())
            b.append(row[1].strip())
    if len(a) < 2:
        raise TwoTowerError(f"{path}: {len(a)} translation pair(s); at least 2 needed (hundreds to thousands help)")
    return a, b


def text_groups(a: Sequence[str], b: Sequence[str]) -> list[int]:
    """Pair i's group: the connected component of texts shared between pairs (union-find over the texts)."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        parent.setdefault(t, t)
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for s, t in zip(a, b):
        parent[find(s)] = find(t)
    roots: dict[str, int] = {}
    return [roots.setdefault(find(s), len(roots)) for s in a]


def align_translations(model: str | None, pairs: str | Path, out: str | Path, *, config: MapConfig | None = None,
                       opts=None) -> dict:
    """Write ``model`` with a translation map fitted on ``pairs`` (a TSV) composed into its towers to ``out`` (a new
    or empty folder), and ``out/translation_map.json`` (pairs, settings, losses); returns the report."""
    from twotower.encoders.language_bias import compose_linear
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.io import atomic_write_json, check_output_dir

    config = config or MapConfig()
    config.validate()
    out = Path(out)
    check_output_dir(out, flag("out"))
    if out.is_dir() and any(out.iterdir()):
        raise TwoTowerError(f"{given('out', out)}: exists and is not an empty folder; give a new one")
    a, b = read_pairs(pairs)
    encoder = DualEncoder.load(model)
    texts = sorted(set(a) | set(b))
    row = {t: i for i, t in enumerate(texts)}
    vecs = encoder.encode_documents(texts, opts or EncodeOptions())
    x, y = vecs[[row[t] for t in a]], vecs[[row[t] for t in b]]
    w, losses = fit_translation_map(x, y, text_groups(a, b), config)
    compose_linear(encoder, w)
    encoder.save(out)
    report = {"model": model or "all-MiniLM-L6-v2", "pairs": str(pairs), "n_pairs": len(a), "texts": len(texts),
              **asdict(config), "first_loss": losses[0], "last_loss": losses[-1],
              "distance_from_identity": round(float(np.linalg.norm(w - np.eye(len(w)))), 5)}
    atomic_write_json(out / "translation_map.json", report)
    return report
