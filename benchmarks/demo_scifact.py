"""`make demo`'s two evaluations on BEIR SciFact (test, 300 queries), timed: the one source of the zero-shot BM25 and
dense numbers the README, the docs home and both quickstarts show (docs/hooks/headline.json names this file).

Each row is what `twotower eval` prints for the same command `make demo` runs (runtime `auto`, precision `auto`),
with the runtime that ran, the wall-clock seconds of the whole command (loading, encoding the corpus, searching,
scoring) and the machine. `make demo`'s set-up (a virtual environment and `pip install`, minutes on a fresh
machine, none once done) is not counted.

    python benchmarks/demo_scifact.py [--retrievers bm25,dense]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, RESULTS, write_results  # noqa: E402


def _runtime(detail: dict | None) -> str:
    """What encoded, in a few words: ``openvino-int8 documents, torch bf16 queries`` (``-``: nothing encoded)."""
    parts = [f"{d['runtime']}{'' if d['runtime'].endswith(d['precision']) else ' ' + d['precision']} {what}"
             for what, d in (detail or {}).items() if isinstance(d, dict) and d.get("runtime")]
    return ", ".join(parts) or "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--retrievers", default="bm25,dense")
    parser.add_argument("--data", default=str(DATA / "scifact"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for retriever in args.retrievers.split(","):
            out = Path(tmp) / f"{retriever}.json"
            command = ["twotower", "eval", "--data", args.data, "--split", "test", "--retriever", retriever,
                       "--out", str(out), "--run", str(Path(tmp) / f"{retriever}.trec"), "--no-progress"]
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "twotower.cli", *command[1:]], check=True,
                           stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - t0
            result = json.loads(out.read_text())
            rows.append({"system": retriever, "model": result.get("model") or "-",
                         "runtime": _runtime(result.get("runtime")), "runtime_detail": result.get("runtime") or {},
                         "ndcg@10": round(result["metrics"]["ndcg@10"], 4),
                         "recall@100": round(result["metrics"]["recall@100"], 4),
                         "seconds": round(seconds, 1), "command": " ".join(command[:-5] + command[-1:])})
    previous = RESULTS / "demo_scifact.json"
    if previous.exists() and args.retrievers != "bm25,dense":  # a partial rerun keeps the other rows
        kept = [r for r in json.loads(previous.read_text())["rows"] if r["system"] not in args.retrievers.split(",")]
        rows = sorted(kept + rows, key=lambda r: r["system"])
    load = os.getloadavg()[0]
    write_results("demo_scifact", [{k: v for k, v in r.items() if k != "runtime_detail"} for r in rows],
                  notes="The two `twotower eval` commands of `make demo`, timed one after the other; set-up (venv, "
                  f"pip) not counted. Load average at the end: {load:.1f} on 2 cores (other jobs).",
                  extra={"runtime_detail": {r["system"]: r["runtime_detail"] for r in rows}, "load_average": load})


if __name__ == "__main__":
    main()
