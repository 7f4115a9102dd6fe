"""Training recipes on top of the trainer: mining to a pairs file, and "train → mine with the
model → retrain" (one ANCE / Contriever-style iteration)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from twotower.data.beir import BeirDataset
from twotower.data.pairs import pairs_from_beir, save_pairs
from twotower.checks import check_number, flag, given
from twotower.errors import TwoTowerError
from twotower.training.mining import add_hard_negatives, retrieve_for_mining
from twotower.training.trainer import Trainer, TrainConfig

log = logging.getLogger(__name__)

HARD_NEGATIVE_SOURCES = ("none", "bm25", "model")


def check_rank_range(rank_range: tuple[int, int]) -> None:
    """The ranks ``rank_from``..``rank_to`` mined negatives are sampled from: whole numbers from 1, in order; a
    message naming them otherwise, before any data is read."""
    lo, hi = rank_range
    check_number(lo, "rank_from", integer=True, minimum=1)
    check_number(hi, "rank_to", integer=True, minimum=1)
    if lo > hi:
        raise TwoTowerError(f"{given('rank_from', lo)} is past {given('rank_to', hi)}: negatives are sampled from ranks "
                            f"{flag('rank_from')}..{flag('rank_to')}; give a range that starts no later than it ends")


def mine_pairs(data, split, out, *, retriever="bm25", model=None, num_negatives=4, rank_range=(3, 50), seed=0,
               show_progress=True, precision="auto", device="auto", language="en") -> int:
    """Write ``out``: the split's judged pairs, each with negatives mined by ``retriever`` (BM25: in ``language``)."""
    from twotower.encoders.device import resolve_device
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.analyzers import check_language

    check_rank_range(rank_range)
    check_language(language)
    if retriever == "bm25" and model is not None:
        raise TwoTowerError(f"{given('model', model)} is not used by {given('retriever', 'bm25')} (BM25 has no "
                            f"model): pass {given('retriever', 'model')} to mine with it, or drop {flag('model')}")
    target = resolve_device(device)  # a bad --device or --language stops before the data is read
    ds = BeirDataset.load(data, split)
    pairs = pairs_from_beir(ds)  # no pairs is an error: find out before retrieving
    encoder = None
    if retriever == "model":
        encoder = model if isinstance(model, DualEncoder) else DualEncoder.load(model, device=target)
    ranked = retrieve_for_mining(ds, retriever, model=encoder, depth=rank_range[1], precision=precision,
                                 show_progress=show_progress, language=language)
    examples = add_hard_negatives(pairs, ds, ranked, num_negatives=num_negatives,
                                  rank_range=rank_range, seed=seed)
    save_pairs(examples, out)
    return len(examples)


@dataclass
class TrainRequest:
    config: TrainConfig
    hard_negatives: str = "none"
    num_negatives: int = 1
    data: Path | None = None
    split: str = "train"
    mined_per_query: int = 8
    rank_range: tuple[int, int] = (3, 50)


def _with_mined(cfg: TrainConfig, out: Path, pairs: Path, num_negatives: int, model: str | None) -> TrainConfig:
    stages = [replace(s, pairs=str(pairs), data=None, hard_negatives=num_negatives) for s in cfg.stages]
    return replace(cfg, out=str(out), stages=stages, model=model if model is not None else cfg.model)


def _documents(req: TrainRequest, cfg: TrainConfig):
    """The corpus mined pairs come from, where training chooses passages (their titles kept in front)."""
    from twotower.training.passage_choice import resolve_choice

    if req.data is None or resolve_choice(cfg.train_passage) == "first":
        return None
    return BeirDataset.load(req.data, req.split).corpus


def run_training(req: TrainRequest, *, resume: bool = False) -> Path:
    """Run the request; returns the final model directory."""
    cfg = req.config
    cfg.validate()  # before any mining or loading
    out = Path(cfg.out)
    if req.hard_negatives not in HARD_NEGATIVE_SOURCES:
        raise TwoTowerError(f"unknown {given('hard_negatives', req.hard_negatives)}: choose one of "
                            f"{', '.join(HARD_NEGATIVE_SOURCES)}")
    if cfg.multivector is not None and req.hard_negatives == "model":
        raise TwoTowerError(f"{given('hard_negatives', 'model')} mines with the pooled single-vector retriever, not "
                            f"the max score that {flag('multivector')} trains; use {flag('hard_negatives')} bm25 or "
                            f"none with {flag('multivector')}")

    check_number(req.num_negatives, "num_negatives", integer=True, minimum=1)
    check_rank_range(req.rank_range)  # before round 1 trains, not when its miner starts
    lo, hi = req.rank_range
    if req.hard_negatives == "none" and req.rank_range != TrainRequest.rank_range:  # nothing is mined from them
        raise TwoTowerError(f"{given('rank_from', lo)}..{given('rank_to', hi)} set the ranks mined negatives are drawn "
                            f"from, and {given('hard_negatives', 'none')} mines none: drop them or mine (bm25 | model)")
    if req.hard_negatives == "none" and req.num_negatives != 1:  # no mined negatives: the count would go unused
        raise TwoTowerError(f"{given('num_negatives', req.num_negatives)} sets how many mined negatives each query "
                            f"gets, and {given('hard_negatives', 'none')} mines none: drop it or mine (bm25 | model)")
    if req.hard_negatives == "none":
        Trainer(cfg).train(resume=resume)
        return out / "model"
    if req.data is None:
        raise TwoTowerError(f"{flag('hard_negatives')} needs {flag('data')} (the BEIR directory to mine from)")
    show = cfg.show_progress
    documents = _documents(req, cfg)
    if req.hard_negatives == "bm25":
        pairs = out / "mined-bm25.jsonl"
        if not pairs.is_file():
            mine_pairs(req.data, req.split, pairs, retriever="bm25", num_negatives=req.mined_per_query,
                       rank_range=req.rank_range, show_progress=show)
        Trainer(_with_mined(cfg, out, pairs, req.num_negatives, None), documents=documents).train(resume=resume)
        return out / "model"
    # model: round 1 without negatives, mine with the round-1 model, round 2 continues from it
    round1 = out / "round1"
    if not (round1 / "model" / "twotower.json").is_file():
        Trainer(replace(cfg, out=str(round1))).train(resume=resume)
    pairs = out / "mined-model.jsonl"
    if not pairs.is_file():
        mine_pairs(req.data, req.split, pairs, retriever="model", model=str(round1 / "model"),
                   num_negatives=req.mined_per_query, rank_range=req.rank_range, show_progress=show,
                   precision=cfg.precision, device=cfg.device)
    Trainer(_with_mined(cfg, out, pairs, req.num_negatives, str(round1 / "model")),
            documents=documents).train(resume=resume)
    return out / "model"
