"""``python -m twotower.cli``: the ``twotower`` command without the console script (e.g. under torchrun)."""

from twotower.cli import app

app()
