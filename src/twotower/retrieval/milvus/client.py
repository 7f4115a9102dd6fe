"""Talking to Milvus: the URI and token, one client per URI, Milvus' errors in twotower's words, and when a write is
made durable (:func:`persist`). The collection's schema and ownership: :mod:`.schema`.

A URI is a local ``.db`` path (Milvus Lite: embedded in this process, nothing to start; one process at a time may
open a file) or ``http(s)://host:port`` (a Milvus standalone or distributed server). A server's token (``user:password``
or an API key) is read from the ``TWOTOWER_MILVUS_TOKEN`` environment variable, never from the command line or a
file twotower writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from twotower.checks import flag, given
from twotower.errors import TwoTowerError

log = logging.getLogger(__name__)


def _quiet_pymilvus() -> None:
    """pymilvus logs every failed RPC with a traceback at ERROR (the failures reach the user as TwoTowerErrors
    instead) and warns when Milvus Lite lacks an RPC it can do without (the query iterator's timestamp). Its import
    configures its loggers (``logging.config.dictConfig``), so this runs after it."""
    for name in ("pymilvus", "pymilvus.milvus_client", "pymilvus.bulk_writer"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


# Milvus Lite's failure to open a data folder is logged with a traceback before pymilvus raises; connect() names it
logging.getLogger("milvus_lite.server_manager").setLevel(logging.CRITICAL)


class _UnimplementedRpc(logging.Filter):
    """Drops grpc's traceback for an RPC Milvus Lite's in-process server does not implement (pymilvus asks for
    ``AllocTimestamp`` on every upsert and falls back when refused): noise printed on successful builds."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, NotImplementedError) or "Method not implemented" in str(record.msg))


logging.getLogger("grpc._server").addFilter(_UnimplementedRpc())

# Milvus Lite's server runs in this process (a Python grpc server with grpc's defaults: a client may ping an idle
# connection at most every 5 minutes). pymilvus pings every 10 s even without calls, so after ~30 s idle the server
# answers GOAWAY "too_many_pings" and grpc prints two log lines to stderr after operations that succeeded. A
# connection to the same process needs no keepalive: off (INT_MAX ms), and no pings without calls.
LITE_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}
# A server: Milvus Lite's own server mode is the same Python grpc server (GOAWAY after ~30 s idle, issue #54); a Milvus
# server allows a ping every 5 s. Pings at most every 6 minutes, and only while a call runs: both are content, and a
# call that hangs still fails by its timeout (TWOTOWER_MILVUS_TIMEOUT).
SERVER_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 360_000, "grpc.keepalive_permit_without_calls": 0}

TOKEN_ENV = "TWOTOWER_MILVUS_TOKEN"
USER_ENV, PASSWORD_ENV = "TWOTOWER_MILVUS_USER", "TWOTOWER_MILVUS_PASSWORD"  # instead of a token: user and password
TIMEOUT_ENV = "TWOTOWER_MILVUS_TIMEOUT"  # seconds a server connection may take (default 10)
MAX_VARCHAR = 65_535  # bytes: Milvus' largest VARCHAR
MAX_ID_BYTES = 1_024
DEFAULT_EF_SEARCH = 128  # HNSW ef when a search names none (at least k)
DENSE, SPARSE, METADATA, CODES = "dense", "sparse", "metadata", "codes"


class MilvusError(TwoTowerError):
    """Milvus refused or could not be reached; the message names the URI, the collection and what to do."""


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def is_lite(client, uri: str) -> bool:
    """Whether ``client`` talks to Milvus Lite: a ``.db`` file, or a Lite server (``python -m milvus_lite server``)
    at an http URI, which names itself ``milvus_lite-<version>`` (asked once per client)."""
    if not is_server(uri):
        return True
    lite = getattr(client, "_twotower_lite", None)
    if lite is None:
        try:
            lite = str(client.get_server_version()).startswith("milvus_lite")
        except Exception:  # noqa: BLE001 - a client without the call (a test double) or a server that will not say
            lite = False
        try:
            client._twotower_lite = lite
        except AttributeError:
            pass
    return lite


def persist(client, uri: str, collection: str, *, building: bool = False) -> None:
    """The last step of a write (or, ``building``, of a build): what Milvus needs beyond having acknowledged its rows.
    A server has logged every row it acknowledged (its message queue: RocksMQ standalone, Pulsar or Kafka in a
    cluster) and rebuilds from that log after a restart, so no earlier step flushes; this one does, which seals the
    write's rows into segments searched with the collection's index rather than the interim index a server keeps
    over unsealed rows.

    Milvus Lite is flushed by a build only, before any reader can know the collection (its rows are then searched
    with the collection's index: IVF's lists, HNSW's graph, not one by one from the memtable). A write never flushes
    it: Milvus Lite has written every row it acknowledged to its write-ahead log (in the OS's hands, so a killed
    process loses none) and replays that log when it opens the collection again; and its flush (Milvus Lite 3.2.2)
    swaps the memtable for an empty one before the flushed rows reach its segment cache, so that a query running
    meanwhile misses them: 24 of 1,167 reads of rows acknowledged before the read came back short with a writer
    flushing after each insert, none of 314 without flushes (``benchmarks/experiments/milvus_lite_flush.py``;
    issue #54)."""
    if building or not is_lite(client, uri):
        client.flush(collection)


