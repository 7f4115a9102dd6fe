"""Progress bars only where there is a wait to watch.

On the command line a bar appears at once (a command is a long job a person started). Called from Python, a bar
appears only once its work has run for :data:`PYTHON_DELAY_S` seconds (tqdm's ``delay``): building an index of two
documents in a notebook prints nothing, one of 100,000 shows its bar after two seconds. Libraries whose bars take
no delay (bm25s) get ``show_progress`` only for work of at least :data:`PYTHON_MIN_ITEMS` items when called from
Python. ``show_progress=False`` (``--no-progress``) still turns every bar off.
"""

from __future__ import annotations

from twotower.checks import naming

PYTHON_DELAY_S = 2.0
PYTHON_MIN_ITEMS = 20_000  # bm25s tokenises and counts about this many documents a second on one core


def delay() -> float:
    """Seconds a bar waits before it appears: 0 on the command line, :data:`PYTHON_DELAY_S` from Python."""
    return 0.0 if naming() == "cli" else PYTHON_DELAY_S


def progress_bar(*args, **kwargs):
    """``tqdm(*args, **kwargs)`` with :func:`delay` unless ``delay`` is given.

    Example::

        from twotower.progress import progress_bar

        with progress_bar(total=3, desc="work", disable=False) as b:
            b.update(3)  # from Python: shown only had it taken two seconds
    """
    from tqdm.auto import tqdm

    kwargs.setdefault("delay", delay())
    return tqdm(*args, **kwargs)


def worth_showing(show_progress: bool, items: int) -> bool:
    """Whether a library bar without a delay (bm25s) should show for ``items`` items."""
    return bool(show_progress) and (naming() == "cli" or items >= PYTHON_MIN_ITEMS)
