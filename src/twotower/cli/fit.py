"""``twotower fit``: the best retriever for one data set (``tt.fit``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import DEVICE_HELP, LANGUAGE_HELP, RUNTIME_HELP, console, fail, warn
from twotower.cli.options import MatryoshkaWeights, Progress, Seed
from twotower.errors import TwoTowerError

_D = tt.FitRecipe()  # the recipe's defaults are the options' defaults


def register(app: typer.Typer) -> None:
    app.command("fit")(fit_cmd)


def fit_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR directory: corpus.jsonl, queries.jsonl, qrels/train.tsv "
                              "(qrels/test.tsv is never read)."),
    out: Path = typer.Option(..., "--out", help="Fit directory: model/ (the result), fit.json (recipe, every "
                             "stage's dev scores, the choices), stages/ (resumable work). Rerun to resume."),
    model: Optional[str] = typer.Option(None, "--model", help="Starting encoder, a name or directory "
                                        "(default all-MiniLM-L6-v2)."),
    split: str = typer.Option("train", help="qrels split to learn from (a seeded dev part of it is held out)."),
    dev_fraction: float = typer.Option(0.2, "--dev-fraction", help="Share of judged queries held out as dev."),
    min_dev: int = typer.Option(50, "--min-dev", min=1, help="At least this many dev queries (at most half)."),
    cv_below: int = typer.Option(_D.cv_below, "--cv-below", min=0, help="Below this many judged queries the choices "
                                 "are made by cross-validation (no dev split; the final model trains on all of them); "
                                 "0: never."),
    cv_folds: int = typer.Option(_D.cv_folds, "--cv-folds", min=2, help="Folds of that cross-validation."),
    epochs: float = typer.Option(_D.epochs, help="Fine-tuning epochs."),
    lr: float = typer.Option(_D.lr, help="Peak learning rate (both training rounds)."),
    batch_size: int = typer.Option(32, "--batch-size", min=2),
    train_passage: str = typer.Option(
        _D.train_passage, "--train-passage", help="Which passage of a positive or mined negative longer than the "
        "model's window both training rounds train on: first (its first window) | best (the passage the starting "
        "model scores highest for the query, split as an index splits it)."),
    mine: bool = typer.Option(True, "--mine/--no-mine", help="Mine negatives with the fine-tuned model and retrain."),
    mined_epochs: float = typer.Option(_D.mined_epochs, "--mined-epochs", help="Epochs of the retraining on mined negatives."),
    margins: Optional[str] = typer.Option(
        None, "--margins", help="Comma-separated relative margins the false-negative guard chooses from on dev "
        "(default 0,0.02,0.05,0.1,0.15,0.2,0.3; '0': skip only candidates scoring above the positive)."),
    matryoshka: Optional[str] = typer.Option(
        None, "--matryoshka", help="Matryoshka in both training rounds: the loss on each prefix of the embedding, "
        "e.g. 384,192,96,48, summed; the fitted model can be cut with 'index build --dim'."),
    matryoshka_weights: MatryoshkaWeights = None,
    refine: bool = typer.Option(_D.refine, "--refine/--no-refine", help="Train the chosen encoder once more on "
                                "its own top-ranked unjudged documents (kept only where it improves dev; a rerun "
                                "may add or drop it)."),
    reranker: bool = typer.Option(False, "--reranker/--no-reranker",
                                  help="Also train a cross-encoder re-ranker; kept only where it improves dev."),
    rerank_depth: int = typer.Option(100, "--rerank-depth", min=1),
    distill: bool = typer.Option(_D.distill, "--distill/--no-distill", help="With --reranker: distill its scores "
                                 "into the dual encoder (kept only where it improves dev)."),
    language: str = typer.Option(_D.language, "--language", help=LANGUAGE_HELP + " Stored with the model for "
                                 "its hybrid (default auto: detected from the documents)."),
    seed: Seed = 42,
    precision: str = typer.Option("auto", help="auto (bf16 where the CPU/GPU has fast bf16) | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
    cache_chunk: Optional[int] = typer.Option(None, "--cache-chunk", min=1, help="GradCache chunk size for both "
                                              "training rounds (memory bounded by it, the same loss); a rerun may "
                                              "change it."),
    progress: Progress = True,
) -> None:
    """Fine-tune, mine, retrain and tune the hybrid on held-out train queries: the best retriever for DATA.
    The model remembers its tuned retrieval: 'eval', 'index build', 'search' and 'serve' use it. Without train
    labels: BM25, dense or hybrid from the data's and the encoder's languages (a multilingual encoder across
    languages also gets its language directions removed)."""
    try:
        grid = tuple(float(x) for x in margins.split(",") if x.strip()) if margins else None
    except ValueError:
        fail(TwoTowerError(f"--margins {margins!r}: comma-separated numbers such as 0,0.05,0.1"))
    mrl = {}
    for key, text, kind, example in (("matryoshka", matryoshka, int, "384,192,96,48"),
                                     ("matryoshka_weights", matryoshka_weights, float, "1,1,2,2")):
        if text is not None:
            try:
                mrl[key] = tuple(kind(x) for x in text.split(","))
            except ValueError:
                fail(TwoTowerError(f"--{key.replace('_', '-')} {text!r}: comma-separated {kind.__name__} numbers "
                                    f"such as {example}"))
    try:
        if out.exists() and not out.is_dir():
            raise TwoTowerError(f"--out {out}: exists and is not a directory")
        result = tt.fit(data, out, **({"margins": grid} if grid else {}), **mrl, model=model, split=split,
                        dev_fraction=dev_fraction, min_dev=min_dev, seed=seed, language=language, epochs=epochs,
                        lr=lr, batch_size=batch_size, mine=mine, mined_epochs=mined_epochs, reranker=reranker,
                        rerank_depth=rerank_depth, cv_below=cv_below, cv_folds=cv_folds, train_passage=train_passage,
                        **({} if distill == _D.distill else {"distill": distill}),
                        **({} if refine == _D.refine else {"refine": refine}), precision=precision, device=device, runtime=runtime,
                        cache_chunk=cache_chunk, show_progress=progress)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    if result.message:
        warn(result.message)
    c = result.choices
    resumed = [s for s in result.report["stages"] if s not in result.computed]
    if resumed:
        console.print(f"resumed: {', '.join(resumed)} were already done")
    how = c["mode"] + (f" λ {c['lambda']}" + (f" ({c['norm']})" if c.get("norm") else "") if c["mode"] == "hybrid" else "")
    how += (", re-ranked" + (f" (weight {c['rerank_weight']})" if c.get("rerank_weight") not in (None, 1.0) else "")
            if c["rerank"] else "")
    dev = f" (dev {c['dev']})" if c.get("dev") else ""
    what = f"BM25 alone ({c['language']}), the encoder unused" if c["mode"] == "bm25" else f"{c['model'].replace('align', 'zero-shot, language-aligned')} encoder, {how}"
    console.print(f"model saved to {result.model}: {what}{dev}; details in {out / 'fit.json'}")