# Milvus Lite (3.2.2) builds a new segment's index in a background thread after a flush and writes the index file in
# place, outside the lock its load() holds: a load at that moment can read the file half-written and fail with
# numpy's "No data left in file" (once in 6 Milvus Lite server schedules of tests/test_milvus_concurrency.py, in CI).
# The file is whole a moment later, so that failure alone is tried again, this many times in all.
LOAD_TRIES = 4


def load_collection(client, name: str, uri: str) -> None:
    """``client.load_collection(name)``, Milvus Lite's half-written index file (:data:`LOAD_TRIES`) tried again after
    a short wait; every other failure raised at once (the caller names it: :func:`milvus_errors`)."""
    for attempt in range(LOAD_TRIES):
        try:
            client.load_collection(name)
            return
        except Exception as exc:
            if attempt == LOAD_TRIES - 1 or "no data left in file" not in _message(exc).lower():
                raise
            log.info("Milvus at %s, collection '%s': an index file was still being written while loading; loading "
                     "again", uri, name)
            time.sleep(0.25 * (attempt + 1))


def check_uri(uri: str | None, option: str | None = None) -> str:
    """The URI to store: a server's as given (no credentials in it), a Milvus Lite file's as an absolute path."""
    option = option or flag("uri")
    if not uri or not isinstance(uri, str):
        raise TwoTowerError(f"{option}: give a Milvus Lite file (a path ending in .db) or a Milvus server "
                            f"(http://host:19530) for {given('backend', 'milvus')}")
    if is_server(uri):
        parts = urlsplit(uri)
        if parts.username or parts.password:
            raise TwoTowerError(f"{option} {parts.scheme}://…@{parts.hostname}: credentials do not go in the URI; "
                                f"set the environment variable {TOKEN_ENV}=user:password (or an API key)")
        if not parts.hostname:
            raise TwoTowerError(f"{option} {uri!r}: no host; give http://host:19530")
        return uri
    if "://" in uri:
        raise TwoTowerError(f"{option} {uri!r}: a Milvus URI is http(s)://host:port or a local .db file")
    path = Path(uri).expanduser()
    if path.suffix != ".db":
        raise TwoTowerError(f"{option} {uri}: a Milvus Lite file must end in .db (e.g. {path.with_suffix('.db')})")
    if not path.parent.is_dir():
        raise TwoTowerError(f"{option} {uri}: the folder {path.parent} does not exist; create it first")
    _check_lite_folder(path, f"{option} {uri}")
    return str(path.resolve())


def _check_lite_folder(path: Path, where: str) -> None:
    if path.exists() and not path.is_dir():
        raise TwoTowerError(f"{where}: {path} is a file, not a Milvus Lite database (Milvus Lite keeps its data in a "
                            "folder of that name); give a new name or the .db folder a build made")


def quote(value: str) -> str:
    """``value`` as a string literal of Milvus' filter grammar: double quotes, ``\\`` and ``"`` escaped (ids hold no
    whitespace or control characters, see :mod:`twotower.data.ids`; newlines and tabs are escaped anyway). pymilvus'
    own ``ids=`` pastes ids between single quotes unescaped, so ``O'Brien`` broke the expression and ``q','d1`` matched
    two documents; every id reaches Milvus through this function instead."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def ids_filter(ids, field: str = "id") -> str:
    """``field in ["a", "b"]`` over ``ids``, each quoted by :func:`quote`."""
    return f"{field} in [{', '.join(quote(str(i)) for i in ids)}]"


def check_collection_name(name: str, option: str | None = None) -> str:
    """Milvus' rule for names: a letter or _ first, then letters, digits and _ (255 at most)."""
    option = option or flag("collection")
    ok = bool(name) and len(name) <= 255 and (name[0].isascii() and (name[0].isalpha() or name[0] == "_")) and all(
        c.isascii() and (c.isalnum() or c == "_") for c in name)
    if not ok:
        raise TwoTowerError(f"{option} {name!r}: a Milvus collection name starts with a letter or _ and holds only "
                            "letters, digits and _ (at most 255)")
    return name


def default_collection(index_dir: str | Path) -> str:
    """A collection name from the index directory's name (``my-index`` -> ``twotower_my_index``)."""
    stem = "".join(c if c.isascii() and c.isalnum() else "_" for c in Path(index_dir).resolve().name)
    return f"twotower_{stem}"[:255]


