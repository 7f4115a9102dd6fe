"""``twotower index build|add|remove|attach|info`` (and ``list|count|get|delete|update``: cli.index_manage): persistent index directories (``tt.Index``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import (BATCH_HELP, COMPILE_HELP, DEVICE_HELP, LANGUAGE_HELP, RUNTIME_HELP, console,
                                  err_console, fail)
from twotower.cli.helpers import check_output_dir
from twotower.cli.options import Progress
from twotower.errors import TwoTowerError

LOCK_HELP = ("Seconds to wait while another writer holds the index's lock, then give up with nothing changed "
             "(0: at once).")
index_app = typer.Typer(help="Build and grow a persistent index directory.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    from twotower.cli.index_manage import add_commands

    add_commands(index_app)  # list, count, get, delete, update
    app.add_typer(index_app, name="index")


@index_app.command("build")
def index_build(
    data: str = typer.Option(..., "--data", help="A folder of files (.txt .md .html .pdf .docx, read "
                             "recursively: one document per file, its id the relative path), one such file, a glob "
                             "('docs/**/*.md'), a BEIR directory (its corpus.jsonl) or a corpus .jsonl file (fields "
                             "other than _id/id, title and text are kept as metadata)."),
    out: Path = typer.Option(..., "--out", help="Index directory (created; an index already there is refused "
                             "unless --replace or --append)."),
    replace_: bool = typer.Option(False, "--replace", help="Replace the documents of the index already at --out."),
    append: bool = typer.Option(False, "--append", help="Add the documents to the index already at --out."),
    max_file_mb: Optional[float] = typer.Option(None, "--max-file-mb", help="Files: skip any larger than this "
                                                "(default 64)."),
    model: Optional[str] = typer.Option(None, help="Encoder directory (default: all-MiniLM-L6-v2)."),
    kind: str = typer.Option("flat", help="flat | hnsw | ivf | ivfpq | any FAISS factory string"),
    hnsw_m: int = typer.Option(32, "--hnsw-m", min=2, help="HNSW graph degree M."),
    ef_construction: int = typer.Option(200, "--ef-construction", min=1),
    nlist: Optional[int] = typer.Option(None, "--nlist", min=1, help="IVF lists (default ≈ 4·√n)."),
    pq_m: Optional[int] = typer.Option(None, "--pq-m", min=1, help="IVF-PQ sub-quantizers (default dim/8)."),
    bm25: Optional[bool] = typer.Option(None, "--bm25/--no-bm25", help="Also store a BM25 index (default: on; "
                                        "--mode bm25|hybrid|rrf, and searches default to hybrid); --no-bm25: dense "
                                        "only."),
    bigrams: bool = typer.Option(False, "--bigrams", help="BM25 over unigrams + bigrams."),
    language: Optional[str] = typer.Option(None, "--language", help=LANGUAGE_HELP + " Implies --bm25."),
    multivector: Optional[int] = typer.Option(None, "--multivector", min=1,
                                              help="ME-BERT: keep the first M token vectors per document (default: the M the model was trained with, if any)."),
    project: Optional[int] = typer.Option(None, "--project", min=1,
                                          help="Multi-vector: random projection of token vectors to this many dims."),
    vectors: str = typer.Option("fp32", "--vectors", help="How vectors are stored: fp32 | fp16 | int8 (per-dimension "
                                "ranges from the corpus) | binary (sign bits searched by Hamming distance, "
                                "then rescored). --backend milvus: fp32 | int8 | binary (a Milvus server)."),
    dim: Optional[int] = typer.Option(None, "--dim", help="Keep the first D dimensions of every vector, "
                                      "re-normalised (Matryoshka-trained models); queries are cut the same way."),
    rescore: Optional[str] = typer.Option(None, "--rescore", help="--vectors binary: rescore the Hamming "
                                          "candidates against int8 (default) or fp32 vectors memory-mapped from "
                                          "disk, or none."),
    rescore_factor: int = typer.Option(4, "--rescore-factor", help="--vectors binary: rescore k × this many "
                                       "Hamming candidates."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
    precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
    progress: Progress = True,
    use_ray: bool = typer.Option(False, "--ray", help="Encode on Ray: an actor pool holding the model."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="auto | local | ray://host:port"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Ray actors (default: one per CPU/GPU)."),
    gpus_per_worker: float = typer.Option(0.0, "--gpus-per-worker", min=0.0, help="Ray: GPUs per actor."),
    backend: str = typer.Option("faiss", "--backend", help="faiss (vectors, documents and BM25 in --out) | milvus "
                                "(in a Milvus collection; --out keeps the manifest)."),
    uri: Optional[str] = typer.Option(None, "--uri", help="--backend milvus: a Milvus Lite file (path ending in "
                                      ".db) or a server http(s)://host:19530 (token: $TWOTOWER_MILVUS_TOKEN)."),
    collection: Optional[str] = typer.Option(None, "--collection", help="--backend milvus: the collection "
                                             "(default: twotower_<name of --out>)."),
    runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
    passages: Optional[bool] = typer.Option(None, "--passages/--no-passages", help="Split documents longer than "
                                            "the encoder's window into passages, one vector each, a document scored "
                                            "by its best (default: on; not with --ray); --no-passages keeps "
                                            "each document's first window."),
    passage_window: Optional[int] = typer.Option(None, "--passage-window", help="Tokens per passage, title "
                                                 "included (default: the encoder's document length)."),
    passage_overlap: Optional[int] = typer.Option(None, "--passage-overlap", help="Tokens two neighbouring "
                                                  "passages share (default: an eighth of the window, 32 for 256)."),
    max_passages: Optional[int] = typer.Option(None, "--max-passages", help="Most passages a document may make "
                                               "(default 1000); a longer document is refused."),
    passage_score: Optional[str] = typer.Option(None, "--passage-score", help="How a document of several passages "
                                                "scores: max (its best passage, the default) or first (its first "
                                                "passage, close to truncation's ranking; hits still carry the best)."),
) -> None:
    """Encode a corpus (a folder of files, a BEIR folder, a .jsonl) and write an index directory (vectors, ids, FAISS,
    optional BM25, manifest)."""
    try:
        check_output_dir(out, "--out")  # before any loading or encoding
        if replace_ and append:
            raise TwoTowerError("--replace replaces the index at --out and --append adds to it: give one of them")
        index = tt.Index.build(
            out, data, encoder=model, mode="overwrite" if replace_ else "append" if append else "create",
            max_file_bytes=_file_bytes(max_file_mb), kind=kind, bm25=bm25, bigrams=bigrams, language=language,
            multivector=multivector, project=project, batch_size=batch_size, precision=precision, device=device,
            compile=compile_, show_progress=progress, runtime=runtime,
            ann=tt.ANN(m=hnsw_m, ef_construction=ef_construction, nlist=nlist, pq_m=pq_m),
            compression=tt.Compression(vectors, dim=dim, rescore=rescore, rescore_factor=rescore_factor),
            ray=_ray(use_ray, ray_address, workers, gpus_per_worker), backend=_backend(backend, uri, collection),
            passages=_passages(passages, passage_window, passage_overlap, max_passages, passage_score))
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    m = index.info()
    v = m.get("vectors") or {}  # index build --vectors / --dim (retrieval.index.codecs)
    stored = "" if v.get("type", "fp32") == "fp32" else f" {v['type']}"
    if v.get("type") == "binary":
        stored += (", no rescoring" if v.get("rescore") == "none"
                   else f", rescored against {v.get('rescore')} × {v.get('rescore_factor')}")
    cut = f" (cut from {v['source_dim']})" if v.get("source_dim", m["dim"]) != m["dim"] else ""
    split = m.get("passages")
    long = (f" (long documents as passages of up to {split['window']} tokens)"
            if split and m["num_vectors"] > m["num_docs"] else "")
    console.print(f"{out}: version {m['live_version']}, {m['num_docs']} documents, {m['num_vectors']} vectors of "
                  f"{m['dim']} dims{cut}{stored}, {m['factory']}{', BM25' if m['bm25'] else ''}{long}")
    _print_skipped(index.skipped)


def _ray(use_ray: bool, address: str | None, workers: int | None, gpus_per_worker: float):
    """--ray and its settings as ``Index.build``'s ``ray``; the settings without --ray are refused."""
    spec = tt.Ray(address=address, workers=workers, gpus_per_worker=gpus_per_worker)  # checked: --workers 0 named
    if use_ray:
        return spec
    unused = [f for f, v in (("--ray-address", address), ("--workers", workers),
                             ("--gpus-per-worker", gpus_per_worker or None)) if v is not None]
    if unused:
        raise TwoTowerError(f"{', '.join(unused)} set how Ray encodes; without --ray the build runs here and would "
                            "ignore them: drop them or turn Ray on")
    return False


