"""``twotower serve``: the search service (FastAPI on uvicorn) over a stored index (``tt.create_app``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import console, fail
from twotower.cli.helpers import check_port, check_serve_options
from twotower.errors import TwoTowerError


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)


def serve_cmd(
    index: Path = typer.Option(..., "--index", help="Index directory (twotower index build)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on."),
    api_key_file: Optional[Path] = typer.Option(None, "--api-key-file",
                                                help="File whose first line is the API key writes need (X-API-Key): "
                                                     "at least 16 visible ASCII characters."),
    keyed_reads: bool = typer.Option(False, "--keyed-reads",
                                     help="Require the API key for everything but /healthz: the search page at /, "
                                          "searches, reads, /metrics, /openapi.json (/docs and /redoc are off). Reads "
                                          "also take the key as the HTTP Basic password, so a browser can open the page."),
    model: Optional[str] = typer.Option(None, help="Encoder (default: the one recorded in the index manifest)."),
    precision: str = typer.Option("auto", help="auto | fp32 | bf16 (encoding added documents, and queries when they run on torch)"),
    device: str = typer.Option("auto", "--device", help="auto (the GPU where torch sees one, else cpu) | cpu | cuda | "
                               "cuda:N: where the encoder runs (ONNX Runtime queries stay on the CPU)"),
    query_runtime: str = typer.Option(
        "auto", "--query-runtime",
        help="auto | onnx | torch: encode queries with ONNX Runtime (CPU, ~2x faster at batch 1; auto falls "
             "back to torch, saying why) or PyTorch."),
    max_k: int = typer.Option(1000, "--max-k", min=1, help="Largest k a search may ask for."),
    max_batch: int = typer.Option(64, "--max-batch", min=1, help="Most queries in one /search/batch."),
    max_body_bytes: int = typer.Option(32 * 1024 * 1024, "--max-body-bytes", min=1024, help="Largest request body (default "
                                        "32 MiB: one document of 4,000,000 characters, the limit of any text)."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve search, document reads and (with an API key) document writes over HTTP."""
    if log_level.lower() not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(TwoTowerError(f"--log-level {log_level}: choose one of critical, error, warning, info, debug, trace"))
    try:
        check_serve_options(precision=precision, query_runtime=query_runtime)  # the values, then the port
        check_port(host, port)  # before loading anything, and before saying it serves
        api = tt.create_app(index, api_key_file=api_key_file, keyed_reads=keyed_reads, model=model,
                            precision=precision, query_runtime=query_runtime, device=device, max_k=max_k,
                            max_batch=max_batch, max_body_bytes=max_body_bytes)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    searcher = api.state.service.searcher
    store = searcher.store
    keyed = api_key_file is not None
    console.print(f"serving {index} (version {store.version}, {len(store)} documents) on http://{host}:{port}"
                  f" — writes {'need the API key' if keyed else 'disabled (no --api-key-file)'}; queries encoded by "
                  f"{'ONNX Runtime' if searcher.onnx_queries is not None else 'torch on ' + str(searcher.encoder.device)}")
    # one process: writes are serialized in it and every read sees one whole index version
    try:
        tt.serve_index(api, host=host, port=port, log_level=log_level)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
