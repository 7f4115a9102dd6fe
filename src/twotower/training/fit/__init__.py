"""``twotower fit``: the best retriever for one data set in one call (recipe.py: what it does; run.py: doing it)."""

from twotower.training.fit.recipe import FitRecipe
from twotower.training.fit.run import FitOptions, run_fit

__all__ = ["FitOptions", "FitRecipe", "run_fit"]
