"""Shared by the benchmark scripts: machine facts and the JSON + markdown result files."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(os.environ.get("TWOTOWER_DATA", ROOT.parent / "shared" / "data"))


def machine() -> dict:
    from twotower.analysis._common import machine_info

    return {**machine_info(), "platform": platform.platform()}


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.1e}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def portable(text: str, *, repo: Path = ROOT, home: Path | None = None, tmp: Path | None = None) -> str:
    """``text`` with this machine's absolute paths written so that they read the same in any clone: the
    repository's relative to it (``/work/main/.cache/a`` -> ``.cache/a``, the repository itself ``.``), its parent
    folder's as ``../`` (``/work/shared/data`` -> ``../shared/data``, where ``DATA`` looks), the home folder's as
    ``~/`` and the temporary folder's as ``<tmp>/``. For a result's markdown; its JSON keeps the command as typed."""
    home = Path.home() if home is None else home
    tmp = Path(tempfile.gettempdir()) if tmp is None else tmp
    swaps = {str(tmp): "<tmp>", str(home): "~", str(repo.parent): "..", str(repo): "."}
    for prefix in sorted((p for p in swaps if len(p) > 1), key=len, reverse=True):  # the repository before its parent
        short = swaps[prefix]
        text = re.sub(rf"(?<![\w.~$:/-]){re.escape(prefix)}(?![\w.-])(/)?",
                      lambda m, s=short: ("" if s == "." else s + "/") if m.group(1) else s, text)
    return text


def write_results(name: str, rows: list[dict], *, notes: str = "", extra: dict | None = None) -> Path:
    """Write ``results/<name>.json`` and ``results/<name>.md`` (same rows, as a table; the markdown's paths
    ``portable``)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"command": " ".join(["python", *sys.argv]), "machine": machine(), "rows": rows, **(extra or {})}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = [f"# {name}", "", f"Command: `{payload['command']}`", "",
             f"Machine: {payload['machine']['cpu']}, {payload['machine']['cores']} cores, torch {payload['machine']['torch']}"
             + (f", CPU flags {' '.join(payload['machine']['cpu_flags'])}" if payload["machine"].get("cpu_flags")
                else ""), ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    if notes:
        lines += ["", notes.strip()]
    (RESULTS / f"{name}.md").write_text(portable("\n".join(lines) + "\n"))
    return RESULTS / f"{name}.json"


def interleaved(systems: dict, texts: list[str], slice_size: int = 256, show_progress: bool = True) -> dict:
    """Run every system on the same slices of ``texts``, alternating the order slice by slice,
    so that load from other processes falls on all systems alike. Each system is a function
    ``texts -> np.ndarray``. Returns ``{name: (embeddings, seconds)}``."""
    import time

    import numpy as np
    from tqdm.auto import tqdm

    names = list(systems)
    for n in names:  # warm-up: first-call costs (lazy copies, allocator growth) are not throughput
        systems[n](texts[:8])
    parts = {n: [] for n in names}
    seconds = dict.fromkeys(names, 0.0)
    slices = range(0, len(texts), slice_size)
    for k, start in enumerate(tqdm(slices, desc="interleaved encoding", disable=not show_progress)):
        chunk = texts[start : start + slice_size]
        order = names if k % 2 == 0 else names[::-1]
        for n in order:
            t0 = time.perf_counter()
            parts[n].append(systems[n](chunk))
            seconds[n] += time.perf_counter() - t0
    return {n: (np.concatenate(parts[n]), seconds[n]) for n in names}


def query_latency(systems: dict, doc_vecs, queries: list[str], block: int = 50) -> dict[str, dict]:
    """Batch-1 query latency (encode one query + exact top-10 over ``doc_vecs``) per system, p50/p99 in
    ms. Each system is ``query -> (1, dim) array``. The queries are cut into blocks of ``block``; every
    system runs each block back to back (as a server would), the systems taking turns block by block in
    alternating order, so slow drifts in load fall on all alike. Not query by query: two runtimes'
    thread pools alternating on 2 cores slow each other (torch's OpenMP threads spin after each call),
    which measured ORT at 11.3 ms interleaved vs 7.3 ms back to back. The first 10 queries warm up."""
    import time

    import numpy as np

    from twotower.retrieval.dense import exact_search

    names = list(systems)
    for q in queries[:10]:
        for n in names:
            systems[n](q)
    times = {n: [] for n in names}
    for k, start in enumerate(range(0, len(queries), block)):
        for n in names if k % 2 == 0 else names[::-1]:
            for q in queries[start : start + block]:
                t0 = time.perf_counter()
                exact_search(systems[n](q), doc_vecs, 10)
                times[n].append((time.perf_counter() - t0) * 1000)
    return {n: {"p50_ms": float(np.percentile(t, 50)), "p99_ms": float(np.percentile(t, 99))} for n, t in times.items()}


def vector_metrics(qrels, qids, query_vecs, doc_ids, doc_vecs, metrics=("ndcg@10", "recall@100"), k: int = 1000) -> dict:
    """``metrics`` of an exact top-``k`` search of ``query_vecs`` (rows = ``qids``) over ``doc_vecs``."""
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import exact_search, to_run

    scores, idx = exact_search(query_vecs, doc_vecs, k)
    return evaluate(qrels, to_run(qids, doc_ids, scores, idx), metrics)


def load_average() -> float:
    return os.getloadavg()[0]


def cached_row(work: Path, name: str, settings: dict, compute) -> dict:
    """The row ``name`` kept in ``<work>/rows/`` when it was made with the same ``settings``; else
    ``{"system": name, **compute()}``, kept there for the next run. Lets a long benchmark run in
    pieces: a re-run with the same ``--work`` skips finished rows (a row cut off midway runs again)."""
    import json

    path = work / "rows" / (name.replace(" ", "_").replace("+", "plus") + ".json")
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings:
            print(f"{name}: done in an earlier run ({path})", flush=True)
            return saved["row"]
    row = {"system": name, **compute()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "row": row}, indent=2))
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return row


def encoding_parser(description: str, *, default_limit: int = 0):
    """The options every encoding benchmark shares: data folder, document limit, batch size, max length."""
    import argparse

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--limit", type=int, default=default_limit,
                    help="encode only the first N documents (0 = all; NDCG needs all)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=256)
    return ap


def test_documents(args):
    """``(dataset, doc_ids, texts)``: the test split and its first ``--limit`` documents (title + text)."""
    from twotower.data.beir import BeirDataset

    ds = BeirDataset.load(args.data, "test")
    doc_ids = list(ds.corpus)[: args.limit or None]
    return ds, doc_ids, [ds.corpus[d].full_text for d in doc_ids]


def st_encoder(args):
    """``(model, encode)``: sentence-transformers on the default model, fp32, normalised, at ``--max-length``."""
    from sentence_transformers import SentenceTransformer

    from twotower.encoders.backbone import default_model_path

    st = SentenceTransformer(str(default_model_path()), device="cpu")
    st.max_seq_length = args.max_length

    def encode(items):
        return st.encode(items, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                         show_progress_bar=False)

    return st, encode
