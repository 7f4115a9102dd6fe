"""Training commands: ``twotower train`` (a dual encoder), ``twotower mine`` (hard negatives) and
``twotower train-reranker`` (a cross-encoder)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import DEVICE_HELP, LANGUAGE_HELP, RUNTIME_HELP, console, fail
from twotower.cli.helpers import check_output_dir, check_outputs
from twotower.cli.options import (CheckpointEvery, CheckpointMinutes, MatryoshkaWeights, Progress, Resume, Seed,
                                  TensorBoard)
from twotower.errors import TwoTowerError


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("mine")(mine_cmd)
    app.command("train-reranker")(train_reranker_cmd)


def train_cmd(
    ctx: typer.Context,
    out: Path = typer.Option(
        ..., "--out", help="Run directory: train_config.json, checkpoints/ (every --checkpoint-every steps), "
        "model/ (final), train_log.json; the README lists the rest."),
    data: Optional[Path] = typer.Option(None, "--data", help="BEIR directory whose judged pairs are the training data."),
    split: str = typer.Option("train", help="qrels split to train on."),
    pairs: Optional[Path] = typer.Option(None, help="Or a JSONL pairs file {query, positive, negatives}."),
    model: Optional[str] = typer.Option(None, help="Starting checkpoint (default all-MiniLM-L6-v2)."),
    towers: str = typer.Option("sde", help="sde | ade | ade-ste | ade-fte | ade-spl"),
    dim: Optional[int] = typer.Option(None, help="Projection bottleneck size (none: keep the backbone's)."),
    layer_norm: bool = typer.Option(False, "--layer-norm", help="Layer-normalise the projection output."),
    similarity: str = typer.Option("cosine", help="cosine | dot"),
    temperature: float = typer.Option(0.05, help="Softmax temperature (GTR: 0.01; MiniLM was trained at 0.05)."),
    batch_size: int = typer.Option(32, "--batch-size", min=2),
    cache_chunk: Optional[int] = typer.Option(None, "--cache-chunk", help="GradCache chunk size (bounded memory)."),
    bucket_size: Optional[int] = typer.Option(
        None, "--bucket-size", min=0,
        help="Texts per length bucket in a step's forward pass (less padding; 0: pad the whole batch). "
        "Default by device: 8 on CPU (1.18x faster steps), 0 on CUDA (3.5x faster there: README, GPU)."),
    multivector: Optional[int] = typer.Option(
        None, "--multivector", min=1,
        help="ME-BERT: train the max score over each document's first M token vectors (M=1: [CLS] alone); "
        "saved with the model as the default of 'eval --retriever multivector'. Not with --cache-chunk."),
    matryoshka: Optional[str] = typer.Option(
        None, "--matryoshka", help="Matryoshka: the loss on each prefix of the embedding, e.g. 384,192,96,48, summed "
        "(cut the vectors later with 'index build --dim D')."),
    matryoshka_weights: MatryoshkaWeights = None,
    hard_negatives: str = typer.Option("none", "--hard-negatives", help="none | bm25 | model (train, mine with it, retrain)"),
    num_negatives: int = typer.Option(1, "--num-negatives", min=1, help="Hard negatives per query in the loss."),
    rank_from: int = typer.Option(3, "--rank-from", min=1, help="With --hard-negatives: sample them from ranks a..b "
                                  "(1-based) of each query's ranking."),
    rank_to: int = typer.Option(50, "--rank-to", min=1),
    epochs: Optional[float] = typer.Option(None, help="Epochs (default 1 when --steps is not given)."),
    steps: Optional[int] = typer.Option(None, help="Steps, instead of epochs."),
    lr: float = typer.Option(2e-5, help="Peak learning rate."),
    optimizer: str = typer.Option("adamw", help="adamw | adafactor"),
    precision: str = typer.Option("auto", help="auto (bf16 autocast where fast) | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    attention_dropout: Optional[float] = typer.Option(
        None, "--attention-dropout",
        help="Dropout on attention probabilities while training (default: the model's own, 0.1 for MiniLM). "
        "0 lets attention run fused: 1.5x faster fine-tuning on CPU (BERT-family backbones)."),
    freeze_embeddings: bool = typer.Option(
        False, "--freeze-embeddings",
        help="Keep the token-embedding matrix fixed: no gradient or optimizer state for it (a 250k-token "
        "vocabulary is 82% of multilingual-e5-small's parameters)."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Document max tokens (default: the model's)."),
    train_passage: Optional[str] = typer.Option(
        None, "--train-passage", help="Which passage of a positive or hard negative longer than --max-length to train "
        "on: first (its first window) | best (the passage the starting model scores highest for the query, split as "
        "an index splits it; the default). docs/guides/long-documents.md"),
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length"),
    config: Optional[Path] = typer.Option(None, help="A TOML file with [[stage]] tables (multi-stage runs)."),
    checkpoint_every: CheckpointEvery = 100,
    checkpoint_minutes: CheckpointMinutes = None,
    resume: Resume = False,
    tensorboard: TensorBoard = False,
    seed: Seed = 42,
    progress: Progress = True,
) -> None:
    """Train a dual encoder (GTR-style in-batch softmax, optional hard negatives)."""
    try:
        mrl = _number_list(matryoshka, int, "--matryoshka")
        mrl_weights = _number_list(matryoshka_weights, float, "--matryoshka-weights")
    except TwoTowerError as exc:
        fail(exc)
    common = dict(out=str(out), model=model, towers=towers, dim=dim, layer_norm=layer_norm, similarity=similarity,
                  precision=precision, device=device, doc_max_length=max_length, query_max_length=query_max_length,
                  seed=seed, checkpoint_every=checkpoint_every, checkpoint_minutes=checkpoint_minutes,
                  tensorboard=tensorboard, show_progress=progress,
                  multivector=multivector, attention_dropout=attention_dropout,
                  freeze_embeddings=freeze_embeddings or None, matryoshka=mrl, matryoshka_weights=mrl_weights,
                  train_passage=train_passage)
    try:
        check_output_dir(out, "--out")  # before any loading
        if config is not None:
            train_config = config
            overrides = _given_on_the_command_line(ctx, common)  # a default must not override the file's value
        else:
            if data is None and pairs is None:
                raise TwoTowerError("give --data (a BEIR directory), --pairs (a JSONL file) or --config (stages TOML)")
            stage = tt.StageConfig(
                name="finetune", data=str(data) if data else None, split=split, pairs=str(pairs) if pairs else None,
                epochs=epochs if epochs is not None else (None if steps else 1.0), steps=steps,
                batch_size=batch_size, lr=lr, temperature=temperature, optimizer=optimizer, cache_chunk=cache_chunk,
                bucket_size=bucket_size,
            )
            train_config = tt.TrainConfig(stages=[stage], **{**common, "freeze_embeddings": freeze_embeddings})
            overrides = {}
        result = tt.train(train_config, hard_negatives=hard_negatives, num_negatives=num_negatives,
                          rank_from=rank_from, rank_to=rank_to, data=data, split=split, resume=resume, **overrides)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    print(f"model saved to {result}")


# TrainConfig field -> the train option that sets it, where the names differ
_OPTION_OF = {"doc_max_length": "max_length", "show_progress": "progress"}
# options that set a stage, which a --config file's [[stage]] tables set instead
_STAGE_OPTIONS = ("epochs", "steps", "lr", "batch_size", "temperature", "optimizer", "cache_chunk", "bucket_size",
                  "pairs")


def _given_on_the_command_line(ctx: typer.Context, common: dict) -> dict:
    """The run settings of ``common`` the user typed (``--out`` always): with ``--config`` only these override the
    file, never an option's default (``--seed``'s 42 replaced the file's ``seed = 7``). A stage option typed with
    ``--config`` is refused: the file's [[stage]] tables set those."""
    def typed(name: str) -> bool:
        source = ctx.get_parameter_source(name)
        return source is not None and source.name != "DEFAULT"  # typed, or from the environment

    stage_given = [name for name in _STAGE_OPTIONS if typed(name)]
    if stage_given:
        flags = ", ".join("--" + name.replace("_", "-") for name in stage_given)
        raise TwoTowerError(f"{flags} set a stage, and --config's [[stage]] tables set the stages: put them in the "
                            "file's [[stage]] tables, or train without --config")
    return {k: v for k, v in common.items() if k == "out" or (v is not None and typed(_OPTION_OF.get(k, k)))}


