"""Training checkpoints: what one holds, where it goes, and which one a resume may continue from.

A checkpoint is a folder ``checkpoints/step-<global step>`` written atomically: the model, the optimizer and
schedule, every random state (CPU and CUDA), the objective's extra state, the run's full log so far and the
settings it was made with. Resuming takes the newest checkpoint that loads; a damaged one (a truncated file
after a full disk or a kill during a copy) is reported and the one before it is used. Settings that decide
the data order or the model (``RESUME_INVARIANTS``) must equal the checkpoint's, or resuming is refused.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from twotower.checks import flag, switch
from twotower.errors import TwoTowerError
from twotower.io import atomic_directory, atomic_write_json
from twotower.training.config import RESUME_INVARIANTS, RUN_ONLY_STAGE_KEYS, TrainConfig

log = logging.getLogger(__name__)

CHECKPOINT_FILES = ("state.json", "model.pt", "optim.pt", "rng.pt")


def checkpoint_name(global_step: int) -> str:
    return f"step-{global_step:08d}"


def complete_checkpoints(folder: Path) -> list[Path]:
    """Checkpoint folders with every file present, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("step-*") if all((p / f).is_file() for f in CHECKPOINT_FILES))


def save_checkpoint(folder: Path, *, stage: int, step: int, global_step: int, model: torch.nn.Module,
                    optimizer, scheduler, objective_state: dict, history: list[dict], config: TrainConfig,
                    keep: int) -> Path:
    target = folder / checkpoint_name(global_step)
    with atomic_directory(target) as tmp:
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        if objective_state:
            torch.save(objective_state, tmp / "objective.pt")
        atomic_write_json(tmp / "state.json", {"stage": stage, "step": step, "global_step": global_step,
                                               "config": asdict(config), "history": history})
    for stale in complete_checkpoints(folder)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)
    return target


def read_checkpoint(path: Path, device: torch.device) -> dict:
    """Everything in one checkpoint, loaded; raises whatever a damaged file raises."""
    state = json.loads((path / "state.json").read_text())
    state["model"] = torch.load(path / "model.pt", map_location=device, weights_only=True)
    state["optim"] = torch.load(path / "optim.pt", map_location=device, weights_only=False)
    state["rng"] = torch.load(path / "rng.pt", weights_only=False)
    extra = path / "objective.pt"
    state["objective"] = torch.load(extra, map_location=device, weights_only=True) if extra.is_file() else {}
    state["path"] = path
    return state


def newest_loadable(folder: Path, device: torch.device) -> dict | None:
    """The newest checkpoint that loads, falling back past damaged ones (each reported); None if none exist."""
    found = complete_checkpoints(folder)
    for path in reversed(found):
        try:
            return read_checkpoint(path, device)
        except Exception as exc:  # noqa: BLE001 - any damage (truncated zip, bad JSON): try the previous one
            log.warning("checkpoint %s cannot be read (%s: %s); trying the one before it", path,
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    if found:
        raise TwoTowerError(f"{folder}: none of the {len(found)} checkpoints can be read (see the warnings); "
                            f"start again without {flag('resume')} in a new {flag('out')}")
    return None


def check_resumable(saved: dict | None, config: TrainConfig, where: Path) -> None:
    """Refuse to resume with settings that differ from the checkpoint's in what decides the model or the
    data order (a different batch size or step count would silently train something else)."""
    if not saved:
        return  # checkpoints written before settings were recorded
    now = asdict(config)
    diffs = []
    for key in RESUME_INVARIANTS:
        if key == "stages":
            for i, (a, b) in enumerate(zip(saved.get("stages", []), now["stages"]), start=1):
                diffs += [f"stage {i} {k}: {a.get(k)!r} -> {b.get(k)!r}" for k in b
                          if k in a and a[k] != b[k] and k not in RUN_ONLY_STAGE_KEYS]
            if len(saved.get("stages", [])) != len(now["stages"]):
                diffs.append(f"stages: {len(saved.get('stages', []))} -> {len(now['stages'])}")
        elif key in saved and saved[key] != now[key]:
            diffs.append(f"{key}: {saved[key]!r} -> {now[key]!r}")
    if diffs:
        raise TwoTowerError(f"{where}: {switch('resume')} with settings that differ from the checkpoint's "
                            f"({'; '.join(diffs)}); run with the checkpoint's settings, or start a new run in another "
                            f"{flag('out')}")


def check_run_dir(out: Path, *, resume: bool, start: dict | None) -> None:
    """What a run may do with ``out`` (``start``: the checkpoint a resume continues from, if any): never write into
    an index, never overwrite a run without --resume, never restart over a finished model on --resume."""
    from twotower.outputs import identify

    kind, evidence = identify(out)
    if kind not in (None, "train"):  # an index, a fit, analyses, a model: never mixed with a run's files
        from twotower.outputs import claim_output

        claim_output(out, "train", command="twotower train (or pretrain)")  # raises, naming what the folder holds
    if resume:
        if start is None and (out / "model").exists():
            raise TwoTowerError(f"{out}: {switch('resume')} found no checkpoint in {out / 'checkpoints'} but a "
                                f"finished model in {out / 'model'}: there is nothing to continue, and starting again "
                                f"would replace it; choose another {flag('out')}")
        return
    held = [name for name in ("model", "checkpoints", "train_log.json") if (out / name).exists()]
    if held:
        raise TwoTowerError(f"{out} already holds a training run ({', '.join(held)}): pass {switch('resume')} to "
                            f"continue it, or choose another {flag('out')}")
