"""OpenVINO on a corpus: the throughput-compiled model's streams (``runtimes_tower.MANY_BATCHES`` = 2, the default)
against one request at a time on the latency-compiled model, for the runtimes ``auto`` picks on AMX (openvino-int8 with
bf16 float parts, and openvino bf16), taking turns on the same ``--docs`` SciFact documents, ``--reps`` times each; the
rows give every rep's docs/s and the best (issue #47).

    python benchmarks/experiments/openvino_streams.py [--docs 512] [--reps 3]

Results: results/openvino_streams.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import DATA, load_average, write_results  # noqa: E402
from twotower.data.beir import BeirDataset  # noqa: E402
from twotower.encoders import runtimes, runtimes_tower  # noqa: E402
from twotower.encoders.towers import DualEncoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    start_load = load_average()
    texts = [d.full_text for d in BeirDataset.load(DATA / "scifact", "test").corpus.values()][: args.docs]
    tower = DualEncoder.load(doc_max_length=256).doc_tower
    default_many = runtimes_tower.MANY_BATCHES
    rows = []
    for runtime, precision in (("openvino-int8", "auto"), ("openvino", "bf16")):
        extra = {"texts": texts} if runtime == "openvino-int8" else {}
        graph = runtimes.graph_for(tower, runtime, precision, **extra)
        graph.encode(texts[:256])  # warm-up: both compiled models, the int8 check
        rates: dict[str, list[float]] = {"streams (throughput model)": [], "one request (latency model)": []}
        for _ in range(args.reps):
            for name, many in (("streams (throughput model)", default_many), ("one request (latency model)", 10**9)):
                runtimes_tower.MANY_BATCHES = many
                t0 = time.perf_counter()
                graph.encode(texts)
                rates[name].append(round(len(texts) / (time.perf_counter() - t0), 1))
        runtimes_tower.MANY_BATCHES = default_many
        for name, got in rates.items():
            rows.append({"system": f"{runtime} {graph.precision}: {name}", "docs_per_s_best": max(got),
                         "docs_per_s_each": got})
        print(rows[-2:], flush=True)
    write_results("openvino_streams", rows, notes=(
        f"all-MiniLM-L6-v2, max length 256, the first {args.docs} SciFact documents in one encode call (batches of "
        f"{runtimes_tower.AMX_BATCH} on AMX), the two ways taking turns, {args.reps} reps. Load average {start_load:.1f} "
        f"at start, {load_average():.1f} at end."))


if __name__ == "__main__":
    main()
