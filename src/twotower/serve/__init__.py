"""The search service: a FastAPI app over a stored index (``twotower serve``)."""
