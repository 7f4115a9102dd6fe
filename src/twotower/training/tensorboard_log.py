"""TensorBoard logs of a training run (``--tensorboard``): checked up front, opened by the trainer.

``torch.utils.tensorboard`` needs the ``tensorboard`` package, which torch does not install:
``pip install 'twotower[tensorboard]'`` (``make setup`` installs it with the dev extra).
"""

from __future__ import annotations

from pathlib import Path

from twotower.checks import switch
from twotower.errors import TwoTowerError


def require_tensorboard() -> None:
    """Raise a TwoTowerError that says what to install unless TensorBoard logs can be written here.

    Call it before a run starts (loading a model, writing the run directory), not at the first log line."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as exc:
        missing = exc.name or "tensorboard"
        raise TwoTowerError(
            f"{switch('tensorboard')} needs the package '{missing}', which is not installed in this Python "
            "environment: pip install 'twotower[tensorboard]' (or pip install tensorboard), or leave "
            f"{switch('tensorboard')} out"
        ) from None


def open_writer(directory: str | Path):
    """A ``SummaryWriter`` writing event files into ``directory`` (a TwoTowerError when tensorboard is missing)."""
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(directory))