def _backend(backend: str, uri: str | None, collection: str | None):
    """--backend, --uri and --collection as ``Index.build``'s ``backend``."""
    if backend == "milvus" and uri is not None:
        return tt.Milvus(uri, collection=collection)
    named = [f for f, v in (("--uri", uri), ("--collection", collection)) if v is not None]
    if backend == "faiss" and named:
        raise TwoTowerError(f"{' / '.join(named)} name a Milvus location: pass --backend milvus")
    return backend  # --backend milvus without --uri: the build says what --uri takes


def _passages(passages: bool | None, window: int | None, overlap: int | None, limit: int | None,
              score: str | None):
    """--passages/--no-passages and the passage settings as ``Index.build``'s ``passages``."""
    tuned = [f for f, v in (("--passage-window", window), ("--passage-overlap", overlap), ("--max-passages", limit),
                            ("--passage-score", score)) if v is not None]
    if not tuned:
        return passages
    if passages is False:
        raise TwoTowerError(f"{', '.join(tuned)} tune passages, which --no-passages turns off: drop one of them")
    given = {"max_passages": limit, "score": score}
    return tt.Passages(window=window, overlap=overlap, **{k: v for k, v in given.items() if v is not None})


def _file_bytes(mb: float | None) -> int | None:
    if mb is None:
        return None
    if not mb > 0 or mb != mb or mb == float("inf"):
        raise TwoTowerError(f"--max-file-mb {mb}: a size in MiB above 0, e.g. --max-file-mb 100")
    return int(mb * 2**20)


