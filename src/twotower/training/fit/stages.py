"""Stage markers that make ``twotower fit`` resumable: each finished stage leaves ``OUT/stages/<name>/done.json``
(its results, written last and atomically); a rerun with the same OUT skips every stage that has one. The
recipe and the data set are recorded in ``OUT/recipe.json`` on the first run, and a rerun with a different
recipe or data is refused (its finished stages would not be what the new recipe asks for)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from twotower.checks import flag
from twotower.errors import TwoTowerError
from twotower.io import atomic_write_json

RECIPE_FILE = "recipe.json"
# recipe settings added later, with the value a fit recorded without them ran with (its training read each
# positive's first window)
BEFORE_THEY_EXISTED = {"train_passage": "first"}


class StageLog:
    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.computed: list[str] = []  # stages this process ran (the rest came from markers)

    def dir(self, name: str) -> Path:
        path = self.out / "stages" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def done(self, name: str) -> dict | None:
        marker = self.out / "stages" / name / "done.json"
        if not marker.is_file():
            return None
        return json.loads(marker.read_text())

    def finish(self, name: str, result: dict, started: float) -> dict:
        result = {**result, "wall_s": round(time.perf_counter() - started, 1)}
        atomic_write_json(self.dir(name) / "done.json", result)
        self.computed.append(name)
        return result

    def claim(self, recipe: dict, data: str, *, ignore: tuple[str, ...] = ()) -> bool:
        """Record (first run) or check (rerun) the recipe and the data, except its keys in ``ignore`` (settings a
        rerun may change); True when resuming."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / RECIPE_FILE
        mine = {"data": data, "recipe": recipe}
        if not path.is_file():
            atomic_write_json(path, mine)
            return False
        try:
            theirs = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise TwoTowerError(f"{path}: not valid JSON; {flag('out')} holds a damaged fit run: pass a new "
                                f"{flag('out')}") from None
        if isinstance(theirs, dict) and isinstance(theirs.get("recipe"), dict):
            # a recipe written before a setting existed ran with what that setting now calls it
            older = {k: v for k, v in BEFORE_THEY_EXISTED.items() if k in recipe and k not in theirs["recipe"]}
            theirs = {**theirs, "recipe": {k: v for k, v in {**theirs["recipe"], **older}.items() if k not in ignore}}
        mine = {"data": data, "recipe": {k: v for k, v in recipe.items() if k not in ignore}}
        if theirs != mine:
            changed = sorted(k for k in {**theirs.get("recipe", {}), **mine["recipe"]}
                             if theirs.get("recipe", {}).get(k) != mine["recipe"].get(k))
            if theirs.get("data") != data:
                changed.insert(0, f"data ({theirs.get('data')} then, {data} now)")
            raise TwoTowerError(f"{self.out} holds a fit run with a different recipe (changed: {', '.join(changed)}); "
                                f"rerun with the same options to resume it, or pass a new {flag('out')}")
        return True
