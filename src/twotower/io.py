"""Atomic writes: a temp file (or folder) beside the target, then one rename over it.

The writers never replace something that is not what they write: a path that exists and is not
a regular file (for :func:`atomic_directory`: not a directory) is refused with a
:class:`TwoTowerError` naming it and its kind. That includes a symbolic link, even one to a
regular file: renaming over the link would replace the link itself, not the file it points to.
Commands call :func:`check_output_file` / :func:`check_output_dir` on their output options before
any loading, so a bad ``--out`` fails in a second, not after the work.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from typing import BinaryIO
from contextlib import contextmanager
from pathlib import Path

from twotower.errors import TwoTowerError

REGULAR_FILE, DIRECTORY, SYMLINK = "a regular file", "a directory", "a symbolic link"
_KINDS = (
    (stat.S_ISREG, REGULAR_FILE),
    (stat.S_ISDIR, DIRECTORY),
    (stat.S_ISLNK, SYMLINK),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def path_kind(path: str | Path) -> str | None:
    """What is at ``path`` (a final symbolic link is not followed), e.g. ``"a FIFO (named pipe)"``;
    None when nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _check_replaceable(path: Path, want: str, option: str | None = None) -> None:
    """Raise unless ``path`` is absent or is ``want`` (REGULAR_FILE or DIRECTORY) itself."""
    kind = path_kind(path)
    where = f"{option} {path}" if option else str(path)
    if kind == REGULAR_FILE == want:
        mode = os.stat(path).st_mode
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
            # the rename would replace it whatever its mode (the folder's permissions decide): refuse, as for a
            # file we could not open for writing; mode bits too, since root's access() ignores them
            raise TwoTowerError(f"{where} is read-only (mode {stat.S_IMODE(mode):04o}): refusing to replace it; "
                                f"make it writable (chmod u+w {path}) or give another path")
        return
    if kind is None or kind == want:
        return
    what = "file" if want == REGULAR_FILE else "directory"
    if kind == SYMLINK:
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise TwoTowerError(
            f"{where} is a symbolic link (to {target}): twotower writes its output {what} atomically, renaming a new "
            f"{what} over the path, which would replace the link itself rather than what it points to, so it refuses; "
            f"give the link's target ({Path(path).resolve()}) or remove the link")
    hint = "give the path of a file (inside it or elsewhere)" if kind == DIRECTORY else "give another path"
    raise TwoTowerError(f"{where} exists and is {kind}, not {want}: "
                        f"refusing to replace it; {hint}")


_FULL = (errno.ENOSPC, errno.EDQUOT)
# how libraries that write through C (FAISS, bm25s' numpy) report a full disk in a RuntimeError's text
_FULL_WORDS = ("No space left on device", "errno 28", "errno=28", "Disk quota exceeded")


def is_disk_full(exc: BaseException) -> bool:
    """``exc`` says the disk (or the user's quota) is full: an OSError ENOSPC/EDQUOT, or a library's RuntimeError
    (FAISS: "... write error ... errno 28") carrying those words."""
    if isinstance(exc, OSError):
        # numpy's tofile (np.save) reports a short write without an errno: "34536 requested and 21472 written"
        short = exc.errno is None and "requested and" in str(exc) and "written" in str(exc)
        return exc.errno in _FULL or short
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in _FULL_WORDS)


def disk_full_error(path: str | Path, what: str = "") -> TwoTowerError:
    return TwoTowerError(f"no space left on {path}{f' ({what})' if what else ''}: nothing was half-written (the "
                         "partial files were removed and what was there is as it was); free some space, or write "
                         "elsewhere, and run it again")