def _print_skipped(skipped: list[dict]) -> None:
    """The files a build or sync left out, one line each (at most 20), on stderr."""
    if not skipped:
        return
    from twotower.cli.console import warn

    warn(f"{len(skipped)} file(s) skipped:")
    for s in skipped[:20]:
        err_console.print(f"  {s['path']}: {s['reason']}", highlight=False, markup=False, soft_wrap=True)
    if len(skipped) > 20:
        err_console.print(f"  … and {len(skipped) - 20} more", highlight=False, markup=False)


@index_app.command("sync")
def index_sync(
    data: str = typer.Option(..., "--data", help="The folder of files (or one file, or a glob) the index mirrors."),
    index: Path = typer.Option(..., "--index", help="Index directory (built from files with index build --data)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Write nothing; report what would change."),
    as_json: bool = typer.Option(False, "--json", help="The report as one JSON line on stdout."),
    max_file_mb: Optional[float] = typer.Option(None, "--max-file-mb", help="Skip files larger than this "
                                                "(default 64)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
    progress: Progress = True,
    lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
) -> None:
    """Bring an index up to date with a folder in one write: new files added, changed ones re-encoded (only they),
    removed ones deleted."""
    try:
        report = tt.Index.open(index).sync(data, dry_run=dry_run, max_file_bytes=_file_bytes(max_file_mb),
                                           batch_size=batch_size, show_progress=progress, lock_timeout=lock_timeout)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
        return
    console.print(f"{index}: {report['added']} added, {report['updated']} updated, {report['removed']} removed, "
                  f"{report['unchanged']} unchanged" + (" (dry run: nothing written)" if dry_run else ""))
    _print_skipped(report["skipped"])


@index_app.command("add")
def index_add(
    index: Path = typer.Option(..., "--index", help="Index directory."),
    docs: Path = typer.Option(..., "--docs", help="New documents, BEIR corpus lines (_id, title, text; any "
                              "other field is kept as metadata)."),
    replace: bool = typer.Option(False, "--replace", help="Overwrite documents whose ids are already indexed."),
    model: Optional[str] = typer.Option(None, help="Encoder (default: the one recorded in the manifest)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
    precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
    progress: Progress = True,
    runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
    lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
) -> None:
    """Encode only the new documents and add them as a new index version."""
    try:
        opened = tt.Index.open(index, model=model, device=device, precision=precision)
        opened.add(docs, replace=replace, batch_size=batch_size, compile=compile_, show_progress=progress,
                   runtime=runtime, lock_timeout=lock_timeout)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    console.print(f"{index}: version {opened.info()['live_version']}, {len(opened)} documents")


@index_app.command("remove")
def index_remove(
    index: Path = typer.Option(..., "--index", help="Index directory."),
    ids: list[str] = typer.Argument(..., help="Document ids to remove."),
    lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
) -> None:
    """Remove documents (a new index version without them)."""
    try:
        opened = tt.Index.open(index).remove(ids, lock_timeout=lock_timeout)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    console.print(f"{index}: version {opened.info()['live_version']}, {len(opened)} documents")


@index_app.command("attach")
def index_attach(
    out: Path = typer.Option(..., "--out", help="Index directory to create (a new or empty folder)."),
    uri: str = typer.Option(..., "--uri", help="The Milvus server (http://host:19530) or Milvus Lite .db."),
    collection: str = typer.Option(..., "--collection", help="The collection a --backend milvus build made."),
) -> None:
    """An index folder for a Milvus index, from the URI and collection alone (e.g. for a serve replica)."""
    try:
        attached = tt.Index.attach(out, uri=uri, collection=collection)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    console.print(f"{out}: version {attached.info()['live_version']}, {len(attached)} documents (Milvus collection "
                  f"{collection})")


@index_app.command("info")
def index_info(
    index: Path = typer.Option(..., "--index", help="Index directory."),
    verify: bool = typer.Option(False, help="Check every file's sha256."),
) -> None:
    """Print the live version's manifest."""
    try:
        manifest = tt.Index.open(index, verify=verify).store.manifest
    except TwoTowerError as exc:
        fail(exc)
    print(json.dumps(manifest, indent=2))
