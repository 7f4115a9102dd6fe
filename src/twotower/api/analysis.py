"""The papers' analyses: random-projection fidelity (Luan et al.), the towers' embedding spaces (Dong et al.),
document length and latency (GTR). Each returns its result as a dict (``rows``, ``notes``, the numbers behind the
plots) and, given ``out``, writes ``<name>.json`` and PNG plots there."""

from __future__ import annotations

from twotower.api._errors import user_errors

import importlib
from pathlib import Path

__all__ = ["analyze_doclength", "analyze_fidelity", "analyze_latency", "analyze_towers", "build_report"]


def _taken(config):
    """``config`` with the objects the API hands out taken as paths (``data_folder``, ``model_argument``): a loaded
    Dataset as ``data`` (its split the config's, where the config has one), Encoders and FitResults in ``models``."""
    import dataclasses

    from twotower.api.dataset import data_folder
    from twotower.api.encoder import model_argument

    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return config  # each analysis refuses it in its own words
    changes = {}
    if getattr(config, "data", None) is not None and not isinstance(config.data, (str, Path)):
        changes["data"] = data_folder(config.data, "data", split=getattr(config, "split", None))
    models = getattr(config, "models", None)
    if isinstance(models, (list, tuple)):
        changes["models"] = [model_argument(m, "models") for m in models]
    return dataclasses.replace(config, **changes) if changes else config


def _analyze(module: str, run: str, write: str, config, out, command: str | None, option: str = "out") -> dict:
    from twotower.analysis._common import machine_info
    from twotower.io import check_output_dir

    check_output_dir(out, option)  # before any loading
    if out is not None:  # a folder holding another command's output is refused before any work
        from twotower.outputs import claim_output

        claim_output(out, "analysis", option=option, command="twotower analyze")
    mod = importlib.import_module(module)
    result = getattr(mod, run)(config)
    result["command"] = command or f"twotower.{run.replace('run_', 'analyze_')}({config!r})"
    result["machine"] = machine_info()
    if out is not None:
        result["written"] = [str(p) for p in getattr(mod, write)(result, out)]
    return result


@user_errors
def analyze_fidelity(config, out: str | Path | None = None, *, command: str | None = None) -> dict:
    """How many random-projection dimensions keep BM25's ranking (Luan et al. §3): k* against the normalised margin
    (Figure 2, with the bound k ≥ 12·ε⁻²·ln(4/β)), margins and recall@r by document length. ``config``: a
    :class:`~twotower.FidelityConfig`. ``command`` is recorded in the result (default: this call).

    Example::

        cfg = tt.FidelityConfig(data="my-beir-dir", max_queries=20, k_max=256, recall_ks=(64, 256), draws=1,
                                doc_lengths=(16, None), show_progress=False)
        result = tt.analyze_fidelity(cfg, out="analysis")
        print(result["notes"][0])
    """
    config = _taken(config)  # a Dataset for data, Encoders / FitResults for models
    config.validate()
    return _analyze("twotower.analysis.fidelity", "run_fidelity", "write_fidelity", config, out, command)


@user_errors
def analyze_towers(config, out: str | Path | None = None, *, command: str | None = None) -> dict:
    """Where each tower puts questions and answers (Dong et al. Figure 2): a t-SNE of both towers' embeddings per
    model and a linear probe's accuracy at telling them apart. ``config``: a :class:`~twotower.TowersConfig`.

    Example::

        result = tt.analyze_towers(tt.TowersConfig(data="my-beir-dir", n=20, perplexity=5, show_progress=False))
        print(result["rows"][0])
    """
    config = _taken(config)  # a Dataset for data, Encoders / FitResults for models
    import math

    from twotower.checks import given
    from twotower.errors import TwoTowerError

    if not (isinstance(config.perplexity, (int, float)) and math.isfinite(config.perplexity) and config.perplexity > 0):
        raise TwoTowerError(f"{given('perplexity', config.perplexity)}: t-SNE's perplexity (about the neighbours "
                            "each point keeps) must be a number above 0; 5 to 50 is usual (larger than a third of the "
                            "points is lowered to fit)")
    return _analyze("twotower.analysis.embedding_space", "run_towers", "write_towers", config, out, command)


@user_errors
def analyze_doclength(config, out: str | Path | None = None, *, command: str | None = None) -> dict:
    """The median length (words, tokens) of the top documents each retriever returns (GTR §6.4): dense models
    favour shorter documents than BM25. ``config``: a :class:`~twotower.DocLengthConfig`.

    Example::

        result = tt.analyze_doclength(tt.DocLengthConfig(data="my-beir-dir", show_progress=False))
        print([(r["system"], r["median_words"]) for r in result["rows"]])
    """
    config = _taken(config)  # a Dataset for data, Encoders / FitResults for models
    return _analyze("twotower.analysis.doclength", "run_doclength", "write_doclength", config, out, command)


@user_errors
def analyze_latency(config, out: str | Path | None = None, *, command: str | None = None) -> dict:
    """Batch-1 query latency (p50 / p95) and documents per second per model and precision (GTR §8).
    ``config``: a :class:`~twotower.LatencyConfig`.

    Example::

        result = tt.analyze_latency(tt.LatencyConfig(runs=5, warmup=1, n_docs=8, show_progress=False))
        print(result["rows"][0]["p50_ms"])
    """
    config = _taken(config)  # a Dataset for data, Encoders / FitResults for models
    return _analyze("twotower.analysis.latency", "run_latency", "write_latency", config, out, command)


def build_report(folder: str | Path, page: str | Path | None = None) -> Path:
    """Gather the analyses' JSON in ``folder`` into one markdown page with their plots (default
    ``folder/report.md``); returns its path.

    Example::

        path = tt.build_report("analysis")
    """
    from twotower.analysis.report import build_report as _build
    import os

    from twotower.checks import flag
    from twotower.errors import TwoTowerError
    from twotower.io import check_not_inputs, check_output_file

    if not isinstance(folder, (str, os.PathLike)):
        raise TwoTowerError(f"folder: the analyses' output folder (a str or pathlib.Path), not {type(folder).__name__}")
    folder = Path(folder)
    check_output_file(page or folder / "report.md", flag("page") if page else flag("folder", "--out"))
    if page is not None and folder.is_dir():  # the analyses' own JSON and plots are the page's inputs
        check_not_inputs(((flag("page"), page),), [*folder.glob("*.json"), *folder.glob("*.png")])
    return _build(folder, page)
