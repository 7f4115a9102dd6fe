"""Find and load a transformer backbone: the bundled default, a registered name, a local directory, or a hub id.

T5-family configs load only the encoder stack. Reading a model directory's layout (``read_layout``) and the
bundled default's place (``default_model_path``) live in ``layout.py`` and are re-exported here.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from twotower.checks import flag
from twotower.encoders.layout import DEFAULT_MODEL, ModelLayout, default_model_path, read_layout
from twotower.encoders.registry import lookup, require_installed
from twotower.errors import ModelError

__all__ = ["DEFAULT_MODEL", "POOLER_MODEL_TYPES", "ModelLayout", "default_model_path", "load_backbone", "read_layout", "resolve_model",
           "set_attention_dropout"]

log = logging.getLogger(__name__)

# model types whose AutoModel class takes ``add_pooling_layer``: twotower loads (and saves) them without the pooler
POOLER_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "mpnet"})


def resolve_model(name_or_path: str | Path | None) -> str:
    """Turn a user's ``--model`` into something ``from_pretrained`` accepts.

    ``None`` or ``"all-MiniLM-L6-v2"`` (with or without ``sentence-transformers/``) mean the
    bundled default; an existing path is used as is; a registered name (``minilm-l6``,
    ``mpnet-base``: see ``twotower.encoders.registry``) means its installed directory, or an error
    saying how to install it; anything else is treated as a hub id, which only works with network access.
    """
    if name_or_path is None:
        return str(default_model_path())
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"{path}: a model must be a directory (config.json + weights)")
        if not (path / "config.json").exists():
            _refuse_other_outputs(path)
        return str(path)
    if name in (DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        return str(default_model_path())
    if lookup(name) is not None:
        return str(require_installed(name))
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"{name}: model directory not found")
    return str(name_or_path)  # a hub id, for users with network access


def _refuse_other_outputs(path: Path) -> None:
    """A folder twotower wrote that is not a model itself -- a fit's output, an index -- named for what it is, with
    the model to use instead (Hugging Face would report a missing ``model_type``)."""
    import json

    if (path / "fit.json").is_file() or (path / "model" / "config.json").is_file():
        raise ModelError(f"{path} is a 'twotower fit' output folder, not a model directory: use {path / 'model'}")
    current = path / "CURRENT"
    if current.is_file() and (path / "versions").is_dir():
        try:
            manifest = json.loads((path / "versions" / current.read_text().strip() / "manifest.json").read_text())
            model = manifest["model"].get("path") or manifest["model"].get("name")
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            model = None
        its = f"; its model is {model} (--model {model})" if model else ""
        raise ModelError(f"{path} is an index (twotower index build), not a model directory: search it with --index "
                         f"{path}{its}")


def hub_offline() -> bool:
    """Whether Hugging Face hub downloads are off (HF_HUB_OFFLINE, which the CLI sets to 1 unless told otherwise)."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def load_backbone(model: str, *, torch_dtype=None):
    """Load tokenizer and encoder-only transformer from ``model`` (a resolved path or hub id)."""
    from transformers import AutoConfig, AutoTokenizer  # the model class below: T5's module alone takes seconds

    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        if not Path(model).exists() and hub_offline():
            raise ModelError(
                f"{model}: not a local model directory or a registered model name ('twotower models list'), and "
                "downloads from the Hugging Face hub are off: to download it from the hub set HF_HUB_OFFLINE=0"
            ) from None
        raise ModelError(f"{model}: cannot read a transformer config ({exc})") from None
    tokenizer = AutoTokenizer.from_pretrained(model)
    kwargs = {"dtype": torch_dtype} if torch_dtype is not None else {}
    if config.model_type in POOLER_MODEL_TYPES:
        kwargs["add_pooling_layer"] = False  # pooling is ours: skip the pooler's unused matmul
    from transformers import PreTrainedModel

    if hasattr(PreTrainedModel, "set_use_kernels"):  # transformers 5: hub kernels on by default when `kernels` is
        kwargs["use_kernels"] = False  # installed; they download at run time and refuse some devices: ours are torch
    if config.model_type in {"t5", "mt5", "umt5"}:
        from transformers import T5EncoderModel as loader
    else:
        from transformers import AutoModel as loader
    with quiet_transformers():  # the load report lists the skipped pooler weights: not news
        backbone = loader.from_pretrained(model, **kwargs)
    backbone.eval()
    return tokenizer, backbone


@contextmanager
def quiet_transformers():
    """transformers' own messages at error level and its progress bars off inside the block (loading or saving a
    model: "Loading weights", "Writing model shards" bars for a few MB are noise, and ignore --no-progress); both
    put back as they were."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def set_attention_dropout(backbone, p: float) -> int:
    """Set the dropout on attention probabilities of every self-attention layer of ``backbone`` to ``p``, for
    training (the config, and so a saved model, keeps its own value). Returns the number of layers changed.

    Only BERT-family backbones (BERT, RoBERTa, XLM-R, MPNet, MiniLM: a config with ``attention_probs_dropout_prob``)
    have a separate rate for it; T5's ``dropout_rate`` covers every dropout, so T5 is refused. With ``p = 0``
    ``scaled_dot_product_attention`` can take its fused kernel in training (no dropout mask to draw): SciFact
    fine-tuning of MiniLM-L6 ran 1.54x faster in bf16 on CPU (benchmarks/results/train_precision.md)."""
    from torch import nn

    if not 0.0 <= p < 1.0:
        raise ModelError(f"attention dropout must be in [0, 1), got {p}")
    config = backbone.config
    if not hasattr(config, "attention_probs_dropout_prob"):
        raise ModelError(f"{flag('attention_dropout')} needs a BERT-family backbone (a config with "
                         f"attention_probs_dropout_prob); {config.model_type} has none: leave the option out")
    changed = 0
    for module in backbone.modules():
        if type(module).__name__.endswith("SelfAttention") and isinstance(getattr(module, "dropout", None), nn.Dropout):
            module.dropout.p = p
            changed += 1
    if changed == 0:
        raise ModelError(f"{config.model_type}: found no self-attention dropout to set (a layout twotower does not "
                         f"know): leave {flag('attention_dropout')} out")
    return changed