def _number_list(text: str | None, kind: type, option: str) -> list | None:
    """``"384,192,96"`` as ``[384, 192, 96]``; a TwoTowerError naming ``option`` for anything else."""
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",")]
    except ValueError:
        raise TwoTowerError(f"{option} {text!r}: give comma-separated {kind.__name__} numbers, e.g. "
                            f"{'384,192,96,48' if kind is int else '1,1,0.5,0.5'}") from None


def mine_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR directory."),
    out: Path = typer.Option(..., "--out", help="Pairs JSONL to write (query, positive, negatives)."),
    split: str = typer.Option("train"),
    retriever: str = typer.Option("bm25", help="bm25 | model"),
    language: str = typer.Option("en", "--language", help=LANGUAGE_HELP),
    model: Optional[str] = typer.Option(None, help="Model for --retriever model (default all-MiniLM-L6-v2)."),
    num_negatives: int = typer.Option(4, "--num-negatives", min=1),
    rank_from: int = typer.Option(3, "--rank-from", min=1, help="Sample negatives from ranks a..b (1-based)."),
    rank_to: int = typer.Option(50, "--rank-to", min=1),
    seed: Seed = 0,
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
    progress: bool = typer.Option(True),
) -> None:
    """Mine hard negatives for a BEIR split and write a pairs file for 'twotower train --pairs'."""
    try:
        check_outputs(("--out", out), data=data)  # before any loading
        n = tt.mine(data, out, split=split, retriever=retriever, model=model, num_negatives=num_negatives,
                    rank_from=rank_from, rank_to=rank_to, seed=seed, show_progress=progress, device=device,
                    language=language, runtime=runtime)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    print(f"wrote {n} examples to {out}")


