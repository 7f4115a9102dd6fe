"""An index holds one encoder's vectors: queries searched against it and documents added to it must come from that
encoder. Another model's vectors (of the same size, or not) are not comparable with the stored ones: a search then
ranks noise, and an add mixes two spaces in one index. Checked where an index's encoder is chosen (searcher: search,
eval --index, the service, index add), before any encoding."""

from __future__ import annotations

import logging
from pathlib import Path

from twotower.checks import flag, given
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)


def _resolved(model: str) -> str | None:
    """``model`` (a directory, a registered name or the default) as an absolute path where it names one."""
    from twotower.encoders.backbone import resolve_model

    try:
        path = Path(str(resolve_model(model))).expanduser()
    except (TwoTowerError, OSError, ValueError):
        return None
    return str(path.resolve()) if path.exists() else None


def same_model(model: str, info: dict) -> bool:
    """Whether ``model`` (a --model value, or a loaded encoder's name) is the encoder the manifest's ``info``
    records: the same name, or the same directory once both are resolved."""
    if str(model) in (info.get("name"), info.get("path")):
        return True
    given, recorded = _resolved(str(model)), info.get("path")
    return given is not None and recorded is not None and Path(recorded).exists() and \
        given == str(Path(recorded).resolve())


def check_index_encoder(index, info: dict, model: str | None, *, encoder_dim: int | None = None,
                        index_dim: int | None = None) -> None:
    """Refuse ``model`` for ``index`` unless it is the index's own encoder (``info``: the manifest's ``model``).
    Where the recorded model directory is gone (the model moved), another directory is taken for it, with a
    warning, if its vectors have the index's size (``encoder_dim`` against ``index_dim``, when known)."""
    if encoder_dim is not None and index_dim is not None and encoder_dim != index_dim:
        raise TwoTowerError(f"{index}: holds {index_dim}-d vectors of {info.get('name')} ({info.get('path')}), but "
                            f"{model or 'the encoder given'} gives {encoder_dim}-d vectors: search and add with the "
                            f"index's own model (leave out {flag('model')}), or build another index with this one")
    if not model or same_model(model, info):
        return
    recorded = info.get("path")
    if recorded and not Path(recorded).exists() and not str(recorded).startswith(("hf:", "http")):
        log.warning("%s: its model directory %s is gone; taking %s for it (vectors of another model would rank "
                    "nothing sensible: rebuild the index if it is not the same model)", index, recorded, model)
        return
    raise TwoTowerError(f"{index}: its documents were encoded by {info.get('name')} ({recorded}); "
                        f"{given('model', model)} is another encoder, whose vectors are not comparable with them: "
                        f"leave out {flag('model')} (the index's own is used), or build an index with {model}")
