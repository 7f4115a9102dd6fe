"""``twotower pretrain``: unsupervised contrastive pre-training on raw text (Contriever; ``tt.pretrain``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import DEVICE_HELP, fail
from twotower.cli.helpers import check_output_dir
from twotower.cli.options import CheckpointEvery, CheckpointMinutes, Progress, Resume, Seed, TensorBoard
from twotower.errors import TwoTowerError


def register(app: typer.Typer) -> None:
    app.command("pretrain")(pretrain_cmd)


def pretrain_cmd(
    corpus: Path = typer.Option(..., "--corpus", help="BEIR directory / corpus.jsonl, JSONL files with 'text', or "
                                                      "plain text (documents separated by blank lines)."),
    out: Path = typer.Option(..., "--out", help="Run directory: model/ (final), checkpoints/, train_log.json."),
    model: Optional[str] = typer.Option(None, help="Starting checkpoint (default all-MiniLM-L6-v2)."),
    augment: str = typer.Option("crop", help="crop (independent random cropping) | ict (inverse cloze task)"),
    chunk_tokens: int = typer.Option(256, "--chunk-tokens", min=2, help="Tokens per corpus chunk."),
    ratio_min: float = typer.Option(0.05, "--crop-min", help="Shortest crop, as a fraction of the chunk."),
    ratio_max: float = typer.Option(0.5, "--crop-max", help="Longest crop, as a fraction of the chunk."),
    ict_keep: Optional[float] = typer.Option(
        None, "--ict-keep", help="ICT: probability of keeping the sentence in the key (default 0.1)."),
    delete: float = typer.Option(0.1, "--delete", help="Token deletion probability (each view)."),
    replace: float = typer.Option(0.0, "--replace", help="Token replacement probability (each view)."),
    negatives: str = typer.Option("inbatch", help="inbatch | moco"),
    queue_size: Optional[int] = typer.Option(None, "--queue-size", min=1,
                                             help="MoCo: keys kept as negatives (default 131072)."),
    momentum: Optional[float] = typer.Option(None, "--momentum", help="MoCo: key encoder momentum m (default 0.9995)."),
    temperature: float = typer.Option(0.05, help="Softmax temperature."),
    steps: Optional[int] = typer.Option(None, help="Steps (default: one pass over the chunks)."),
    batch_size: int = typer.Option(64, "--batch-size", min=2),
    lr: float = typer.Option(2e-5, help="Peak learning rate (linear warm-up, then linear decay)."),
    warmup: float = typer.Option(0.1, help="Warm-up fraction of the steps."),
    cache_chunk: Optional[int] = typer.Option(None, "--cache-chunk", help="GradCache chunk size (bounded memory)."),
    bucket_size: Optional[int] = typer.Option(
        None, "--bucket-size", min=0,
        help="Texts per length bucket in a step's forward pass (less padding; 0: pad the whole batch). "
        "Default by device: 8 on CPU (1.18x faster steps), 0 on CUDA (3.5x faster there: README, GPU)."),
    limit_docs: Optional[int] = typer.Option(None, "--limit-docs", min=1, help="Read only the first N documents."),
    precision: str = typer.Option("auto", help="auto (bf16 autocast where fast) | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Max tokens per view (default: the model's)."),
    freeze_embeddings: bool = typer.Option(
        False, "--freeze-embeddings", help="Keep the token-embedding matrix out of the gradient and the optimizer "
        "(multilingual-e5-small: 82% of the parameters; as train --freeze-embeddings)."),
    checkpoint_every: CheckpointEvery = 100,
    checkpoint_minutes: CheckpointMinutes = None,
    resume: Resume = False,
    tensorboard: TensorBoard = False,
    seed: Seed = 42,
    progress: Progress = True,
) -> None:
    """Pre-train a dual encoder without labels: positive pairs are two views of the same text chunk."""
    try:
        check_output_dir(out, "--out")  # before any loading
        moco_given = [name for name, v in (("--queue-size", queue_size), ("--momentum", momentum)) if v is not None]
        if moco_given and negatives != "moco":
            raise TwoTowerError(f"{'/'.join(moco_given)} set the MoCo queue and key encoder, which --negatives "
                                f"{negatives} does not use: drop them or pass --negatives moco")
        if ict_keep is not None and augment != "ict":
            raise TwoTowerError(f"--ict-keep applies to --augment ict, not {augment}: drop it or pass --augment ict")
        views = tt.ViewConfig(augment=augment, chunk_tokens=chunk_tokens, ratio_min=ratio_min, ratio_max=ratio_max,
                           delete=delete, replace=replace, **({} if ict_keep is None else {"ict_keep": ict_keep}))
        moco = {k: v for k, v in (("queue_size", queue_size), ("momentum", momentum)) if v is not None}
        pre = tt.PretrainConfig(corpus=str(corpus), views=views, negatives=negatives, limit_docs=limit_docs, **moco)
        stage = tt.StageConfig(name="pretrain", epochs=None if steps else 1.0, steps=steps, batch_size=batch_size,
                            lr=lr, warmup=warmup, temperature=temperature, cache_chunk=cache_chunk,
                            bucket_size=bucket_size)
        cfg = tt.TrainConfig(out=str(out), model=model, precision=precision, device=device, doc_max_length=max_length,
                          query_max_length=max_length, seed=seed, checkpoint_every=checkpoint_every,
                          checkpoint_minutes=checkpoint_minutes,
                          tensorboard=tensorboard, show_progress=progress, stages=[stage],
                          freeze_embeddings=freeze_embeddings)
        result = tt.pretrain(cfg, pre, resume=resume)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    print(f"model saved to {result}")
