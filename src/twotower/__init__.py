"""twotower: train, index, evaluate and serve dual-encoder (two-tower) dense retrievers."""

__version__ = "0.1.0"