def connect(uri: str, option: str | None = None):
    """A ``MilvusClient`` on ``uri``; a file another process holds, a server that does not answer or refuses the
    token: a :class:`MilvusError` naming ``option``."""
    try:
        from pymilvus import MilvusClient
    except ImportError:
        raise TwoTowerError(f"{given('backend', 'milvus')} needs pymilvus and milvus-lite: pip install "
                            "'twotower[milvus]'") from None
    option = option or flag("uri")
    _quiet_pymilvus()
    token = server_token()
    timeout = float(os.environ.get(TIMEOUT_ENV, "10"))
    if not is_server(uri):
        _check_lite_folder(Path(uri), f"{option} {uri}")
    try:
        if is_server(uri):
            return MilvusClient(uri=uri, token=token, timeout=timeout, grpc_options=SERVER_GRPC_OPTIONS)
        return MilvusClient(uri=uri, grpc_options=LITE_GRPC_OPTIONS)
    except Exception as exc:  # pymilvus raises MilvusException and its subclasses, grpc errors, OSError
        msg = _message(exc)
        if is_server(uri):
            if any(w in msg.lower() for w in ("auth", "token", "credential", "password", "permission")):
                raise MilvusError(f"{option} {uri}: Milvus refused the token ({msg}); set {TOKEN_ENV} to a valid "
                                  "user:password or API key") from None
            if _answers(uri):  # pymilvus reports a refused token as a failure to connect (Milvus 2.3.5)
                raise MilvusError(f"{option} {uri}: a server answers there but refused the connection ({msg}); with "
                                  f"authentication on, Milvus refused the token: set {TOKEN_ENV} to a valid "
                                  "user:password or API key (and check that this port is Milvus' gRPC port)") from None
            raise MilvusError(f"{option} {uri}: cannot reach a Milvus server there ({msg or type(exc).__name__}); "
                              "check the host and port, that the server runs, and "
                              f"{TIMEOUT_ENV} (seconds, default 10)") from None
        raise MilvusError(f"{option} {uri}: cannot open the Milvus Lite file ({msg or type(exc).__name__}); only one "
                          "process at a time can open a Milvus Lite file: stop the other one (e.g. a running "
                          "'twotower serve') or use a Milvus server") from None


def _answers(uri: str) -> bool:
    """Whether something accepts TCP connections at the server URI's host and port."""
    import socket

    parts = urlsplit(uri)
    try:
        with socket.create_connection((parts.hostname, parts.port or 19530), timeout=2):
            return True
    except OSError:
        return False


def server_token() -> str:
    """The token for a server: ``TWOTOWER_MILVUS_TOKEN`` (``user:password`` or an API key), else
    ``TWOTOWER_MILVUS_USER`` and ``TWOTOWER_MILVUS_PASSWORD`` joined; empty when none is set (no authentication)."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token and os.environ.get(USER_ENV):
        token = f"{os.environ[USER_ENV]}:{os.environ.get(PASSWORD_ENV, '')}"
    return token


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message.strip():
        return message.strip()
    details = getattr(exc, "details", None)
    if callable(details):  # grpc errors
        with contextlib.suppress(Exception):
            return str(details()).strip()
    return str(exc).strip()


@contextlib.contextmanager
def milvus_errors(uri: str, collection: str, what: str) -> Iterator[None]:
    """Milvus' exceptions inside the block as a :class:`MilvusError` naming the collection and ``what`` failed."""
    try:
        yield
    except TwoTowerError:
        raise
    except Exception as exc:
        if not _is_milvus(exc):
            raise
        msg = _message(exc) or type(exc).__name__
        low = msg.lower()
        if ("not exist" in low or "not found" in low) and "collection" in low:
            raise MilvusError(f"Milvus collection '{collection}' at {uri} does not exist (dropped?): rebuild the "
                              "index with 'twotower index build --backend milvus'") from None
        if any(w in low for w in ("auth", "token", "credential", "permission denied")):
            raise MilvusError(f"Milvus at {uri} refused the token while {what} (collection '{collection}'): set "
                              f"{TOKEN_ENV} to a valid token ({msg})") from None
        raise MilvusError(f"Milvus at {uri}, collection '{collection}': {what} failed: {msg}") from None


def _is_milvus(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    return mod.startswith(("pymilvus", "grpc", "milvus_lite")) or isinstance(exc, ConnectionError)


_CLIENTS: dict[str, object] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(uri: str, option: str):
    """One MilvusClient per URI and process (a Milvus Lite file opens once per process)."""
    with _CLIENTS_LOCK:
        if uri not in _CLIENTS:
            _CLIENTS[uri] = connect(uri, option)
        return _CLIENTS[uri]


def forget_client(uri: str) -> None:
    """Close and drop the cached client of ``uri`` (a Milvus Lite file is then free for another process)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.pop(uri, None)
    if client is not None:
        try:
            client.close()
        except Exception:  # closing a client whose server is gone
            log.debug("closing the Milvus client of %s failed", uri, exc_info=True)
    if not is_server(uri):  # Milvus Lite serves the file from a thread of this process until released
        from milvus_lite import server_manager_instance

        server_manager_instance.release_server(uri)
