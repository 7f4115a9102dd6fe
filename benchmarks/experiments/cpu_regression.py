"""Is CPU encoding any slower than at an earlier commit? ``encode_texts`` of ``--before`` (read with ``git show``)
against this checkout's, on the same SciFact documents, taking turns slice by slice (load falls on both alike).

    python benchmarks/experiments/cpu_regression.py [--before 8a3a97e] [--docs 768]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from twotower.data.beir import load_corpus
from twotower.encoders import inference
from twotower.encoders.towers import DualEncoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common.py
from _common import DATA, interleaved, load_average, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def module_at(commit: str, path: str):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], check=True, capture_output=True,
                            text=True).stdout
    file = Path(tempfile.mkdtemp()) / "inference_before.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location("inference_before", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="8a3a97e", help="the commit to compare with (default: before the GPU work)")
    ap.add_argument("--docs", type=int, default=768)
    args = ap.parse_args()
    before = module_at(args.before, "src/twotower/encoders/inference.py")
    docs = list(load_corpus(DATA / "scifact" / "corpus.jsonl").values())[: args.docs]
    texts = [d.full_text for d in docs]
    tower = DualEncoder.load(None, device="cpu").doc_tower
    res = interleaved({f"encode_texts at {args.before}": lambda x: before.encode_texts(tower, x, batch_size=32,
                                                                                        show_progress=False),
                       "encode_texts now": lambda x: inference.encode_texts(tower, x, show_progress=False)},
                      texts, slice_size=128, show_progress=False)
    (old_vecs, old_s), (new_vecs, new_s) = res.values()
    rows = [{"system": name, "docs_per_s": len(texts) / secs} for name, (_, secs) in res.items()]
    rows[1]["ratio_to_before"] = old_s / new_s
    rows[1]["max_abs_diff"] = float(np.abs(old_vecs - new_vecs).max())
    write_results("cpu_regression", rows, notes=(
        f"{len(texts)} SciFact documents, the default model, precision auto = "
        f"{inference.resolve_precision('auto', torch.device('cpu'))}, batch 32 (both: the CPU default), slices of 128 "
        f"taking turns. Load average at the end: {load_average():.1f}."))
    print(rows, file=sys.stderr)


if __name__ == "__main__":
    main()
