"""Which compressed vector fields the installed Milvus Lite takes (issue #54: binary and half-precision vectors on
Milvus): a collection with a BINARY_VECTOR (BIN_FLAT, Hamming), FLOAT16_VECTOR, BFLOAT16_VECTOR or INT8_VECTOR field
(FLAT / HNSW, inner product) is created, filled with 20 rows and searched, then 2,000 rows more are written, flushed
and searched, embedded (a ``.db`` folder), through Milvus Lite's server mode (``python -m milvus_lite server``) and
on the standalone Milvus 2.3.5 server from PyPI (``tests/milvus_server.py``); each row says how far it got and
Milvus' message (for a server that stopped, the first ``panic:`` line of its log).

    python benchmarks/milvus_vector_types.py
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import _common  # noqa: E402

DIM = 64


def _cases(DataType, rng):
    return [
        ("BINARY_VECTOR", "BIN_FLAT", "HAMMING", lambda: np.packbits(rng.integers(0, 2, DIM)).tobytes()),
        ("FLOAT16_VECTOR", "FLAT", "IP", lambda: rng.standard_normal(DIM).astype(np.float16)),
        ("BFLOAT16_VECTOR", "FLAT", "IP", None),  # numpy has no bfloat16: created only
        ("INT8_VECTOR", "HNSW", "IP", lambda: rng.integers(-128, 127, DIM, dtype=np.int8)),
    ]


def probe(uri: str, mode: str, log: Path | None = None) -> list[dict]:
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri=uri, timeout=30)
    rng = np.random.default_rng(0)
    out = []
    for name, index, metric, make in _cases(DataType, rng):
        row = {"mode": mode, "field": name, "index": f"{index} / {metric}"}
        step = "create_collection"
        try:
            schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("pk", DataType.INT64, is_primary=True)
            schema.add_field("v", getattr(DataType, name), dim=DIM)
            params = client.prepare_index_params()
            params.add_index("v", index_type=index, metric_type=metric, params={})
            client.create_collection(f"t_{name.lower()}", schema=schema, index_params=params)
            if make is not None:
                step = "insert"
                rows = [{"pk": i, "v": make()} for i in range(20)]
                client.insert(f"t_{name.lower()}", rows)
                step = "search"
                client.search(f"t_{name.lower()}", data=[rows[0]["v"]], anns_field="v", limit=3,
                              search_params={"metric_type": metric})
                step = "a second write (2,000 rows, flush) and search"
                client.insert(f"t_{name.lower()}", [{"pk": 100 + i, "v": make()} for i in range(2_000)])
                client.flush(f"t_{name.lower()}")
                client.search(f"t_{name.lower()}", data=[rows[0]["v"]], anns_field="v", limit=3,
                              search_params={"metric_type": metric})
            row["result"] = "works" if make is not None else "created (not filled)"
        except Exception as exc:  # noqa: BLE001 - what Milvus answers is the result
            message = getattr(exc, "message", None) or str(exc)
            panic = _panic(log)
            if panic:
                row["result"] = f"the server stopped at {step}: {panic[:160]}"
                out.append(row)
                print(row, flush=True)
                break  # nothing more can be asked of it
            row["result"] = f"refused at {step}: {' '.join(str(message).split())[:160]}"
        out.append(row)
        print(row, flush=True)
    client.close()
    return out


def _panic(log: Path | None) -> str:
    """The first ``panic:`` line of a server's log (empty: none, or no log)."""
    if log is None or not log.is_file():
        return ""
    return next((line.strip() for line in log.read_text(errors="replace").splitlines() if line.startswith("panic:")),
                "")


def main() -> None:
    import milvus_lite
    import pymilvus

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from milvus_server import available, milvus_server

    rows = []
    with tempfile.TemporaryDirectory(prefix="milvus-types-") as work:
        rows += probe(str(Path(work) / "t.db"), "embedded (.db)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(Path(work) / "srv"),
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 120
            while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit("the Milvus Lite server did not start")
                time.sleep(0.2)
            rows += probe(f"http://127.0.0.1:{port}", "server mode")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        if available() is None:
            with milvus_server(Path(work) / "standalone") as server:
                rows += probe(server.uri, "Milvus 2.3.5 server", server.folder / "logs" / "milvus-stderr.log")
    _common.write_results("milvus_vector_types", rows, notes=NOTES.format(lite=milvus_lite.__version__,
                                                                           pymilvus=pymilvus.__version__))


NOTES = """\
Milvus Lite {lite}, pymilvus {pymilvus}. Milvus Lite 3.2.2 is the latest milvus-lite on PyPI (`pip index versions
milvus-lite`). The older Milvus Lite 2.5.1 (unpacked into a folder of its own and put first on PYTHONPATH, with a
stand-in for the `pkg_resources` it imports) takes BINARY_VECTOR (BIN_FLAT, Hamming) and FLOAT16_VECTOR, refuses
INT8_VECTOR ("unsupported scalar type"), and as dense indexes has only FLAT and IVF_FLAT ("invalid index type: HNSW,
local mode only support FLAT IVF_FLAT AUTOINDEX"; the same for IVF_SQ8 and HNSW_SQ, which `--vectors int8` uses); it
keeps its data in one file, where twotower's Milvus Lite URIs name the folder 3.x keeps, so tests/test_milvus.py
stops at its first build with it. The standalone Milvus 2.3.5 server (PyPI `milvus==2.3.5`) takes BINARY_VECTOR:
`--vectors binary` on Milvus is built for and tested on it (`tests/test_milvus_server.py`).
"""

if __name__ == "__main__":
    main()
