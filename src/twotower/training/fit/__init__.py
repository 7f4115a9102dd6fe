"""``twotower fit``: the best retriever for one data set in one call (recipe.py: what it does; run.py: doing it).

``run`` (numpy, the retrievers, the metrics) loads on first use, so that the CLI can read the recipe's defaults for
its options without paying for it at start-up."""

from twotower.training.fit.recipe import FitRecipe

__all__ = ["FitOptions", "FitRecipe", "run_fit"]


def __getattr__(name: str):
    if name in ("FitOptions", "run_fit"):
        from twotower.training.fit import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
