"""Atomic writers never replace what is not theirs to replace; output options are checked up front."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from twotower.errors import TwoTowerError
from twotower.io import (
    atomic_directory,
    atomic_write_json,
    atomic_write_text,
    check_output_dir,
    check_output_file,
    check_output_files,
    path_kind,
)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    if len(str(path)) > 100:  # AF_UNIX paths are limited to ~107 bytes
        pytest.skip(f"temp path too long for a unix socket: {path}")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the socket file stays
    return path


def _char_device(path: Path) -> Path:
    """A character device node of our own (the null device's numbers): never a real /dev entry."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot create a device node here ({exc})")
    return path


SPECIAL = {"fifo": (_fifo, "FIFO"), "socket": (_socket, "socket"), "device": (_char_device, "character device")}


def _snapshot(path: Path) -> tuple:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_writers_refuse_special_files(tmp_path, kind):
    make, word = SPECIAL[kind]
    target = make(tmp_path / "out")
    before = _snapshot(target)
    for write in (lambda: atomic_write_text(target, "x"), lambda: atomic_write_json(target, {"a": 1})):
        with pytest.raises(TwoTowerError, match=f"{target} exists and is a {word}.*refusing to replace it"):
            write()
    with pytest.raises(TwoTowerError, match=f"is a {word}.*, not a directory"):
        with atomic_directory(target) as tmp:
            (tmp / "f").write_text("x")
    assert _snapshot(target) == before  # the same node, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp file or folder left behind


def test_writers_refuse_a_symlink_even_to_a_regular_file(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("precious\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(TwoTowerError, match=r"is a symbolic link \(to .*real.json\).*replace the link itself"):
        atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "precious\n"
    # a link to /dev/full (what a root user once lost): refused, the link and the device untouched
    dev_link = tmp_path / "full"
    dev_link.symlink_to("/dev/full")
    with pytest.raises(TwoTowerError, match="symbolic link"):
        atomic_write_text(dev_link, "x")
    assert dev_link.is_symlink() and path_kind("/dev/full") in (None, "a character device")


def test_writers_refuse_a_directory_and_atomic_directory_refuses_a_file(tmp_path):
    folder = tmp_path / "results"
    (folder / "inner").mkdir(parents=True)
    with pytest.raises(TwoTowerError, match="is a directory, not a regular file"):
        atomic_write_text(folder, "x")
    assert (folder / "inner").is_dir()
    afile = tmp_path / "model"
    afile.write_text("not a folder")
    with pytest.raises(TwoTowerError, match="is a regular file, not a directory"):
        with atomic_directory(afile):
            pytest.fail("atomic_directory must refuse before the work starts")
    assert afile.read_text() == "not a folder"
    linked = tmp_path / "linked-model"
    linked.symlink_to(folder)
    with pytest.raises(TwoTowerError, match="symbolic link"):
        with atomic_directory(linked):
            pytest.fail("atomic_directory must refuse before the work starts")
    assert linked.is_symlink() and (folder / "inner").is_dir()


def test_writers_still_replace_regular_files_and_directories(tmp_path):
    target = tmp_path / "sub" / "r.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert target.read_text() == '{\n  "a": 2\n}\n' and stat.S_ISREG(os.lstat(target).st_mode)
    folder = tmp_path / "model"
    for n in range(2):
        with atomic_directory(folder) as tmp:
            (tmp / "weights").write_text(str(n))
    assert (folder / "weights").read_text() == "1"


# ---- up-front checks ------------------------------------------------------------------------


def test_check_output_file(tmp_path):
    check_output_file(None, "--out")
    check_output_file(tmp_path / "new" / "deeper" / "r.json", "--out")  # parents get created later
    assert not (tmp_path / "new").exists()  # the check creates nothing
    (tmp_path / "old.json").write_text("{}")
    check_output_file(tmp_path / "old.json", "--out")
    with pytest.raises(TwoTowerError, match=f"--run {tmp_path} exists and is a directory.*give the path of a file"):
        check_output_file(tmp_path, "--run")
    with pytest.raises(TwoTowerError, match="--out .* is a FIFO"):
        check_output_file(_fifo(tmp_path / "pipe"), "--out")
    (tmp_path / "link").symlink_to(tmp_path / "old.json")
    with pytest.raises(TwoTowerError, match="--out .*link is a symbolic link"):
        check_output_file(tmp_path / "link", "--out")
    with pytest.raises(TwoTowerError, match=r"--out .*old.json/r.json: .*old.json is a regular file, not a directory"):
        check_output_file(tmp_path / "old.json" / "r.json", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "old.json", "pipe"]  # no probe file left


def test_check_output_file_unwritable_folder(tmp_path):
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0o500)
    elif Path("/proc/self").is_dir():
        locked = Path("/proc")  # root may write anywhere except in pseudo file systems like this one
    else:
        pytest.skip("running as root without /proc: no folder that refuses new files")
    try:
        with pytest.raises(TwoTowerError, match=f"--out {locked}/r.json: cannot create files in {locked} "):
            check_output_file(locked / "r.json", "--out")
        with pytest.raises(TwoTowerError, match=f"--out {locked}/a/b: cannot create files in {locked} "):
            check_output_dir(locked / "a" / "b", "--out")
    finally:
        if locked != Path("/proc"):
            os.chmod(locked, 0o700)


def test_check_output_files_distinct(tmp_path):
    check_output_files(("--out", tmp_path / "r.json"), ("--run", None), ("--page", tmp_path / "r.md"))
    with pytest.raises(TwoTowerError, match="--out and --run both name"):
        check_output_files(("--out", tmp_path / "r.json"), ("--run", tmp_path / "." / "r.json"))


def test_check_output_dir(tmp_path):
    check_output_dir(None, "--out")
    check_output_dir(tmp_path / "a" / "b", "--out")
    check_output_dir(tmp_path, "--out")
    (tmp_path / "run-link").symlink_to(tmp_path, target_is_directory=True)
    check_output_dir(tmp_path / "run-link", "--out")  # written into, not replaced: a link to a folder is fine
    (tmp_path / "f").write_text("x")
    with pytest.raises(TwoTowerError, match="--out .*f exists and is a regular file, not a directory"):
        check_output_dir(tmp_path / "f", "--out")
    with pytest.raises(TwoTowerError, match="is a FIFO"):
        check_output_dir(_fifo(tmp_path / "pipe"), "--out")
    with pytest.raises(TwoTowerError, match="f is a regular file, not a directory"):
        check_output_dir(tmp_path / "f" / "sub", "--out")
