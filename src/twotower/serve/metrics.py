"""The service's Prometheus metrics, in a registry of each app's own (no global state): requests counted by method,
route template and status, request latency histograms by route, and the live index version's documents, vectors and
number, read when scraped. ``/metrics`` (serve.app) answers with them.

Example::

    registry, record = request_metrics(app, state)
    app.middleware("http")(record)  # registered last: outermost, so it counts every answer
    text = prometheus_client.generate_latest(registry)  # what GET /metrics answers
"""

from __future__ import annotations

import time


def request_metrics(app, state):
    """``(registry, record)``: ``app``'s metrics registry, with gauges that read ``state``'s live index version, and
    ``record``, the HTTP middleware that counts and times each answer under its route's template."""
    from fastapi import Request
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from starlette.routing import Match

    registry = CollectorRegistry()
    requests_total = Counter("twotower_requests", "HTTP requests", ["method", "route", "status"], registry=registry)
    latency = Histogram("twotower_request_latency_seconds", "request latency", ["route"], registry=registry,
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
    docs_gauge = Gauge("twotower_index_documents", "documents in the live index version", registry=registry)
    vectors_gauge = Gauge("twotower_index_vectors", "vectors in the live index version", registry=registry)
    version_gauge = Gauge("twotower_index_version", "number of the live index version", registry=registry)
    docs_gauge.set_function(lambda: len(state.searcher.store))
    vectors_gauge.set_function(lambda: state.searcher.store.manifest["num_vectors"])
    version_gauge.set_function(lambda: state.searcher.store.manifest["version"])

    async def record(request: Request, call_next):  # registered last: outermost, so it counts every answer
        t0 = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            name = _route_name(request)
            requests_total.labels(request.method, name, str(status)).inc()
            latency.labels(name).observe(time.perf_counter() - t0)

    def _route_name(request: Request) -> str:
        """The route template (``/documents/{doc_id}``), also for answers given before routing."""
        route = request.scope.get("route")
        if route is not None:
            return route.path_format
        for candidate in app.routes:
            if candidate.matches(request.scope)[0] != Match.NONE:
                return candidate.path_format
        return "unmatched"

    return registry, record
