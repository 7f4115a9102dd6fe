"""What goes wrong with an index directory, as exceptions a person can act on."""

from __future__ import annotations

from twotower.errors import TwoTowerError


class IndexStoreError(TwoTowerError):
    """An index directory that cannot be read or written as asked."""


class UnknownIdError(IndexStoreError):
    """Document ids that the index does not hold."""


class DimensionError(IndexStoreError):
    """Vectors whose dimension differs from the index's."""


class WouldEmptyError(IndexStoreError):
    """A delete that would leave the index without documents (an index holds at least one)."""
