"""Which compressed vector fields the installed Milvus Lite takes (issue #54: binary and half-precision vectors on
Milvus): a collection with a BINARY_VECTOR (BIN_FLAT, Hamming), FLOAT16_VECTOR, BFLOAT16_VECTOR or INT8_VECTOR field
(FLAT / HNSW, inner product) is created, filled with 20 rows and searched, embedded (a ``.db`` folder) and through
Milvus Lite's server mode (``python -m milvus_lite server``); each row says how far it got and Milvus' message.

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


def probe(uri: str, mode: str) -> list[dict]:
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri=uri)
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
            row["result"] = "works" if make is not None else "created (not filled)"
        except Exception as exc:  # noqa: BLE001 - what Milvus answers is the result
            message = getattr(exc, "message", None) or str(exc)
            row["result"] = f"refused at {step}: {' '.join(str(message).split())[:160]}"
        out.append(row)
        print(row, flush=True)
    client.close()
    return out


def main() -> None:
    import milvus_lite
    import pymilvus

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
    _common.write_results("milvus_vector_types", rows, notes=NOTES.format(lite=milvus_lite.__version__,
                                                                           pymilvus=pymilvus.__version__))


NOTES = """\
Milvus Lite {lite}, pymilvus {pymilvus}. Milvus Lite 3.2.2 is the latest milvus-lite on PyPI (`pip index versions
milvus-lite`). The older Milvus Lite 2.5.1 (unpacked into a folder of its own and put first on PYTHONPATH, with a
stand-in for the `pkg_resources` it imports) takes BINARY_VECTOR (BIN_FLAT, Hamming) and FLOAT16_VECTOR, refuses
INT8_VECTOR ("unsupported scalar type"), and as dense indexes has only FLAT and IVF_FLAT ("invalid index type: HNSW,
local mode only support FLAT IVF_FLAT AUTOINDEX"; the same for IVF_SQ8 and HNSW_SQ, which `--vectors int8` uses); it
keeps its data in one file, where twotower's Milvus Lite URIs name the folder 3.x keeps, so tests/test_milvus.py
stops at its first build with it. Binary and half-precision vectors on Milvus therefore wait for a Milvus server to
test them on.
"""

if __name__ == "__main__":
    main()
