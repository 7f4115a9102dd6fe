"""Griffe extension (mkdocs.yml: mkdocstrings' ``extensions``): the docstrings' reST literal blocks as fenced Python.

The docstrings end with ``Example::`` and an indented block, as Sphinx and ``help()`` readers expect. mkdocstrings
renders Markdown, where that block is an unlabelled code block: no highlighting. This extension rewrites each
``Something::`` + indented block into ``Something:`` + the same block fenced (```` ```python ```` when it parses as
Python, else ```` ```text ````), so the API reference shows it highlighted. ``Example:`` keeps its block indented
under it, which Google style reads as an "Example" admonition; any other sentence gets the block after it. Nothing
else of the docstring changes, and the source files are not touched.
"""

from __future__ import annotations

import ast
import re
import textwrap

import griffe

_LITERAL = re.compile(r"^(?P<indent>[ \t]*)(?P<text>.*?)::[ \t]*$")


def fence_literal_blocks(doc: str) -> str:
    """``doc`` with every ``text::`` line and the indented block after it turned into ``text:`` and a fenced block,
    indented one level under ``Example:`` / ``Examples:`` (Google style's admonition content)."""
    lines = doc.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _LITERAL.match(lines[i])
        if not match or match.group("text").strip().startswith((">>>", "```")):
            out.append(lines[i])
            i += 1
            continue
        indent = match.group("indent")
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        start = j
        while j < len(lines) and (not lines[j].strip() or _width(lines[j]) > len(indent)):
            j += 1
        while j > start and not lines[j - 1].strip():
            j -= 1
        if start == j:  # a line ending in "::" with no block after it: leave it
            out.append(lines[i])
            i += 1
            continue
        code = textwrap.dedent("\n".join(lines[start:j]))
        text = match.group("text").rstrip()
        example = text.strip() in ("Example", "Examples")
        inner = indent + "    " if example else indent
        out += [f"{indent}{text}:" if text else "", *([] if example else [""])]
        out += [f"{inner}```{_language(code)}", *[f"{inner}{line}" if line.strip() else "" for line in code.splitlines()],
                f"{inner}```"]
        i = j
    return "\n".join(out)


def _language(code: str) -> str:
    try:
        ast.parse(code)
    except SyntaxError:
        return "text"
    return "python"


def _width(line: str) -> int:
    return len(line) - len(line.lstrip())


class FencedExamples(griffe.Extension):
    """Applies :func:`fence_literal_blocks` to every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None and "::" in obj.docstring.value:
            obj.docstring.value = fence_literal_blocks(obj.docstring.value)
