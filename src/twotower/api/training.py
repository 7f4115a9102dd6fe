"""Training: ``fit`` (the best retriever for a data set in one call), ``train``, ``pretrain``, ``mine`` and
``train_reranker``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from twotower.api._errors import user_errors
from twotower.errors import TwoTowerError
from twotower.training.fit.recipe import FitRecipe

__all__ = ["FitRecipe", "FitResult", "fit", "mine", "pretrain", "train", "train_reranker"]


@dataclass
class FitResult:
    """What :func:`fit` made: ``model`` (the directory to load, index or evaluate), ``choices`` (encoder, mode, λ,
    normalisation, re-ranker, BM25 language, dev score), ``stages`` (each stage's dev scores and wall time),
    ``report`` (all of ``OUT/fit.json``), the stages ``computed`` by this call (the rest were resumed) and a
    ``message`` for the user where fit had to do without labels. It stands for its model wherever a model's path
    is taken (``os.fspath(result)`` is ``result.model``): ``tt.Encoder.load(result)``, ``tt.evaluate(result, ds)``,
    ``tt.Index.build(path, docs, encoder=result)``.

    Example::

        result = tt.fit("my-beir-dir", "fitted")
        print(result.model, result.choices["mode"], result.choices.get("lambda"))
    """

    out: Path
    model: Path
    report: dict = field(repr=False)
    computed: list[str] = field(default_factory=list)
    message: str | None = None

    def __fspath__(self) -> str:
        return str(self.model)

    @property
    def choices(self) -> dict:
        return self.report["choices"]

    @property
    def stages(self) -> dict:
        return self.report["stages"]


def _fit_data(data, out: Path, split: str | None) -> tuple[Path, str | None]:
    """(BEIR folder, split) for fit: a path as is, a loaded Dataset's folder, an in-memory Dataset saved to
    ``out/data`` (kept there so that a rerun resumes)."""
    from twotower.api.dataset import Dataset
    from twotower.data.beir import BeirDataset

    if isinstance(data, (str, Path)):
        return Path(data), split
    if not isinstance(data, BeirDataset):
        raise TwoTowerError(f"data: give a BEIR folder or a Dataset, not {type(data).__name__}")
    if data.root is not None:
        return Path(data.root), split
    folder = out / "data"
    ds = data if isinstance(data, Dataset) else Dataset(**vars(data))
    if folder.exists():
        saved = Dataset.load(folder, ds.split)
        if (saved.corpus, saved.queries, saved.qrels) != (ds.corpus, ds.queries, ds.qrels):
            raise TwoTowerError(f"{folder}: holds another data set than the one given (an earlier fit into {out}); "
                                "give another out folder")
    else:
        out.mkdir(parents=True, exist_ok=True)
        ds.save(folder)
    return folder, split or ds.split


@user_errors
def fit(data, out: str | Path, *, model: str | None = None, split: str | None = None, epochs: float | None = None,
        lr: float | None = None, batch_size: int | None = None, mine: bool | None = None,
        mined_epochs: float | None = None, reranker: bool = False, language: str | None = None,
        seed: int | None = None, precision: str = "auto", device: str = "auto", runtime: str = "auto",
        cache_chunk: int | None = None, show_progress: bool = True, **recipe) -> FitResult:
    """The best retriever for one data set: fine-tune on its judged train queries (a seeded 20% held out as dev),
    mine hard negatives with the fine-tuned model, retrain, then choose the encoder and the retrieval (dense, a
    BM25 hybrid with its λ and normalisation, or RRF; optionally a re-ranker) by dev nDCG@10, and train the chosen
    encoder once more on its own top-ranked documents (``refine``, kept where that improves dev). The test split is
    never read. With fewer than ``cv_below`` (300) judged queries the choices are made by ``cv_folds``-fold
    cross-validation instead (the zero-shot retrieval kept unless a fine-tuned one beats it by more than the folds'
    spread) and the final model trains on all of them; with ``reranker=True`` the cross-encoder's scores are also
    distilled into the encoder (``distill``), kept where that improves dev. Without judged train queries it chooses
    from the languages alone. ``twotower fit`` is this function.

    ``data``: a BEIR folder or a :class:`~twotower.Dataset` (one built in memory is saved to ``out/data``).
    ``out``: the fit folder (``model/``, ``fit.json``, ``stages/``); a rerun resumes after the last finished stage.
    Any other :class:`~twotower.FitRecipe` field can be given by name (e.g. ``rank_to=30``, ``lambdas=(0.3, 0.5)``).
    ``runtime``: what encodes the corpus and queries on a CPU (``auto`` | ``torch`` | ``onnx`` | ``openvino`` |
    ``onnx-int8`` | ``openvino-int8``; docs/guides/cpu-runtimes.md).
    ``train_passage``: ``best`` (the default) trains each positive or mined negative longer than the model's window
    on the passage the round's starting model scores highest for the query, ``first`` on its first window.
    ``cache_chunk``: train both rounds with GradCache in chunks of this many texts (memory bounded by the chunk, not
    the batch; the same loss); a rerun may change it.

    Example::

        import twotower as tt

        result = tt.fit("my-beir-dir", "fitted", epochs=1, mine=False, show_progress=False)
        index = tt.Index.build("fitted-index", "my-beir-dir", encoder=result.model)
    """
    from twotower.encoders.runtimes import check_runtime, using_runtime
    from twotower.training.config import StageConfig
    from twotower.training.fit import FitOptions, run_fit

    from twotower.api.encoder import model_argument

    model = model_argument(model, "model")  # an Encoder's source, a FitResult's model
    check_runtime(runtime)
    StageConfig(cache_chunk=cache_chunk).validate("fit: ")  # before any work, as the training rounds will check it
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TwoTowerError(f"out {out}: exists and is not a directory")
    given = {"model": model, "split": split, "epochs": epochs, "lr": lr, "batch_size": batch_size, "mine": mine,
             "mined_epochs": mined_epochs, "language": language, "seed": seed}
    fields = set(FitRecipe.__dataclass_fields__)
    unknown = sorted(set(recipe) - fields)
    if unknown:
        raise TwoTowerError(f"fit: unknown recipe field(s) {', '.join(unknown)}; the fields are {', '.join(sorted(fields))}")
    settings = {**{k: v for k, v in given.items() if v is not None}, **recipe, "reranker": reranker}
    for key in ("margins", "lambdas", "matryoshka", "matryoshka_weights"):
        if isinstance(settings.get(key), (list, tuple)):
            settings[key] = tuple(settings[key])
    FitRecipe(**settings).validate()  # every number named (epochs=, lr=) before the data is read or saved
    folder, split = _fit_data(data, out, split)
    if split is not None:
        settings["split"] = split
    with using_runtime(runtime):
        result = run_fit(folder, out, FitRecipe(**settings), FitOptions(precision=precision, device=device,
                                                                       show_progress=show_progress,
                                                                       cache_chunk=cache_chunk))
    return FitResult(out=result.out, model=result.model, report=result.report, computed=list(result.computed),
                     message=result.message)


@user_errors
def train(config, *, hard_negatives: str = "none", num_negatives: int = 1, rank_from: int = 3, rank_to: int = 50,
          data: str | Path | None = None, split: str = "train", resume: bool = False, **overrides) -> Path:
    """Train a dual encoder (GTR-style bi-directional in-batch softmax, optional hard negatives, one or more
    stages); returns the final model directory (``OUT/model``). ``twotower train`` is this function.

    ``config``: a :class:`~twotower.TrainConfig` or a TOML file with ``[[stage]]`` tables (then ``overrides`` set
    top-level fields such as ``out=``). ``hard_negatives``: ``none`` | ``bm25`` (mined before training) | ``model``
    (train, mine with the trained model, retrain), ``num_negatives`` per query, from ``data``'s ``split``, sampled
    from ranks ``rank_from``..``rank_to`` of each query's ranking (as :func:`mine` does). Under
    ``torchrun`` each process takes its share of every batch. A positive or hard negative longer than the model's
    document window trains on its best passage for the query, chosen by the starting model
    (``TrainConfig(train_passage="first")``: its first window; docs/guides/long-documents.md).

    Example::

        import twotower as tt

        cfg = tt.TrainConfig(out="runs/ft", stages=[tt.StageConfig(data="my-beir-dir", epochs=1, batch_size=16)])
        model_dir = tt.train(cfg)
        enc = tt.Encoder.load(model_dir)
    """
    from twotower.training.config import TrainConfig
    from twotower.training.pipeline import TrainRequest, run_training
    from twotower.training.tensorboard_log import require_tensorboard
    from twotower.training.trainer import maybe_init_distributed

    if isinstance(config, (str, Path)):
        config = TrainConfig.from_toml(config, **{k: v for k, v in overrides.items() if k == "out" or v is not None})
    elif overrides:
        raise TwoTowerError(f"train: {', '.join(sorted(overrides))} given with a TrainConfig: set them on the config")
    if not isinstance(config, TrainConfig):
        raise TwoTowerError(f"config: give a TrainConfig or a TOML path, not {type(config).__name__}")
    from dataclasses import replace

    from twotower.api.dataset import data_folder
    from twotower.api.encoder import model_argument

    config = replace(config, model=model_argument(config.model, "model"),  # an Encoder, a FitResult, a Dataset
                     stages=[replace(s, data=str(data_folder(s.data, "data", split=s.split)))
                             if s.data is not None and not isinstance(s.data, str) else s for s in config.stages])
    if data is not None:
        data = data_folder(data, "data", split=split)
    maybe_init_distributed()
    if config.tensorboard:
        require_tensorboard()  # before a model is loaded or the run directory written
    return run_training(TrainRequest(config=config, hard_negatives=hard_negatives, num_negatives=num_negatives,
                                     data=Path(data) if data is not None else None, split=split,
                                     rank_range=(rank_from, rank_to)), resume=resume)


@user_errors
def pretrain(config, pretraining, *, resume: bool = False) -> Path:
    """Contriever-style pre-training without labels: two views of one text chunk (independent cropping or the
    inverse cloze task, word deletion / replacement) are a positive pair, against in-batch or MoCo-queue negatives.
    ``config``: a :class:`~twotower.TrainConfig` (one stage: steps, batch, lr, temperature); ``pretraining``: a
    :class:`~twotower.PretrainConfig` (corpus, :class:`~twotower.ViewConfig`, negatives). Returns the model
    directory. ``twotower pretrain`` is this function.

    Example::

        import twotower as tt

        views = tt.ViewConfig(augment="crop", chunk_tokens=64)
        cfg = tt.TrainConfig(out="runs/pre", stages=[tt.StageConfig(name="pretrain", steps=10, batch_size=8)])
        model_dir = tt.pretrain(cfg, tt.PretrainConfig(corpus="my-beir-dir/corpus.jsonl", views=views))
    """
    from twotower.training.pretrain import pretrain as _pretrain
    from twotower.training.tensorboard_log import require_tensorboard
    from twotower.training.trainer import maybe_init_distributed

    maybe_init_distributed()
    if config.tensorboard:
        require_tensorboard()
    return _pretrain(config, pretraining, resume=resume)


@user_errors
def mine(data, out: str | Path, *, split: str = "train", retriever: str = "bm25",
         model=None, num_negatives: int = 4, rank_from: int = 3, rank_to: int = 50, seed: int = 0,
         language: str = "en", precision: str = "auto", device: str = "auto", runtime: str = "auto",
         show_progress: bool = True) -> int:
    """Mine hard negatives for a BEIR split's judged pairs: ``num_negatives`` sampled from ranks ``rank_from`` to
    ``rank_to`` of ``retriever`` (``bm25`` or ``model``), judged documents excluded; writes a pairs JSONL
    (``query``, ``positive``, ``negatives``) for ``StageConfig(pairs=...)`` and returns the number of examples.
    ``runtime``: what encodes on a CPU for ``retriever="model"`` (docs/guides/cpu-runtimes.md).

    Example::

        n = tt.mine("my-beir-dir", "pairs.jsonl", split="train", num_negatives=2)
    """
    from twotower.data.beir import beir_files
    from twotower.encoders.runtimes import check_runtime, using_runtime
    from twotower.io import check_not_inputs, check_output_file
    from twotower.training.pipeline import mine_pairs

    from twotower.api.dataset import data_folder
    from twotower.api.encoder import model_argument

    data, model = data_folder(data, "data", split=split), model_argument(model, "model")
    check_runtime(runtime)
    check_output_file(out, "out")  # before any loading
    check_not_inputs((("out", out),), beir_files(data))
    with using_runtime(runtime):
        return mine_pairs(data, split, out, retriever=retriever, model=model, num_negatives=num_negatives,
                          rank_range=(rank_from, rank_to), seed=seed, show_progress=show_progress,
                          precision=precision, device=device, language=language)


@user_errors
def train_reranker(data, out: str | Path, *, base: str | None = None, split: str = "train",
                   config=None) -> dict:
    """Train a cross-encoder re-ranker on a BEIR split: each judged positive against BM25-mined negatives, a
    softmax over each group. ``config``: a :class:`~twotower.RerankerTrainConfig`. Returns training stats; the model
    in ``out`` re-ranks through ``Index.search(rerank=out)`` or ``evaluate(..., rerank=out)``.

    Example::

        stats = tt.train_reranker("my-beir-dir", "reranker", config=tt.RerankerTrainConfig(epochs=1))
    """
    from twotower.api.dataset import data_folder
    from twotower.io import check_output_dir
    from twotower.retrieval.rerank import train_reranker as _train

    data = data_folder(data, "data", split=split)
    check_output_dir(out, "out", replaced=True)  # before any loading or training
    return _train(data, out, base=base, split=split, cfg=config)
