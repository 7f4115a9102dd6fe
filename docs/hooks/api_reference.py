"""MkDocs hook: the Python API reference, generated from ``twotower.__all__`` at build time.

A page holding the line ``<!-- api-reference -->`` gets one mkdocstrings entry (``::: module.Name``) per public
name, so a name added to ``__all__`` appears on the next build and none can be forgotten. Names are grouped as the
package docstring groups them (a heading line followed by an indented line of ``:func:`name```/``:class:`name```
roles); a name no group mentions goes under "Other". Each entry points at the object's defining module and carries
the anchor ``twotower.NAME`` (tests/test_docs.py checks that every public name has one, with a docstring).

The docstrings are written with Sphinx roles (``:class:`~twotower.Index```, ``:meth:`Index.build <twotower.Index.build>```)
and ``Example::`` blocks; mkdocstrings renders Markdown, so the rendered pages get the roles turned into code
(linked to the entry when it names a public name) and ``Example::`` into ``Example:``.
"""

from __future__ import annotations

import importlib
import logging
import re

MARKER = "<!-- api-reference -->"
# a logger under "mkdocs.": its warnings fail a --strict build
log = logging.getLogger("mkdocs.plugins.twotower_api_reference")
_ROLE = re.compile(r":(?:func|class|meth|exc|data):`~?([A-Za-z_][\w.]*)`")


def groups(doc: str, names: list[str]) -> list[tuple[str, list[str]]]:
    """(heading, names) in the order of the package docstring; unmentioned names last under "Other"."""
    out: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    heading = None
    for line in (doc or "").splitlines():
        if line.strip() and not line.startswith((" ", "\t")):
            heading = line.strip()
            continue
        if heading is None or not line.strip():
            continue
        for name in _ROLE.findall(line):
            name = name.split(".")[-1]
            if name in names and name not in seen:
                if not out or out[-1][0] != heading:
                    out.append((heading, []))
                out[-1][1].append(name)
                seen.add(name)
    rest = [n for n in names if n not in seen]
    if rest:
        out.append(("Other", rest))
    return out


def _target(package, name: str) -> str:
    """Where ``name`` is defined: ``module.qualname`` for classes and functions, else the package's own path."""
    obj = getattr(package, name)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}.{qualname}"
    return f"{package.__name__}.{name}"


def api_markdown() -> str:
    package = importlib.import_module("twotower")
    names = sorted(getattr(package, "__all__", []))
    lines: list[str] = []
    for heading, members in groups(package.__doc__ or "", names):
        lines += [f"## {heading}", ""]
        for name in members:
            try:
                target = _target(package, name)
            except Exception as exc:  # a name in __all__ that does not import: no entry, and a strict build fails
                log.warning("twotower.%s is in __all__ but does not import (%s: %s)", name, type(exc).__name__, exc)
                continue
            lines += [f'<span id="twotower.{name}"></span>', ""]
            lines += [f"::: {target}",
                      "    options:",
                      f'      heading: "{name}"',
                      f'      toc_label: "{name}"',
                      ""]
    return "\n".join(lines)


_ROLE_HTML = re.compile(r":(?:func|class|meth|exc|attr|data|mod|obj):<code>(?P<body>[^<]*)</code>")
_TARGET = re.compile(r"^(?P<label>.*?)\s*&lt;(?P<target>[^&]+)&gt;$")


def _role_html(match: re.Match, names: set[str], here: str) -> str:
    body = match.group("body").strip()
    labelled = _TARGET.match(body)
    target = labelled.group("target") if labelled else body.lstrip("~")
    label = labelled.group("label") if labelled else (body[1:].split(".")[-1] if body.startswith("~") else body)
    parts = target.split(".")
    if parts[0] == "twotower":
        parts = parts[1:]
    if parts and parts[0] in names:
        return f'<a href="{here}#twotower.{parts[0]}"><code>{label}</code></a>'
    return f"<code>{label}</code>"


def on_page_content(html: str, page, config, files) -> str:
    """Sphinx roles and ``Example::`` in rendered docstrings, as Markdown readers expect them."""
    if ":<code>" not in html and "::</p>" not in html:
        return html
    package = importlib.import_module("twotower")
    names = set(getattr(package, "__all__", []))
    reference = next((f for f in files if f.src_uri == "reference/python.md"), None)
    here = ""
    if reference is not None and page.file.src_uri != "reference/python.md":
        from mkdocs.utils import get_relative_url

        here = get_relative_url(reference.url, page.file.url)
    html = _ROLE_HTML.sub(lambda m: _role_html(m, names, here), html)
    return re.sub(r"(\w)::</p>", r"\1:</p>", html)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, api_markdown())
