"""MkDocs hook: the Python API reference, one page per public name, generated from ``twotower.__all__`` at build time.

- ``reference/api/<NAME>.md`` (generated, not on disk): the mkdocstrings entry (``::: module.Name``) of one name, so a
  name added to ``__all__`` gets its page on the next build and none can be forgotten. Each page carries the anchor
  ``twotower.NAME``.
- The page holding ``<!-- api-reference -->`` (``reference/python.md``) gets the index: every name with its kind
  and its docstring's first sentence, grouped as the package docstring groups them (a heading line followed by an
  indented line of ``:func:`name```/``:class:`name``` roles; a name no group mentions goes under "Other"). Each row
  keeps the anchor ``twotower.NAME``, so links written as ``python.md#twotower.NAME`` still land on the name.
- The nav: the "Python API" entry becomes a section, the index first, then the pages by group.

The docstrings are written with Sphinx roles (``:class:`~twotower.Index```, ``:meth:`Index.build <twotower.Index.build>```)
and ``Example::`` blocks; mkdocstrings renders Markdown, so the rendered pages get the roles turned into code, linked
to the name's page when they name a public name (``Example::`` blocks become fenced Python in
``griffe_examples.py``, a griffe extension). tests/test_docs.py checks every public name's page and anchor.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re

from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

MARKER = "<!-- api-reference -->"
INDEX = "reference/python.md"
PAGES = "reference/api"
# a logger under "mkdocs.": its warnings fail a --strict build
log = logging.getLogger("mkdocs.plugins.twotower_api_reference")
_ROLE = re.compile(r":(?:func|class|meth|exc|data):`~?([A-Za-z_][\w.]*)`")
_ANY_ROLE = re.compile(r":(?:func|class|meth|exc|attr|data|mod|obj):`(?P<body>[^`]*)`")


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


def public_groups() -> list[tuple[str, list[str]]]:
    package = importlib.import_module("twotower")
    return groups(package.__doc__ or "", sorted(getattr(package, "__all__", [])))


def page_uri(name: str) -> str:
    return f"{PAGES}/{name}.md"


def kind(obj) -> str:
    if isinstance(obj, type):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "function" if callable(obj) else "object"


def summary(obj) -> str:
    """The docstring's first sentence, in Markdown: roles and reST literals as code, on one line."""
    doc = inspect.getdoc(obj) or ""
    first = " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())
    text = _ANY_ROLE.sub(lambda m: f"`{_label(m.group('body'))}`", first).replace("``", "`")
    sentence = cut(text, ".")
    if len(sentence) > 120:  # a long one: its head, before the colon that opens the details
        sentence = cut(sentence, ":").rstrip(":")
    return sentence.replace("|", "\\|")


def cut(text: str, stop: str) -> str:
    """``text`` up to its first ``stop`` followed by a space (or the end) outside code spans and brackets."""
    code, depth = False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            code = not code
        elif not code and ch in "([{":
            depth += 1
        elif not code and ch in ")]}":
            depth = max(depth - 1, 0)
        elif not code and not depth and ch == stop and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text


def _label(body: str) -> str:
    body = body.strip()
    labelled = re.match(r"^(?P<label>.*?)\s*<(?P<target>[^>]+)>$", body)
    if labelled:
        return labelled.group("label")
    return body[1:].split(".")[-1] if body.startswith("~") else body


# classes whose public methods partly come from a base class of their own (tt.Index: list, count, get, delete,
# update from api.index_manage.Managing): their pages show inherited members too
INHERITING = {"Index"}


def page_markdown(name: str, target: str) -> str:
    return "\n".join([
        f'<span id="twotower.{name}"></span>',
        "",
        f"::: {target}",
        "    options:",
        f'      heading: "{name}"',
        f'      toc_label: "{name}"',
        "      heading_level: 1",
        *(["      inherited_members: true"] if name in INHERITING else []),
        "",
        f"Import it as `import twotower as tt`, then `tt.{name}`. All names: [Python API](../python.md).",
        "",
    ])


def index_markdown() -> str:
    package = importlib.import_module("twotower")
    lines: list[str] = []
    for heading, members in public_groups():
        lines += [f"## {heading}", "", "| name | what it is |", "|---|---|"]
        for name in members:
            try:
                obj = getattr(package, name)
            except Exception as exc:  # a name in __all__ that does not import: no entry, and a strict build fails
                log.warning("twotower.%s is in __all__ but does not import (%s: %s)", name, type(exc).__name__, exc)
                continue
            lines.append(f'| <span id="twotower.{name}"></span>[`{name}`](api/{name}.md)<br><small>{kind(obj)}</small> | '
                         f"{summary(obj)} |")
        lines.append("")
    return "\n".join(lines)


def _nav_section(nav: list) -> list | None:
    """The nav's ``{"Python API": INDEX}`` entry turned into a section of the index and the generated pages."""
    for item in nav:
        if not isinstance(item, dict):
            continue
        for title, value in item.items():
            if value == INDEX:
                item[title] = [{"Overview": INDEX}, *({heading: [{name: page_uri(name)} for name in members]}
                                                      for heading, members in public_groups())]
                return item[title]
            if isinstance(value, list) and (found := _nav_section(value)) is not None:
                return found
    return None


def on_config(config):
    if config.get("nav") and _nav_section(config["nav"]) is None:
        log.warning("api_reference: no nav entry for %s, so the API pages are not in the navigation", INDEX)
    return config


def on_files(files, config):
    package = importlib.import_module("twotower")
    for _, members in public_groups():
        for name in members:
            try:
                target = _target(package, name)
            except Exception:  # reported once, by the index
                continue
            files.append(File.generated(config, page_uri(name), content=page_markdown(name, target)))
    return files


_ROLE_HTML = re.compile(r":(?:func|class|meth|exc|attr|data|mod|obj):<code>(?P<body>[^<]*)</code>")
_TARGET = re.compile(r"^(?P<label>.*?)\s*&lt;(?P<target>[^&]+)&gt;$")


def _role_html(match: re.Match, links: dict[str, str]) -> str:
    body = match.group("body").strip()
    labelled = _TARGET.match(body)
    target = labelled.group("target") if labelled else body.lstrip("~")
    label = labelled.group("label") if labelled else (body[1:].split(".")[-1] if body.startswith("~") else body)
    parts = target.split(".")
    if parts[0] == "twotower":
        parts = parts[1:]
    if parts and parts[0] in links:
        return f'<a href="{links[parts[0]]}"><code>{label}</code></a>'
    return f"<code>{label}</code>"


def on_page_content(html: str, page, config, files) -> str:
    """Sphinx roles in rendered docstrings as Markdown readers expect them: code, linked to the name's page."""
    if ":<code>" not in html:
        return html
    links = {}
    for _, members in public_groups():
        for name in members:
            file = files.get_file_from_path(page_uri(name))
            if file is not None:
                links[name] = get_relative_url(file.url, page.file.url)
    return _ROLE_HTML.sub(lambda m: _role_html(m, links), html)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, index_markdown())
