"""The public API's implementation; import it from the package top (``import twotower as tt``)."""
