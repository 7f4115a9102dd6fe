"""Scaling out: distributed corpus encoding on Ray (``twotower index build --ray``)."""
