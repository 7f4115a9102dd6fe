"""One kind of artifact per output folder.

Each command that writes a folder of its own (``fit --out``, ``train``/``pretrain --out``, the analyses' ``--out``)
claims it with a marker file, ``.twotower-output`` (``{"kind": ...}``); an index is told by its own layout
(``CURRENT``, ``versions/``). A writer refuses a folder that holds another kind, naming it, before it writes
anything: a label-free fit into a training run printed that it saved a model it never wrote, a fit into an index
folder put model files among the index's. Folders written before markers existed are told by their files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)

MARKER = ".twotower-output"  # no .json suffix: the analyses' report reads every *.json of its folder
KINDS = {
    "index": "an index",
    "fit": "a fit run",
    "train": "a training run",
    "analysis": "analysis results",
    "model": "a model directory",
}
# files that tell a folder's kind without a marker (folders written before markers existed), in this order
SIGNS = {
    "index": ("CURRENT", "versions"),
    "fit": ("recipe.json", "fit.json", "stages"),
    "train": ("train_config.json", "train_log.json", "checkpoints"),
    "analysis": ("fidelity.json", "towers.json", "doclength.json", "latency.json"),
    "model": ("twotower.json", "modules.json", "config.json"),
}


def identify(folder: str | Path) -> tuple[str | None, str]:
    """``(kind, evidence)`` of what ``folder`` holds: its marker's kind, else the first kind whose files are there;
    ``(None, "")`` for a missing, empty or unrecognised folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return None, ""
    marker = folder / MARKER
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        if kind in KINDS:
            return kind, MARKER
    for kind, names in SIGNS.items():
        found = [name for name in names if (folder / name).exists()]
        if found:
            return kind, ", ".join(found)
    return None, ""


def claim_output(folder: str | Path, kind: str, *, option: str | None = None, command: str = "") -> None:
    """Refuse ``folder`` when it holds another kind of artifact than ``kind``; otherwise create it if needed and
    mark it as ``kind`` (a marker already there is kept). ``option``: how the message names the folder (default
    ``out`` as the caller knows it: ``out=`` or ``--out``)."""
    if option is None:
        from twotower.checks import flag

        option = flag("out")
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}: one of {', '.join(KINDS)}")
    folder = Path(folder)
    found, evidence = identify(folder)
    if found is not None and found != kind:
        writer = f"{command} writes" if command else "this command writes"
        raise TwoTowerError(f"{option} {folder} holds {KINDS[found]} ({evidence}); {writer} {KINDS[kind]}, and its "
                            f"files would be mixed among those: choose another {option} (a new or empty folder)")
    if kind == "index":
        return  # an index is told by its layout: no marker among its files
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    if not marker.is_file():
        from twotower.io import atomic_write_json

        atomic_write_json(marker, {"kind": kind})
