"""Training run settings: :class:`TrainConfig` (the model and the run) and its :class:`StageConfig` list
(each stage's data, length and optimisation), loaded from a TOML stages file or built by the CLI, and
checked as a whole before any model is loaded (:meth:`TrainConfig.validate`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from twotower.errors import TwoTowerError

OPTIMIZERS = ("adamw", "adafactor")
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class StageConfig:
    """One training stage. Data: a BEIR directory + split (judged pairs), or a pairs JSONL file.

    Example::

        stage = tt.StageConfig(name="finetune", data="my-beir-dir", split="train", epochs=2, batch_size=32, lr=5e-5,
                               temperature=0.05)
    """

    name: str = "finetune"
    data: str | None = None
    split: str = "train"
    pairs: str | None = None
    epochs: float | None = 1.0
    steps: int | None = None
    batch_size: int = 32
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup: float = 0.1
    temperature: float = 0.05
    bidirectional: bool = True
    hard_negatives: int = 0
    optimizer: str = "adamw"
    cache_chunk: int | None = None
    # texts per length bucket in a step's forward pass (training/buckets.py); 0: none; None: by device
    # (DEFAULT_BUCKET_SIZE: 8 on CPU, 0 on CUDA, where many small buckets cost more in launches than padding)
    bucket_size: int | None = None
    max_grad_norm: float | None = 1.0

    def validate(self, where: str = "") -> None:
        """Raise TwoTowerError for settings that cannot train (checked before any model is loaded)."""
        at = f"{where}stage '{self.name}'"
        from twotower.checks import check_number

        n, w = check_number, f"{at}: "
        n(self.epochs, "epochs", above=0, optional=self.steps is not None, where=w, hint="or give steps")
        n(self.steps, "steps", integer=True, minimum=1, optional=True, where=w)
        n(self.batch_size, "batch_size", integer=True, minimum=2, where=w, hint="the in-batch softmax needs 2")
        n(self.lr, "lr", above=0, where=w)
        n(self.weight_decay, "weight_decay", minimum=0, where=w)
        n(self.warmup, "warmup", minimum=0, maximum=1, where=w, hint="a fraction of the steps")
        n(self.temperature, "temperature", above=0, where=w, hint="scores are divided by it; GTR uses 0.01")
        n(self.hard_negatives, "hard_negatives", integer=True, minimum=0, where=w)
        n(self.bucket_size, "bucket_size", integer=True, minimum=0, optional=True, where=w)
        n(self.max_grad_norm, "max_grad_norm", above=0, optional=True, where=w)
        for key in ("name", "split", "optimizer"):
            if not isinstance(getattr(self, key), str):
                raise TwoTowerError(f"{w}{key} {getattr(self, key)!r}: a string")
        if not isinstance(self.bidirectional, bool):
            raise TwoTowerError(f"{w}bidirectional {self.bidirectional!r}: True or False")
        checks = [
            (self.data is not None and self.pairs is not None,
             "gives both data (a BEIR directory) and pairs (a JSONL file): give one"),
            (self.steps is not None and self.steps < 1, f"steps {self.steps}: must be at least 1"),
            (self.steps is None and (self.epochs is None or not 0 < self.epochs < float("inf")),
             f"epochs {self.epochs}: must be above 0 and finite (or give steps)"),
            (self.batch_size < 2, f"batch size {self.batch_size}: the in-batch softmax needs at least 2"),
            (not 0 < self.lr < float("inf"), f"learning rate {self.lr}: must be above 0 and finite"),
            (not 0 <= self.weight_decay < float("inf"), f"weight decay {self.weight_decay}: must be 0 or more"),
            (not 0 <= self.warmup <= 1, f"warmup {self.warmup}: a fraction of the steps, 0 to 1"),
            (not 0 < self.temperature < float("inf"),
             f"temperature {self.temperature}: must be above 0 and finite (scores are divided by it; GTR uses "
             "0.01)"),
            (not _SIMPLE_NAME.fullmatch(self.name),
             "name: letters, digits, '.', '_' or '-', starting with a letter or digit (it names the folder "
             "stages/<name>/ of the run)"),
            (self.hard_negatives < 0, f"hard_negatives {self.hard_negatives}: must be 0 or more"),
            (self.optimizer not in OPTIMIZERS, f"optimizer '{self.optimizer}': choose one of {', '.join(OPTIMIZERS)}"),
            (self.cache_chunk is not None and (type(self.cache_chunk) is not int or self.cache_chunk < 1),
             f"cache_chunk {self.cache_chunk!r}: a whole number of texts, at least 1"),
            (self.bucket_size is not None and self.bucket_size < 0, f"bucket_size {self.bucket_size}: 0 or more"),
            (self.max_grad_norm is not None and not self.max_grad_norm > 0,
             f"max_grad_norm {self.max_grad_norm}: above 0 (or none)"),
        ]
        for bad, message in checks:
            if bad:
                raise TwoTowerError(f"{at} {message}")


DEFAULT_BUCKET_SIZE = {"cpu": 8, "cuda": 0}

# Settings that must match for --resume to continue a run exactly (the rest, e.g. progress bars, may change).
RESUME_INVARIANTS = ("model", "towers", "dim", "layer_norm", "similarity", "pooling", "query_max_length",
                     "doc_max_length", "seed", "multivector", "attention_dropout", "freeze_embeddings", "stages",
                     "matryoshka", "matryoshka_weights", "train_passage")
# stage settings that change how a step is computed, not what it computes: a resume may change them (GradCache's
# chunk: the same loss and gradient in less memory)
RUN_ONLY_STAGE_KEYS = ("cache_chunk",)


@dataclass
class TrainConfig:
    """A training run (:func:`twotower.train`, ``twotower train``): the run folder ``out``, the starting ``model``
    (default all-MiniLM-L6-v2), the towers (``sde`` | ``ade`` | ``ade-ste`` | ``ade-fte`` | ``ade-spl``), an optional
    projection ``dim``, precision and device, checkpointing, ``train_passage`` (which passage of a positive or hard
    negative longer than the document window to train on: ``best`` for the query, the default, or ``first``), and
    its :class:`~twotower.StageConfig` list, run in order. ``TrainConfig.from_toml`` reads one from a stages file.

    Example::

        cfg = tt.TrainConfig(out="runs/gtr", towers="sde", dim=256,
                             stages=[tt.StageConfig(pairs="pairs.jsonl", epochs=1), tt.StageConfig(data="my-beir-dir")])
        model_dir = tt.train(cfg, hard_negatives="bm25")
    """

    out: str
    model: str | None = None
    towers: str = "sde"
    dim: int | None = None
    layer_norm: bool = False
    similarity: str = "cosine"
    pooling: str | None = None
    query_max_length: int | None = None
    doc_max_length: int | None = None
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N (twotower.encoders.device)
    # dropout on attention probabilities while training (encoders.backbone.set_attention_dropout); None: the
    # backbone's own (0.1 for BERT-family models). 0 lets attention run fused: much faster steps on CPU.
    attention_dropout: float | None = None
    # keep every backbone's token-embedding matrix fixed (no gradient, no optimizer state): for a large
    # vocabulary (XLM-R's 250k x 384 is 82% of multilingual-e5-small) most of the step's memory and update cost
    freeze_embeddings: bool = False
    seed: int = 42
    checkpoint_every: int = 100
    # also a checkpoint once this many minutes have passed since the last one (or the start): on a slow machine
    # a kill then loses at most that much work, however long a step takes; None: by steps only
    checkpoint_minutes: float | None = None
    keep_checkpoints: int = 2
    tensorboard: bool = False
    show_progress: bool = True
    # ME-BERT: train the max score over the document's first m token vectors
    # (twotower.training.multivector); None: the pooled single-vector in-batch softmax
    multivector: int | None = None
    # Matryoshka (MRL): the in-batch loss on each prefix [:m] of the embeddings, summed with these weights
    # (default 1 each; training.losses.MatryoshkaLoss); None: the whole embedding only
    matryoshka: list[int] | None = None
    matryoshka_weights: list[float] | None = None
    # which passage of a positive or hard negative longer than the document window to train on: "first" (the
    # tokenizer's first window) or "best" (the passage the starting model scores highest for the query:
    # training.passage_choice); None: its DEFAULT
    train_passage: str | None = None
    stages: list[StageConfig] = field(default_factory=lambda: [StageConfig()])

    def validate(self) -> None:
        """Raise TwoTowerError for settings that cannot train, naming the setting (before any work starts)."""
        if not self.stages:
            raise TwoTowerError("a run needs at least one stage")
        from twotower.checks import check_number

        n = check_number
        n(self.dim, "dim", integer=True, minimum=1, optional=True)
        n(self.attention_dropout, "attention_dropout", minimum=0, below=1, optional=True)
        n(self.multivector, "multivector", integer=True, minimum=1, optional=True)
        for key in ("query_max_length", "doc_max_length"):
            n(getattr(self, key), key, integer=True, minimum=1, optional=True)
        n(self.seed, "seed", integer=True, minimum=0, maximum=2**32 - 1)
        n(self.checkpoint_every, "checkpoint_every", integer=True, minimum=0)
        n(self.keep_checkpoints, "keep_checkpoints", integer=True, minimum=1)
        n(self.checkpoint_minutes, "checkpoint_minutes", above=0, optional=True)
        if not all(isinstance(st, StageConfig) for st in self.stages):
            raise TwoTowerError("stages: a list of StageConfig")
        if self.dim is not None and self.dim < 1:
            raise TwoTowerError(f"dim {self.dim}: the projection size must be at least 1 (or leave it out)")
        if self.attention_dropout is not None and not 0 <= self.attention_dropout < 1:
            raise TwoTowerError(f"attention dropout {self.attention_dropout}: a probability, 0 to below 1")
        if self.multivector is not None and self.multivector < 1:
            raise TwoTowerError(f"multivector {self.multivector}: at least 1 token vector")
        check_matryoshka(self.matryoshka, self.matryoshka_weights, multivector=self.multivector)
        if self.train_passage is not None:
            from twotower.training.passage_choice import resolve_choice

            resolve_choice(self.train_passage)
        for name in ("query_max_length", "doc_max_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TwoTowerError(f"{name} {value}: at least 1 token")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise TwoTowerError("checkpoint_every must be 0 or more and keep_checkpoints at least 1")
        minutes = self.checkpoint_minutes
        if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float))
                                    or not math.isfinite(minutes) or minutes <= 0):
            raise TwoTowerError(f"checkpoint_minutes {minutes!r}: a number of minutes above 0 (or leave it out)")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise TwoTowerError(f"stage names must differ (they name stages/<name>/): {names}")
        for stage in self.stages:
            stage.validate()

    @classmethod
    def from_toml(cls, path: str | Path, **overrides) -> "TrainConfig":
        import tomllib

        from twotower.checks import flag, given
        from twotower.io import read_input_text

        path = Path(path)
        if not path.exists():  # anything else that is not a regular file: read_input_text names it
            raise TwoTowerError(f"{given('config', path)}: file not found (give a TOML file with [[stage]] tables)")
        try:
            raw = tomllib.loads(read_input_text(path, flag("config"), limit=16 << 20, what="TOML config"))
        except tomllib.TOMLDecodeError as exc:
            raise TwoTowerError(f"{path}: invalid TOML ({exc})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise TwoTowerError(f"{given('config', path)}: cannot read it ({exc})") from None
        stages_raw = raw.pop("stage", None) or raw.pop("stages", None)
        if not stages_raw:
            raise TwoTowerError(f"{path}: no [[stage]] tables: a run needs at least one stage")
        if not isinstance(stages_raw, list) or not all(isinstance(st, dict) for st in stages_raw):
            raise TwoTowerError(f"{path}: 'stage' must be an array of tables, one [[stage]] (two brackets) per "
                                "stage, each with its own keys")
        known = {f for f in cls.__dataclass_fields__ if f != "stages"}
        unknown = set(raw) - known
        if unknown:
            raise TwoTowerError(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        stages = []
        for i, st in enumerate(stages_raw, start=1):
            bad = set(st) - set(StageConfig.__dataclass_fields__)
            if bad:
                raise TwoTowerError(f"{path}: stage {i}: unknown keys {sorted(bad)}")
            _check_types(StageConfig, st, f"{path}: stage {i}")
            stages.append(StageConfig(**_paths_from(path, st, ("data", "pairs"))))
        _check_types(cls, raw, str(path))
        from twotower.checks import cli_names

        with cli_names("toml"):  # its numbers named as the file's keys (lr = inf), the file named first
            for i, stage in enumerate(stages, start=1):
                stage.validate(f"{path}: stage {i}: ")
        raw = _paths_from(path, raw, ("out", "model"))
        values = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
        return cls(stages=stages, **values)


def check_matryoshka(dims: list[int] | None, weights: list[float] | None, *, multivector: int | None = None,
                     model_dim: int | None = None) -> None:
    """TwoTowerError for Matryoshka settings that cannot train (``model_dim``: the embeddings' size, once known)."""
    from twotower.checks import check_numbers, flag, given

    if dims is not None:
        check_numbers(dims, "matryoshka", integer=True, minimum=1)
    if weights is not None:
        check_numbers(weights, "matryoshka_weights", minimum=0)
    if dims is None:
        if weights is not None:
            raise TwoTowerError(f"{flag('matryoshka_weights')} need {flag('matryoshka')} dimensions")
        return
    if not dims or any(m < 1 for m in dims) or len(set(dims)) != len(dims):
        raise TwoTowerError(f"{given('matryoshka', list(dims))}: give distinct dimensions of at least 1, e.g. "
                            f"{given('matryoshka', [384, 192, 96, 48])}")
    if weights is not None and (len(weights) != len(dims) or any(not 0 <= w < float("inf") for w in weights)
                                or not any(weights)):
        raise TwoTowerError(f"{given('matryoshka_weights', list(weights))}: one weight of 0 or more per dimension "
                            f"of {given('matryoshka', list(dims))}, not all 0")
    if multivector is not None:
        raise TwoTowerError(f"{flag('matryoshka')} trains single vectors; drop it or {flag('multivector')}")
    if model_dim is not None and max(dims) > model_dim:
        raise TwoTowerError(f"{given('matryoshka', list(dims))}: {max(dims)} is more than the model's {model_dim} "
                            f"dimensions ({flag('matryoshka')} dimensions must be at most {model_dim})")


def _check_types(kind: type, values: dict, where: str) -> None:
    """TwoTowerError for a TOML value of the wrong type (``steps = "ten"``), naming the key and the type wanted."""
    import types
    import typing

    hints = typing.get_type_hints(kind)
    for key, value in values.items():
        hint = hints.get(key)
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None or hint is None or any(_is_a(value, t) for t in allowed):
            continue
        names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed if t is not type(None))
        raise TwoTowerError(f"{where}: '{key}' is {value!r}, wanted {names}")


def _is_a(value, wanted) -> bool:
    """isinstance for a TOML value, where a bool is no number and an int is a float too."""
    import typing

    if isinstance(value, bool) and wanted in (int, float):
        return False
    if wanted is float:
        return isinstance(value, (int, float))
    return isinstance(value, typing.get_origin(wanted) or wanted)


def _paths_from(toml: Path, table: dict, keys: tuple[str, ...]) -> dict:
    """``table`` with its relative paths under ``keys`` resolved against the folder of the ``toml`` file that holds
    them (not the working directory). A ``model`` is a path when it starts with ``./`` or ``../`` or names
    something in that folder; otherwise it stays a model name (``mpnet-base``) or hub id."""
    folder, table = toml.resolve().parent, dict(table)
    for key in keys:
        value = table.get(key)
        if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
            continue
        if key == "model" and not value.startswith(("./", "../")) and not (folder / value).exists():
            continue
        table[key] = str(folder / value)
    return table
