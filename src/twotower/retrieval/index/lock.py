"""One writer at a time: an exclusive ``flock`` on ``INDEX/.lock``.

The holder writes who it is into the lock file (pid, host, command, since when); a writer that has
waited ~1 s logs a warning naming the lock file and that holder, then keeps waiting.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
NOTICE_AFTER_S = 1.0
_POLL_S = 0.05


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its holder wrote it (or a note that it is not known)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8", errors="replace") or "null")
    except (OSError, json.JSONDecodeError):
        info = None
    if not isinstance(info, dict) or "pid" not in info:
        return "held by another process that did not say which"
    where = f" on {info['host']}" if info.get("host") and info["host"] != socket.gethostname() else ""
    text = f"held by pid {info['pid']}{where}"
    if info.get("command"):
        text += f" ({info['command']})"
    if info.get("since"):
        text += f" since {info['since']}"
    return text


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


# how long a writer waits for the lock before giving up with an error (None: as long as it takes); the commands and
# Index.add / Index.remove set it (--lock-timeout, lock_timeout=) around their writes
_TIMEOUT: ContextVar[float | None] = ContextVar("twotower_lock_timeout", default=None)
DEFAULT_TIMEOUT_S = 60.0  # what the commands and Index.add / Index.remove wait unless told otherwise


@contextlib.contextmanager
def lock_timeout(seconds: float | None) -> Iterator[None]:
    """Writers inside this block give up after ``seconds`` (0: at once; None: wait as long as it takes)."""
    from twotower.checks import check_number

    check_number(seconds, "lock_timeout", minimum=0, optional=True, hint="seconds to wait for another writer")
    token = _TIMEOUT.set(seconds)
    try:
        yield
    finally:
        _TIMEOUT.reset(token)


def _acquire(fd: int, path: Path, notice_after: float) -> None:
    from twotower.checks import option_name

    timeout = _TIMEOUT.get()
    t0 = time.monotonic()
    while time.monotonic() - t0 < min(notice_after, timeout if timeout is not None else notice_after):
        if _try_lock(fd):
            return
        time.sleep(_POLL_S)
    if _try_lock(fd):
        return
    flag = option_name("lock_timeout")
    if timeout is None:
        log.warning("waiting for the index lock %s (%s): another writer is changing this index", path, holder(path))
        fcntl.flock(fd, fcntl.LOCK_EX)
        log.warning("got the index lock %s after %.1f s", path, time.monotonic() - t0)
        return
    if timeout > notice_after:
        log.warning("waiting up to %g s for the index lock %s (%s): another writer is changing this index", timeout,
                    path, holder(path))
    while time.monotonic() - t0 < timeout:
        if _try_lock(fd):
            log.warning("got the index lock %s after %.1f s", path, time.monotonic() - t0)
            return
        time.sleep(_POLL_S)
    from twotower.retrieval.index.errors import IndexStoreError

    raise IndexStoreError(f"{path}: the index is locked by another writer ({holder(path)}); gave up after {timeout:g} s "
                          f"with nothing changed: run again when it has finished, or wait longer with {flag}")


def _record_holder(handle) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:300],
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    handle.seek(0)
    handle.truncate(0)
    handle.write(json.dumps(info) + "\n")
    handle.flush()


@contextlib.contextmanager
def writer_lock(root: Path, *, notice_after: float = NOTICE_AFTER_S) -> Iterator[None]:
    """Hold the index's writer lock (``root`` is created if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    with path.open("a") as handle:
        _acquire(handle.fileno(), path, notice_after)
        try:
            _record_holder(handle)
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
