"""Talking to Milvus: the URI and token, Milvus' errors in twotower's words, the collection's schema and index types,
and the checks that a collection is the one an index directory names.

A URI is a local ``.db`` path (Milvus Lite: embedded in this process, nothing to start; one process at a time may
open a file) or ``http(s)://host:port`` (a Milvus standalone or distributed server). A server's token (``user:password``
or an API key) is read from the ``TWOTOWER_MILVUS_TOKEN`` environment variable, never from the command line or a
file twotower writes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
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
SCHEMA_VERSION = 5  # 2: rows keyed <write>:<id> with added/removed write numbers, a __state collection; 3: metadata;
# 4: rows keyed <attempt>:<id> with the attempt's token, and each document's BM25 length and the avgdl of its weights;
# 5: a row per passage (``passage``, ``span_start``, ``span_end``), the document's own row being passage 0
MAX_VARCHAR = 65_535  # bytes: Milvus' largest VARCHAR
MAX_ID_BYTES = 1_024
DEFAULT_EF_SEARCH = 128  # HNSW ef when a search names none (at least k)
DENSE, SPARSE, METADATA, CODES = "dense", "sparse", "metadata", "codes"
# index kinds twotower builds on Milvus: --kind -> Milvus index type
INDEX_TYPES = {"flat": "FLAT", "hnsw": "HNSW", "ivf": "IVF_FLAT"}
PROPERTY = "twotower"  # collection properties: twotower.index_id, twotower.model, twotower.dim, twotower.schema


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


def index_settings(kind: str, *, hnsw_m: int, ef_construction: int, nlist: int | None, num_docs: int,
                   vectors: str = "fp32") -> dict:
    """The Milvus index for ``--kind`` and ``--vectors``: ``{"index_type", "params"}`` (metric IP on normalised
    vectors). ``int8``: Milvus' 8-bit scalar-quantized indexes (HNSW_SQ, IVF_SQ8; ``flat``: IVF_SQ8 with one list,
    an exhaustive scan of the codes, as the local int8 index); ``binary``: BIN_FLAT or BIN_IVF_FLAT (Hamming,
    :mod:`.vectors`)."""
    if kind not in INDEX_TYPES:
        raise TwoTowerError(f"{given('kind', kind)}: on Milvus choose one of {', '.join(INDEX_TYPES)} (FAISS factory "
                            f"strings and ivfpq need {given('backend', 'faiss')})")
    if vectors == "binary":  # Milvus' binary indexes: an exhaustive scan or inverted lists, Hamming distance
        if kind == "hnsw":
            raise TwoTowerError(f"{given('kind', 'hnsw')} with {given('vectors', 'binary')}: Milvus indexes binary "
                                f"vectors as BIN_FLAT or BIN_IVF_FLAT; choose {given('kind', 'flat')} or "
                                f"{given('kind', 'ivf')} (or {given('backend', 'faiss')} for a binary HNSW)")
        if kind == "ivf":
            n = nlist or max(1, min(65_536, int(4 * math.sqrt(max(1, num_docs)))))
            return {"index_type": "BIN_IVF_FLAT", "params": {"nlist": int(n)}}
        return {"index_type": "BIN_FLAT", "params": {}}
    if vectors == "int8":
        if kind == "hnsw":
            return {"index_type": "HNSW_SQ", "params": {"M": int(hnsw_m), "efConstruction": int(ef_construction),
                                                        "sq_type": "SQ8"}}
        n = 1 if kind == "flat" else nlist or max(1, min(65_536, int(4 * math.sqrt(max(1, num_docs)))))
        return {"index_type": "IVF_SQ8", "params": {"nlist": int(n)}}
    if kind == "hnsw":
        return {"index_type": "HNSW", "params": {"M": int(hnsw_m), "efConstruction": int(ef_construction)}}
    if kind == "ivf":
        n = nlist or max(1, min(65_536, int(4 * math.sqrt(max(1, num_docs)))))
        return {"index_type": "IVF_FLAT", "params": {"nlist": int(n)}}
    return {"index_type": "FLAT", "params": {}}


def create_collection(client, name: str, *, dim: int, lexical: bool, index: dict, properties: dict,
                      uri: str, vectors=None) -> None:
    """The collection: ``pk`` (primary key ``<attempt>:<id>``), ``id``, ``title``, ``text``, ``dense`` (``dim``
    floats), ``added`` / ``removed`` (the writes that added and removed the row) and ``attempt`` (the token of the
    write attempt that wrote it: see :mod:`.state`) and, with ``lexical``, ``sparse`` (twotower's BM25 weights),
    ``length`` (the document's number of BM25 terms) and ``avgdl`` (the average length its weights were computed
    with: :mod:`.lexical`), ``metadata`` (JSON: the document's metadata, ``{}`` when it
    has none; filters run on it, :mod:`.filtering`); its dense index as ``index`` says, metric IP.

    A document is one row per passage (:mod:`.writes`): ``passage`` numbers them from 0, ``span_start`` /
    ``span_end`` are the passage's character offsets into the document's text. Passage 0's row is the document's:
    it alone holds the title, the text and the BM25 vector; every row holds the metadata (filters select rows).

    ``vectors`` (a :class:`.vectors.MilvusVectors`; default fp32): ``dense``'s type and metric, and for binary
    vectors rescored from codes a ``codes`` field."""
    from pymilvus import DataType

    with milvus_errors(uri, name, "creating the collection"):
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_BYTES + 48)
        schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
        schema.add_field("passage", DataType.INT64)
        schema.add_field("span_start", DataType.INT64)
        schema.add_field("span_end", DataType.INT64)
        schema.add_field("added", DataType.INT64)
        schema.add_field("removed", DataType.INT64)
        schema.add_field("attempt", DataType.INT64)
        schema.add_field("length", DataType.INT64)
        schema.add_field("avgdl", DataType.DOUBLE)
        schema.add_field("title", DataType.VARCHAR, max_length=MAX_VARCHAR)
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_VARCHAR)
        schema.add_field(METADATA, DataType.JSON)
        schema.add_field(DENSE, getattr(DataType, vectors.field_type if vectors else "FLOAT_VECTOR"), dim=int(dim))
        if vectors is not None and vectors.rescores:
            schema.add_field(CODES, DataType.VARCHAR, max_length=vectors.codes_length)
        if lexical:
            schema.add_field(SPARSE, DataType.SPARSE_FLOAT_VECTOR)
        params = client.prepare_index_params()
        # pymilvus 3 sends the settings as top-level keys, which a Milvus server reads; Milvus Lite reads only a
        # "params" key (without it, IVF got 128 lists and HNSW its defaults whatever was asked): both
        settings = dict(index["params"])
        params.add_index(DENSE, index_type=index["index_type"], metric_type=vectors.metric if vectors else "IP",
                         params={**settings, "params": settings} if settings else {})
        if lexical:
            params.add_index(SPARSE, index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        client.create_collection(name, schema=schema, index_params=params,
                                 properties={f"{PROPERTY}.{k}": str(v) for k, v in properties.items()},
                                 consistency_level="Strong")


def owner_properties(client, name: str, uri: str) -> dict | None:
    """The twotower properties of collection ``name`` (``{}`` for a collection twotower did not make), None when
    there is no such collection."""
    with milvus_errors(uri, name, "reading the collection"):
        if not client.has_collection(name):
            return None
        described = client.describe_collection(name)
    props = described.get("properties") or {}
    out = {k.split(".", 1)[1]: v for k, v in props.items() if k.startswith(PROPERTY + ".")}
    for field in described.get("fields", []):
        if field.get("name") == DENSE:
            out["field_dim"] = str((field.get("params") or {}).get("dim"))
    return out


def check_owner(client, manifest: dict, index_dir: Path) -> None:
    """The collection the manifest names exists and was built for this index (its id, model and dimension)."""
    m = manifest["milvus"]
    uri, name = m["uri"], m["collection"]
    props = owner_properties(client, name, uri)
    if props is None:
        raise MilvusError(f"{index_dir}: its Milvus collection '{name}' at {uri} does not exist (dropped?): rebuild "
                          "the index with 'twotower index build --backend milvus'")
    want_model = str(manifest["model"].get("name"))
    if props.get("index_id") != m["index_id"]:
        raise MilvusError(
            f"{index_dir}: the Milvus collection '{name}' at {uri} belongs to another index (model "
            f"{props.get('model', 'unknown')}, {props.get('field_dim', '?')}-d vectors, corpus "
            f"{props.get('corpus', 'unknown')[:12]}…), not to this one (model {want_model}, {manifest['dim']}-d, corpus "
            f"{str((manifest.get('corpus') or {}).get('fingerprint', ''))[:12]}…): rebuild this index into a "
            f"collection of its own ({flag('collection')})")
    if props.get("schema") != str(SCHEMA_VERSION):
        raise MilvusError(f"{index_dir}: the Milvus collection '{name}' at {uri} has the layout of an older twotower "
                          f"(schema {props.get('schema')}, this one reads {SCHEMA_VERSION}): rebuild the index with "
                          "'twotower index build --backend milvus'")
    if props.get("field_dim") != str(manifest["dim"]) or props.get("model") != want_model:
        raise MilvusError(f"{index_dir}: the Milvus collection '{name}' at {uri} holds {props.get('field_dim')}-d "
                          f"vectors of model {props.get('model')}, the manifest says {manifest['dim']}-d of "
                          f"{want_model}: rebuild the index")


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
