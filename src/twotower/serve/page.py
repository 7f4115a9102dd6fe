"""The search page at ``/`` (serve/static: HTML, JS and CSS, no build step, nothing from elsewhere): the only files the
service serves besides its JSON, each with headers that let its scripts, styles and requests come from the service
alone. It sits behind the same key as searches where reads are keyed (serve.app's gate; a browser sends the key as a
Basic password, serve.auth).

Example::

    add_search_page(app)  # GET / (the page), GET /static/search.js and /static/search.css
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time.

from importlib import resources

# the search page: these files of serve/static, and nothing else, at "/" and "/static/NAME"
PAGE_FILES = {"index.html": "text/html; charset=utf-8", "search.js": "text/javascript; charset=utf-8",
              "search.css": "text/css; charset=utf-8"}
PAGE_HEADERS = {  # its scripts, styles and requests come from the service alone; no frames, no inline code
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
}


def add_search_page(app) -> None:
    """Serve the page at ``/`` and its script and style sheet at ``/static/NAME`` on ``app`` (none of them in the
    OpenAPI schema); any other name under ``/static/`` is a 404."""
    from fastapi.responses import Response

    page_files = {name: (resources.files("twotower.serve") / "static" / name).read_bytes() for name in PAGE_FILES}

    def page_file(name: str) -> Response:
        return Response(page_files[name], media_type=PAGE_FILES[name], headers=PAGE_HEADERS)

    @app.get("/", include_in_schema=False)
    def page() -> Response:
        """The search page (behind the same key as searches: serve.app's gate)."""
        return page_file("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    def page_asset(name: str) -> Response:
        from fastapi import HTTPException

        if name not in PAGE_FILES or name == "index.html":
            raise HTTPException(404, f"no file /static/{name}")
        return page_file(name)
