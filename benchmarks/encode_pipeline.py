"""The encoding pipeline without the model: ``encode_texts`` with a no-op tower against the tokenizer alone (issue #47).

Everything ``encode_documents`` does besides the forward pass (tokenization, length sorting, batching, padding into
numpy / torch, copies back into the output) against the fastest tokenization the library offers: the fast tokenizer's
backend ``encode_batch_fast`` on the same texts at the same max length (a copy of the backend with truncation on; its
``Encoding`` objects are not even read). The no-op tower returns zeros of the tower's width, so what is timed is the
pipeline. Texts: the SciFact corpus (title + text) × ``--repeat``; nothing in either system caches texts (each
copy is tokenized again). Both take turns on ``--slice``-text slices, the order reversed every other slice.
Target (issue #47): the no-op pipeline ≥ 0.9 × the tokenizer alone.

    python benchmarks/encode_pipeline.py [--repeat 2] [--slice 2048] [--batch-size 32]

Results: results/encode_pipeline.{json,md}.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import DATA, interleaved, load_average, write_results
from twotower.data.beir import BeirDataset
from twotower.encoders.inference import encode_texts
from twotower.encoders.towers import DualEncoder


class NoOpTower(torch.nn.Module):
    """A tower's interface (tokenizer, max_length, dim, a parameter for its device) whose forward returns zeros."""

    def __init__(self, tower) -> None:
        super().__init__()
        self.tokenizer, self.max_length, self.dim = tower.tokenizer, tower.max_length, tower.dim
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(input_ids), self.dim)


def tokenizer_alone(tokenizer, max_length: int):
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.enable_truncation(max_length)
    return lambda texts: np.zeros((len(backend.encode_batch_fast(texts)), 1), dtype=np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--slice", type=int, default=2048)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=None, help="the pipeline's batch (default: the device's)")
    args = ap.parse_args()
    load_start = load_average()
    ds = BeirDataset.load(args.data, "test")
    texts = [d.full_text for d in ds.corpus.values()] * args.repeat
    tower = DualEncoder.load(doc_max_length=args.max_length).doc_tower
    noop = NoOpTower(tower)
    systems = {
        "tokenizer alone (backend encode_batch_fast)": tokenizer_alone(tower.tokenizer, args.max_length),
        "twotower pipeline, no-op model": lambda t: encode_texts(noop, t, max_length=args.max_length,
                                                                 batch_size=args.batch_size, precision="fp32",
                                                                 show_progress=False),
    }
    out = interleaved(systems, texts, args.slice, show_progress=False)
    base = len(texts) / out["tokenizer alone (backend encode_batch_fast)"][1]
    rows = [{"system": name, "docs": len(texts), "docs_per_s": len(texts) / secs,
             "x_tokenizer_alone": len(texts) / secs / base} for name, (_, secs) in out.items()]
    for row in rows:
        print(row, flush=True)
    load_end = load_average()
    write_results("encode_pipeline", rows, extra={"load_average": {"start": load_start, "end": load_end},
                                                  "settings": vars(args)}, notes=(
        f"SciFact corpus ({len(texts) // args.repeat} documents, title + text) × {args.repeat}, max length "
        f"{args.max_length}, the pipeline's batch {args.batch_size or 'default (32 on a CPU)'}; the two systems take "
        f"turns on {args.slice}-text slices. torch threads {torch.get_num_threads()}; load average {load_start:.1f} "
        f"at start, {load_end:.1f} at end (other work on the machine: compare the ratio, not the rates). Neither "
        "system caches texts. x_tokenizer_alone = docs/s / the tokenizer alone's docs/s (target ≥ 0.9)."))


if __name__ == "__main__":
    main()
