"""A writer killed mid-write, for the Milvus crash tests (``test_milvus_writes.py`` on Milvus Lite,
``test_milvus_server_writes.py`` on a server): a child process opens the index and adds, replaces or removes
documents, and SIGKILLs itself at the step ``TWOTOWER_MILVUS_CRASH_AT`` names (:func:`twotower.retrieval.milvus.state
.crash_point`); :func:`rerun` runs the same write to its end in this process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import twotower as tt
from conftest import subprocess_env
from twotower.retrieval.milvus.client import forget_client

CHILD = textwrap.dedent(
    """
    import json, sys
    import twotower as tt

    index = tt.Index.open(sys.argv[1], precision="fp32")
    op, arg = sys.argv[2], json.loads(open(sys.argv[3]).read())
    if op == "remove":
        index.remove(arg)
    else:
        index.add(arg, replace=(op == "replace"))
    print("DONE", len(index), flush=True)
    """
)


def crash(path, op: str, arg, point: str, tmp_path) -> None:
    """``op`` (add, replace, remove) of ``arg`` on the index at ``path`` by a child killed at step ``point``;
    inserts of 256 rows, so that a few hundred documents make several batches."""
    (tmp_path / "arg.json").write_text(json.dumps(arg))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), op, str(tmp_path / "arg.json")],
                          capture_output=True, text=True, timeout=300,
                          env=subprocess_env(TWOTOWER_MILVUS_CRASH_AT=point, TWOTOWER_MILVUS_LOCK_SETTLE="0.01",
                                             TWOTOWER_MILVUS_BATCH_ROWS="256"))
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stdout, proc.stderr[-3000:])


def rerun(path, op: str, arg) -> None:
    """The same write, run to its end here."""
    index = tt.Index.open(path, precision="fp32")
    try:
        if op == "remove":
            index.remove(arg)
        else:
            index.add(arg, replace=(op == "replace"))
    finally:
        forget_client(index.info()["milvus"]["uri"])
