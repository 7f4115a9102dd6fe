"""A real Milvus server for tests and benchmarks, offline: the standalone Milvus 2.3.5 binary that PyPI's ``milvus``
package ships (``pip install milvus==2.3.5``: the server, its embedded etcd and its local storage; nothing is
downloaded when it starts). Milvus Lite has no binary vector field (``results/milvus_vector_types.md``); this server
has one, so ``--vectors binary`` on Milvus is tested against it (its float16 field crashes the server at the first
write into a loaded collection: "panic: unsupported data type: Float16Vector").

What this server lacks: sparse vectors (Milvus 2.4), so the indexes built on it have no BM25 part (``bm25=False``),
and more than one vector field per collection.

A folder a server used before is opened again with what it holds (after a SIGKILL too). The interim index
Milvus 2.3 builds over growing segments (an IVF over unsealed rows) is switched off: with it, a FLAT index's
answers over rows not yet sealed are approximate, which the parity tests would mistake for a bug.

Example::

    with milvus_server(tmp_path / "milvus") as server:
        store = MilvusStore.build(..., uri=server.uri)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT_TOKEN = "root:Milvus"  # a new Milvus server's own user and password
SETTINGS = {"queryNode.segcore.interimIndex.enableIndex": "false", "log.level": "warn"}
# The tests' server keeps the same guarantees with shorter waits (benchmarks keep the server's defaults): a strongly
# consistent query waits for the next time tick (proxy.timeTickInterval, 200 ms by default: an upsert and a query
# took ~400 ms, 40 ms at 20), and a server restarted after a SIGKILL waits for the dead one's etcd session to expire
# (common.session.ttl, 30 s by default) before it serves its collections.
TEST_SETTINGS = {"proxy.timeTickInterval": "20", "common.session.ttl": "5"}


def available() -> str | None:
    """None when the server can start here, else why not (a skip reason that says what to install)."""
    try:
        import milvus  # noqa: F401  (PyPI milvus==2.3.5: the standalone server)
    except ImportError:
        return "needs PyPI's milvus==2.3.5 (the standalone Milvus server): make setup installs it"
    if not Path("/proc").exists() or os.uname().sysname != "Linux":
        return "the milvus==2.3.5 server binary runs on Linux"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Running(NamedTuple):
    uri: str  # http://127.0.0.1:PORT
    pid: int  # the server process
    folder: Path  # its data: etcd, write-ahead log, segment and index files
    http: str  # its HTTP side: /healthz, /metrics (Prometheus, with the Go runtime's memory), /debug/pprof


@contextlib.contextmanager
def milvus_server(folder: str | Path, *, authentication: bool = False,
                  settings: dict[str, str] | None = None) -> Iterator[Running]:
    """A Milvus server with its data in ``folder``, listening on free ports of 127.0.0.1, running until the block ends
    (then SIGTERM, SIGKILL after 1 s). ``authentication``: clients must give a token (the server's own user ``root``,
    password ``Milvus``: :data:`ROOT_TOKEN`). A ``folder`` a server used before (stopped, or killed with SIGKILL) is
    opened again with what it holds, on new ports (``Index.attach`` reaches its collections there). ``settings``: more
    of the server's configuration, dotted keys (the tests give :data:`TEST_SETTINGS`)."""
    import milvus
    from milvus import MilvusServer, MilvusServerConfig

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    client_port, peer_port = _free_port(), _free_port()
    # the embedded etcd's peer port (2380) is not in the package's template: without a config file of its own, a
    # second server on the machine fails to start ("listen tcp 127.0.0.1:2380: bind: address already in use")
    etcd = folder / "etcd.yaml"
    etcd.write_text("\n".join([
        "name: default", f"data-dir: {folder / 'data' / 'etcd.data'}",
        f"listen-client-urls: http://127.0.0.1:{client_port}", f"advertise-client-urls: http://127.0.0.1:{client_port}",
        f"listen-peer-urls: http://127.0.0.1:{peer_port}", f"initial-advertise-peer-urls: http://127.0.0.1:{peer_port}",
        f"initial-cluster: default=http://127.0.0.1:{peer_port}", ""]))
    template = (Path(milvus.__file__).parent / "data" / "config.yaml.template").read_text()
    anchor = "  use:\n    embed: true"
    if anchor not in template:
        raise RuntimeError("milvus==2.3.5's config template changed: pin milvus==2.3.5")
    (folder / "config.yaml.template").write_text(template.replace(anchor, f"  config:\n    path: {etcd}\n{anchor}"))
    config = MilvusServerConfig(data_dir=str(folder), template=str(folder / "config.yaml.template"),
                                etcd_port=client_port)
    config.glog_conf_file = str(Path(milvus.__file__).parent / "data" / "glog.conf")  # set only without a template
    for key, value in {**SETTINGS, **(settings or {})}.items():
        config.set(key, value)
    config.set("authorization_enabled", bool(authentication))
    server = MilvusServer(config)
    # the package picks each port as the first free one from a fixed start, then lets go of it until the binary
    # binds it: two servers starting at once (two test files on two workers) would pick the same ports
    with open(Path(tempfile.gettempdir()) / "twotower-milvus-server-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server.start()  # waits for /healthz (at most 180 s; ~8 s here), its ports bound by then
    try:
        yield Running(f"http://127.0.0.1:{server.listen_port}", server.server_proc.pid, folder,
                      f"http://127.0.0.1:{server.webservice_port}")
    finally:
        server.stop()


@contextlib.contextmanager
def lite_server(data_dir: str | Path) -> Iterator[str]:
    """A Milvus Lite server (``python -m milvus_lite server``) on a free loopback port over ``data_dir``, for tests
    of several clients or processes on one server; yields its ``http://127.0.0.1:PORT`` uri once it accepts
    connections (within 120 s), and stops it on the way out."""
    import subprocess
    import sys
    import time

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data_dir),
                             "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.time() < deadline and proc.poll() is None, "the Milvus Lite server did not start"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
