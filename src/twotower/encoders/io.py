"""Save and load towers in the sentence-transformers layout, and dual encoders around them.

A tower is a sentence-transformers directory: Transformer (root) → Pooling → [Dense] →
[LayerNorm] → [Normalize], so ``SentenceTransformer(path)`` loads it as it is. A dual encoder
directory holds ``twotower.json``; with shared towers (sde) the root itself is the tower, with
separate towers ``query/`` and ``document/`` are. This module knows the files only: ``DualEncoder.load``
(``towers.py``) puts a dual encoder together from them and re-ties the sharing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from twotower.encoders.backbone import POOLER_MODEL_TYPES, load_backbone, quiet_transformers, read_layout, resolve_model
from twotower.encoders.encoder import Projection, TextEncoder
from twotower.errors import ModelError, TwoTowerError
from twotower.io import atomic_directory, atomic_write_json

log = logging.getLogger(__name__)

CONFIG_NAME = "twotower.json"
FORMAT_VERSION = 1
ST_CONFIG = "config_sentence_transformers.json"  # sentence-transformers' model config: its "prompts"
PROMPT_NAMES = {"query": ("query",), "document": ("document", "passage", "corpus")}  # as SentenceTransformer


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ModelError(f"{directory}: no model.safetensors or pytorch_model.bin")


def _load_projection(dense_dir: str, layer_norm_dir: str | None) -> Projection:
    cfg_path = Path(dense_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    activation = cfg.get("activation_function", "torch.nn.modules.linear.Identity")
    if not activation.endswith("Identity"):
        raise ModelError(f"{cfg_path}: only linear (Identity) Dense projections are supported, not {activation}")
    proj = Projection(cfg["in_features"], cfg["out_features"], layer_norm=layer_norm_dir is not None,
                      bias=bool(cfg.get("bias", True)))
    weights = _read_weights(Path(dense_dir))
    proj.linear.load_state_dict({k.removeprefix("linear."): v for k, v in weights.items()})
    if layer_norm_dir is not None:
        ln = _read_weights(Path(layer_norm_dir))
        proj.layer_norm.load_state_dict({k.removeprefix("norm."): v for k, v in ln.items()})
    return proj


def read_prompts(directory: str | Path) -> dict[str, str]:
    """The text prefixes a model wants in front of queries and documents: ``{"query": …, "document": …}``
    from the ``prompts`` of its ``config_sentence_transformers.json`` (a document prompt may be named
    ``document``, ``passage`` or ``corpus``, as sentence-transformers' ``encode_document`` looks them up)."""
    path = Path(directory) / ST_CONFIG
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: unreadable ({exc}); fix or delete it") from None
    prompts = config.get("prompts") if isinstance(config, dict) else None
    if not isinstance(prompts, dict):
        return {}
    out = {}
    for role, names in PROMPT_NAMES.items():
        name = next((n for n in names if n in prompts), None)
        if name is not None:
            if not isinstance(prompts[name], str):
                raise ModelError(f"{path}: prompts.{name} must be a string, not {prompts[name]!r}")
            if prompts[name]:
                out[role] = prompts[name]
    return out


def write_prompts(directory: str | Path, prompts: dict[str, str]) -> None:
    """Record ``prompts`` in ``directory``'s ``config_sentence_transformers.json`` (kept keys merged), so
    ``SentenceTransformer(directory).encode_query`` / ``encode_document`` prefix texts the same way."""
    path = Path(directory) / ST_CONFIG
    config = {}
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError:
            config = {}
    config = config if isinstance(config, dict) else {}
    config["prompts"] = dict(prompts)
    config.setdefault("default_prompt_name", None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def max_positions(backbone) -> int | None:
    """The longest input, in tokens, that ``backbone``'s learned position embeddings cover (None: no such limit,
    e.g. T5's relative positions)."""
    config = getattr(backbone, "config", None)
    value = getattr(config, "max_position_embeddings", None)
    if not isinstance(value, int) or value < 1:
        return None
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        value -= 2  # their positions start after the padding index
    return value


LENGTH_OPTIONS = {"query": "--query-max-length", "document": "--doc-max-length (train, pretrain: --max-length)"}


def min_length(tower: TextEncoder, role: str) -> int:
    """The fewest tokens a ``role`` ("query" or "document") text can be cut to and still hold a token of its own:
    the special tokens the tokenizer adds ([CLS] … [SEP]: 2 for BERT, </s>: 1 for T5), the role's prompt
    ("query: " for multilingual-e5) and one. Below that the tokenizer cannot truncate at all and leaves every
    text whole (a long one then runs past the position embeddings)."""
    tokenizer = tower.tokenizer
    specials = int(tokenizer.num_special_tokens_to_add(pair=False))
    prompt = tower.prompts.get(role, "")
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
    return specials + prompt_tokens + 1


def check_min_length(length: int | None, tower: TextEncoder, role: str, model) -> None:
    """Refuse a max length below :func:`min_length` (one check wherever a model's lengths are resolved)."""
    if length is None:
        return
    least = min_length(tower, role)
    if length < least:
        prompt = tower.prompts.get(role, "")
        parts = f"{least - 1} tokens of its own ({'its prompt ' + repr(prompt) + ' and ' if prompt else ''}" \
                f"the special tokens)"
        raise TwoTowerError(
            f"{LENGTH_OPTIONS.get(role, role)} {length}: {model} puts {parts} around every "
            f"{role}, so a length below {least} cannot hold a single token of the text (the tokenizer then cuts "
            f"nothing at all); give at least {least}, or leave the option out for the model's own")


def clamp_length(length: int | None, positions: int | None, model, *, tower: TextEncoder | None = None,
                 role: str = "document") -> int | None:
    """``length`` cut to the model's ``positions`` (a longer input indexes past its position embeddings: a
    RuntimeError on the first long text), saying so once. With ``tower``, a length below what the tower's
    tokenizer needs for one text token is refused (:func:`check_min_length`)."""
    if tower is not None:
        check_min_length(length, tower, role, model)
    if length is not None and positions is not None and length > positions:
        log.warning("%s has %d positions: the %s max length of %d tokens (asked for, or the index's) is cut to %d",
                    model, positions, role, length, positions)
        return positions
    return length


def load_tower(
    model: str | Path | None,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_length: int | None = None,
) -> TextEncoder:
    """One tower from a HF or sentence-transformers directory (or the default model)."""
    resolved = resolve_model(model)
    layout = read_layout(resolved)
    tokenizer, backbone = load_backbone(layout.transformer_dir)
    default_len = layout.max_length or min(512, getattr(tokenizer, "model_max_length", 512) or 512)
    positions = max_positions(backbone)
    if positions is not None:
        default_len = min(default_len, positions)  # a longer input would index past the position embeddings
        max_length = clamp_length(max_length, positions, resolved)
    projection = _load_projection(layout.dense_dir, layout.layer_norm_dir) if layout.dense_dir else None
    if normalize is None:
        normalize = layout.normalize if layout.normalize is not None else True
    return TextEncoder(
        backbone, tokenizer, pooling=pooling or layout.pooling or "mean", normalize=normalize,
        projection=projection, max_length=max_length or default_len, prompts=read_prompts(resolved),
    )


def save_tower(tower: TextEncoder, path: Path) -> None:
    """Write ``tower`` as a sentence-transformers directory into the (existing, empty) ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():  # no "Writing model shards" bar, whatever --progress says
        tower.backbone.save_pretrained(path)
        tower.tokenizer.save_pretrained(path)
    st_config: dict = {"max_seq_length": tower.max_length, "do_lower_case": False}
    if getattr(tower.backbone, "pooler", None) is None and tower.backbone.config.model_type in POOLER_MODEL_TYPES:
        # the backbone was loaded without its pooler (pooling is ours): tell sentence-transformers to build it
        # the same way, or transformers reports the pooler's weights as MISSING and "newly initialized"
        st_config["model_args"] = {"add_pooling_layer": False}
    (path / "sentence_bert_config.json").write_text(json.dumps(st_config, indent=2))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]

    def add(kind: str, folder: str) -> Path:
        idx = len(modules)
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_{folder}",
                        "type": f"sentence_transformers.models.{kind}"})
        sub = path / f"{idx}_{folder}"
        sub.mkdir()
        return sub

    pool_dir = add("Pooling", "Pooling")
    (pool_dir / "config.json").write_text(json.dumps({
        "word_embedding_dimension": tower.hidden_size,
        "pooling_mode_cls_token": tower.pooling == "cls",
        "pooling_mode_mean_tokens": tower.pooling == "mean",
        "pooling_mode_max_tokens": tower.pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
    }, indent=2))
    proj = tower.projection
    if proj is not None:
        dense_dir = add("Dense", "Dense")
        (dense_dir / "config.json").write_text(json.dumps({
            "in_features": proj.in_features, "out_features": proj.out_features,
            "bias": proj.linear.bias is not None, "activation_function": "torch.nn.modules.linear.Identity",
        }, indent=2))
        save_file({f"linear.{k}": v.contiguous() for k, v in proj.linear.state_dict().items()},
                  str(dense_dir / "model.safetensors"))
        if proj.layer_norm is not None:
            ln_dir = add("LayerNorm", "LayerNorm")
            (ln_dir / "config.json").write_text(json.dumps({"dimension": proj.out_features}))
            save_file({f"norm.{k}": v.contiguous() for k, v in proj.layer_norm.state_dict().items()},
                      str(ln_dir / "model.safetensors"))
    if tower.normalize:
        add("Normalize", "Normalize")
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    if tower.prompts:
        write_prompts(path, tower.prompts)


def save_dual_encoder(model, path: str | Path) -> None:
    """Write the dual encoder to ``path`` atomically (a crash leaves the previous save intact)."""
    with atomic_directory(path) as tmp:
        config = {
            "format": FORMAT_VERSION,
            "towers": model.kind,
            "similarity": model.similarity,
            "query_max_length": model.query_max_length,
            "doc_max_length": model.doc_max_length,
            "base_model": model.name,
        }
        if getattr(model, "multivector", None):
            config["multivector"] = int(model.multivector)  # trained with the ME-BERT max score over m vectors
        if model.shared:
            save_tower(model.query_tower, tmp)
        else:
            save_tower(model.query_tower, tmp / "query")
            save_tower(model.doc_tower, tmp / "document")
        atomic_write_json(tmp / CONFIG_NAME, config)


def read_dual_config(model: str | Path | None) -> dict | None:
    """The ``twotower.json`` of a dual encoder directory, checked; None when ``model`` is not one (a plain
    Hugging Face or sentence-transformers directory, a registered name, a hub id, or the default)."""
    config_path = Path(str(model)) / CONFIG_NAME if model else None
    if config_path is None or not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{config_path}: not a valid twotower config (malformed JSON: {exc.msg}, line {exc.lineno})"
                         ) from None
    if not isinstance(config, dict) or "towers" not in config:
        raise ModelError(f"{config_path}: not a valid twotower config (no 'towers' field)")
    return config
