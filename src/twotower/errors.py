"""One exception base for everything twotower reports to a person.

Every error says what went wrong, where (file, line, field when known) and what to do.
"""

from __future__ import annotations

from pathlib import Path


class TwoTowerError(Exception):
    """Base class: the message is meant to be shown to a person as is.

    Example::

        import twotower as tt

        try:
            tt.load_beir("no-such-folder")
        except tt.TwoTowerError as exc:  # every error twotower reports to a person
            print(exc)
    """


class DataError(TwoTowerError):
    """Bad input data, located by file, line and field.

    Example::

        try:
            tt.Dataset.from_lists([{"_id": "", "text": "x"}], {"q": "x"}, {"q": {"d": 1}})
        except tt.DataError as exc:
            print(exc.path, exc.field, exc)  # corpus[0] _id ...
    """

    def __init__(
        self,
        path: str | Path,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.hint = hint
        where = self.path
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field '{field}'"
        text = f"{where}: {message}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)


class ModelError(TwoTowerError):
    """A model directory that cannot be loaded or used.

    Example::

        try:
            tt.Encoder.load("./no-such-model-dir/")
        except tt.ModelError as exc:
            print(exc)
    """


class DatasetNotFound(TwoTowerError):
    """A data set that is neither on disk nor downloadable.

    Example::

        try:
            tt.fetch_beir("no-such-dataset", cache="/tmp/beir")
        except tt.DatasetNotFound as exc:
            print(exc)
    """