@contextmanager
def reporting_full_disk(path: str | Path, what: str = "") -> Iterator[None]:
    """Turn a full disk met inside the block (see :func:`is_disk_full`) into a :class:`TwoTowerError` saying "no
    space left on <path>"; the block's own cleanup (temp files removed) has run by then."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if is_disk_full(exc):
            raise disk_full_error(path, what) from None
        raise


def preallocate(path: str | Path) -> None:
    """Reserve the disk blocks of the file at ``path`` (its current size) now, so that writing through a memory
    map of it cannot meet a full disk (which is a SIGBUS that kills the process, not an error): a full disk is
    ENOSPC here instead."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno in _FULL:
                    raise
                # no fallocate on this file system (EOPNOTSUPP, EINVAL): write the zeros through the file
                os.lseek(fd, 0, os.SEEK_SET)
                block = b"\0" * (1 << 20)
                left = size
                while left:
                    left -= os.write(fd, block[: min(left, len(block))])
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temp file beside it, fsynced, renamed over it); a full disk is a
    :class:`TwoTowerError` "no space left on <path>" with the temp file removed and ``path`` as it was."""
    path = Path(path)
    _check_replaceable(path, REGULAR_FILE)
    with reporting_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _check_replaceable(path, REGULAR_FILE)  # again: something may have appeared there meanwhile
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temp directory beside ``path``; on success it replaces ``path`` in one rename.

    An existing ``path`` is moved aside first and deleted only after the new one is in place, so
    a crash leaves either the old directory or the new one (plus, at worst, a stale temp folder).
    An existing ``path`` that is not a directory (a file, a symbolic link, ...) is refused up front.
    """
    path = Path(path)
    _check_replaceable(path, DIRECTORY)
    with reporting_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        os.chmod(tmp, 0o777 & ~_umask())
        try:
            yield tmp
            _check_replaceable(path, DIRECTORY)
            old = None
            if path.exists():
                old = path.parent / f".{path.name}.old-{os.getpid()}"
                os.replace(path, old)
            os.replace(tmp, path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


# ---- reading files a user names -------------------------------------------------------------

MiB = 1 << 20


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def open_input(path: str | Path, option: str | None = None, *, what: str = "file") -> BinaryIO:
    """A binary handle on ``path``, a file the user named (``option``, e.g. ``"--api-key-file"``, names it in
    messages), refused with a :class:`TwoTowerError` unless it is a regular file (a symbolic link to one is fine).

    A FIFO, a device (``/dev/zero``, a terminal), a socket or a directory is refused before one byte is read: the
    file is opened non-blocking (opening a FIFO without a writer would wait forever), checked with ``fstat`` on the
    open descriptor (so nothing can be swapped in between), then switched back to blocking reads."""
    where = f"{option} {path}" if option else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise TwoTowerError(f"{where}: {what} not found; check the path") from None
    except OSError as exc:
        raise TwoTowerError(f"{where}: cannot open the {what} ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            hint = "give the path of a file inside it" if kind == DIRECTORY else "give the path of a regular file"
            raise TwoTowerError(f"{where} is {kind}, not a regular file: twotower reads only regular files; {hint}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(path: str | Path, option: str | None = None, *, limit: int = 64 * MiB,
                     what: str = "file") -> bytes:
    """The bytes of a user's file (see :func:`open_input`), refused when over ``limit`` bytes: a results JSON, a
    key file or a config is small, and reading a huge one whole would exhaust memory."""
    where = f"{option} {path}" if option else str(path)
    with open_input(path, option, what=what) as handle:
        size = os.fstat(handle.fileno()).st_size
        data = b"" if size > limit else handle.read(limit + 1)
    if size > limit or len(data) > limit:
        raise TwoTowerError(f"{where}: the {what} is {_size(max(size, len(data)))}, more than the {_size(limit)} "
                            f"such a file can be; is it the right file?")
    return data


def read_input_text(path: str | Path, option: str | None = None, *, limit: int = 64 * MiB,
                    what: str = "file") -> str:
    """:func:`read_input_bytes` decoded as UTF-8 (a leading byte-order mark dropped); bytes that are not UTF-8 are
    a :class:`TwoTowerError` naming the line and column."""
    data = read_input_bytes(path, option, limit=limit, what=what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"{option} {path}" if option else str(path)
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TwoTowerError(f"{where}, line {line}: bytes that are not UTF-8 at column {column} "
                            f"({data[exc.start:exc.start + 4]!r}); save the {what} as UTF-8") from None


# ---- up-front checks for commands' output options -------------------------------------------


def check_output_file(path: str | Path | None, option: str) -> None:
    """Check, before any work, that the command option ``option`` (e.g. ``"--out"``) can be written
    as a file at ``path``: nothing there, or a regular file (not a directory, symbolic link, FIFO,
    device or socket), and its folder exists or can be created and takes new files. None: no-op."""
    if path is None:
        return
    path = Path(path)
    _check_replaceable(path, REGULAR_FILE, option)
    _check_writable_folder(path.parent, option, path)


def check_output_files(*outputs: tuple[str, str | Path | None]) -> None:
    """:func:`check_output_file` for each ``(option, path)``, and no two options naming one file."""
    seen: dict[Path, str] = {}
    for option, path in outputs:
        check_output_file(path, option)
        if path is None:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise TwoTowerError(f"{seen[key]} and {option} both name {path}: the second would overwrite the first; "
                                f"give two different files")
        seen[key] = option


def check_not_inputs(outputs, inputs) -> None:
    """Refuse an output option ``(option, path)`` that names one of the command's existing ``inputs`` (files it
    reads): writing results there would destroy the data the command was given."""
    existing = {Path(p).resolve(): Path(p) for p in inputs if p is not None and Path(p).is_file()}
    for option, path in outputs:
        if path is not None and Path(path).resolve() in existing:
            raise TwoTowerError(f"{option} {path} is an input of this command ({existing[Path(path).resolve()]}): "
                                f"writing there would destroy it; give another file")


def check_output_dir(path: str | Path | None, option: str, *, replaced: bool = False) -> None:
    """Check, before any work, that ``option`` can name an output folder at ``path``: nothing there
    (its parent can be created), or a directory that takes new files. A symbolic link to a directory
    is fine for a folder the command writes into, and refused with ``replaced=True`` (a folder
    written whole by :func:`atomic_directory`, which would replace the link). None: no-op."""
    if path is None:
        return
    path = Path(path)
    if replaced:
        _check_replaceable(path, DIRECTORY, option)
    kind = path_kind(path)
    if kind == SYMLINK and path.is_dir():  # written into, never replaced: a link to a folder is fine
        kind = DIRECTORY
    if kind not in (None, DIRECTORY):
        raise TwoTowerError(f"{option} {path} exists and is {kind}, not a directory: give a folder path "
                            f"(it is created when missing)")
    _check_writable_folder(path if kind == DIRECTORY else path.parent, option, path)


def _check_writable_folder(folder: Path, option: str, target: Path) -> None:
    """The nearest existing ancestor of ``folder`` (itself included) is a directory that takes a new file."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        if path_kind(existing) == SYMLINK:
            raise TwoTowerError(f"{option} {target}: {existing} is a broken symbolic link; fix or remove it")
        existing = existing.parent
    if not existing.is_dir():
        raise TwoTowerError(f"{option} {target}: {existing} is {path_kind(existing) or 'missing'}, not a directory; "
                            f"give a path inside a folder")
    try:  # a real probe: permissions, read-only file systems and ACLs all show up here
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".twotower-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise TwoTowerError(f"{option} {target}: cannot create files in {existing} ({exc.strerror or exc}); "
                            f"give a path in a writable folder") from None


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB blocks."""
    import hashlib

    with Path(path).open("rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


# numpy parses a .npy header with ast.literal_eval, and CPython 3.11 before 3.11.8 can fail an AST built while another
# thread builds one ("SystemError: AST constructor recursion depth mismatch", cpython gh-106905): index readers and
# writers open .npy files in threads (serve, refresh), so every such open takes this lock (BM25's load as well).
NPY_LOCK = threading.Lock()


def load_npy(path: str | Path, mmap_mode: str | None = None):
    """``np.load(path, mmap_mode=...)`` of one array, its header parsed under :data:`NPY_LOCK`."""
    import numpy as np

    with NPY_LOCK:
        return np.load(path, mmap_mode=mmap_mode)
