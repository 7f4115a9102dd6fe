"""Options that several commands take with the same flag, default and help, defined once (typer's ``Annotated``
form): a command declares ``progress: Progress = True`` instead of repeating the whole ``typer.Option(...)``.

Example::

    @app.command()
    def build(seed: Seed = 42, progress: Progress = True) -> None: ...
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Progress = Annotated[bool, typer.Option(help="Show progress bars.")]
Seed = Annotated[int, typer.Option()]

# a training run's checkpoints and logs (train, pretrain)
CheckpointEvery = Annotated[int, typer.Option("--checkpoint-every", min=1)]
CheckpointMinutes = Annotated[Optional[float], typer.Option(
    "--checkpoint-minutes",
    help="Also checkpoint once this many minutes have passed since the last checkpoint (slow steps).")]
Resume = Annotated[bool, typer.Option(help="Continue from the newest checkpoint in --out.")]
TensorBoard = Annotated[bool, typer.Option(help="Write TensorBoard logs to OUT/tensorboard.")]
MatryoshkaWeights = Annotated[Optional[str], typer.Option(
    "--matryoshka-weights", help="One weight per --matryoshka dimension (default 1 each).")]