def train_reranker_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR directory with qrels/<split>.tsv."),
    out: Path = typer.Option(..., "--out", help="Where to save the cross-encoder."),
    base: Optional[str] = typer.Option(None, help="Backbone (default: all-MiniLM-L6-v2)."),
    split: str = typer.Option("train", help="qrels split to train on (never test)."),
    negatives: int = typer.Option(3, min=1, help="BM25-mined negatives per positive."),
    mine_depth: int = typer.Option(30, "--mine-depth", min=2, help="BM25 depth mined for negatives."),
    epochs: int = typer.Option(4, min=1, help="Passes over the groups (SciFact: 1 epoch at 3e-5 stays at chance "
                                               "loss; 4 at 1e-4 learns: README, Fit)."),
    batch_queries: int = typer.Option(8, "--batch-queries", min=1, help="(query, positive) groups per step."),
    lr: float = typer.Option(1e-4),
    max_length: int = typer.Option(192, "--max-length", min=16),
    max_queries: Optional[int] = typer.Option(None, "--max-queries", min=1, help="Train on at most this many groups."),
    precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    seed: Seed = 0,
    progress: Progress = True,
) -> None:
    """Train a cross-encoder re-ranker: judged positives vs BM25-mined negatives, softmax over each group."""
    try:
        cfg = tt.RerankerTrainConfig(negatives=negatives, mine_depth=mine_depth, epochs=epochs,
                                  batch_queries=batch_queries, lr=lr, max_length=max_length, precision=precision,
                                  seed=seed, max_queries=max_queries, show_progress=progress, device=device)
        check_output_dir(out, "--out", replaced=True)  # before any loading or training
        stats = tt.train_reranker(data, out, base=base, split=split, config=cfg)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    console.print(f"{out}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
