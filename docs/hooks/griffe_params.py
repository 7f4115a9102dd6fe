"""Griffe extension (mkdocs.yml: mkdocstrings' ``extensions``): a parameter table on every function, method and class
of the API reference.

Each public function, method and class with a docstring gets, in its docstring, a Markdown table of its parameters
(a class: its ``__init__``'s, or a dataclass's fields): name, type (the annotation as written), default and a
description. The table stands after the prose, before the ``Example:`` block (``griffe_examples.py`` fences it first),
so a page reads signature, prose, parameters, example. A description is only ever text the source already holds:

- an ``Args:`` / ``Parameters`` section (Google or numpy style, parsed by griffe; mkdocs.yml hides griffe's own
  table of it, ``show_docstring_parameters: false``, so it is not shown twice);
- else a clause of the prose that opens with the parameter in double backticks and a colon
  (````hard_negatives``: ``none`` | ``bm25`` ...``; ````a``/``b``: ...`` for two at once), up to the end of its
  sentence, the next such clause or the bracket it stands in (a class: its docstring, then ``__init__``'s);
- else, for a dataclass field, the ``# comment`` that ends the field's line.

Otherwise the cell stays empty. Nothing of the source files changes; tests/test_api_reference_params.py checks it.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize

import griffe

TITLE = '<span class="doc-section-title">Parameters:</span>'  # as mkdocstrings titles its own sections
CLASS = "doc-param-table"  # docs/assets/extra.css: compact rows, the description gets the width
_EXAMPLE = re.compile(r"^Examples?::?[ \t]*$")
# ``name``: or ``name=value``: or ``a``/``b``: -- not after a word or a backtick
_CLAUSE = re.compile(r"(?<![\w`])(?P<names>``[A-Za-z_]\w*(?:=[^`]*)?``(?:\s*/\s*``[A-Za-z_]\w*(?:=[^`]*)?``)*):\s")
_CLAUSE_NAME = re.compile(r"``([A-Za-z_]\w*)")
# what may stand before a clause: nothing (the paragraph's start), a sentence's or a clause's end, a bracket
_AFTER = ".;,("
_ABBREVIATIONS = ("e.g", "i.e", "etc", "cf", "vs", "approx")
_OPEN, _CLOSE = "([{", ")]}"


def described(doc: str, names: list[str]) -> dict[str, str]:
    """``{name: clause}`` for each of ``names`` that a clause of ``doc`` opens with (````name``: ...``), the first one."""
    out: dict[str, str] = {}
    for paragraph in _paragraphs(doc):
        starts = [m for m in _CLAUSE.finditer(paragraph) if set(_CLAUSE_NAME.findall(m.group("names"))) & set(names)
                  and paragraph[:m.start()].rstrip()[-1:] in ("", *_AFTER)]
        for i, match in enumerate(starts):
            later = [m.start() for m in starts[i + 1:]]
            text = _clause(paragraph, match.end(), later)
            for name in _CLAUSE_NAME.findall(match.group("names")):
                if name in names and name not in out and text:
                    # ``x=True``: keeps its value, the clause is about that value
                    out[name] = (match.group("names") + ": " + text) if "=" in match.group("names") else text
    return out


def _paragraphs(doc: str) -> list[str]:
    """The prose of ``doc``, one string per paragraph, without fenced or literal blocks."""
    out: list[str] = []
    lines: list[str] = []
    fence = False
    for line in (doc or "").splitlines() + [""]:
        if line.strip().startswith("```"):
            fence = not fence
            continue
        if fence or line.startswith((" ", "\t")) and not lines:  # a block's lines, or one indented under a heading
            continue
        if line.strip():
            lines.append(line.strip())
        elif lines:
            out.append(" ".join(lines))
            lines = []
    return out


def _clause(text: str, start: int, later: list[int]) -> str:
    """``text`` from ``start`` to the end of the clause: a sentence's end, the next clause (``later``) or the
    bracket the clause stands in closing, whichever comes first, outside code spans and brackets."""
    depth, i, end = 0, start, len(text)
    while i < len(text):
        ch = text[i]
        if depth == 0 and i in later:
            end = i
            break
        if ch == "`":
            i = span_end(text, i)
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                end = i
                break
            depth -= 1
        elif ch == "." and depth == 0 and _sentence_end(text, i):
            end = i + 1
            break
        i += 1
    return " ".join(text[start:end].split()).rstrip(",;: ").strip()


def span_end(text: str, i: int) -> int:
    """Where the code span opening with the backticks at ``text[i]`` ends (past its closing run); a run that
    nothing closes is literal backticks, so it ends with the run."""
    run = len(text[i:]) - len(text[i:].lstrip("`"))
    close = text.find("`" * run, i + run)
    return close + run if close >= 0 else i + run


def _sentence_end(text: str, i: int) -> bool:
    rest = text[i + 1:]
    if rest and not rest[0].isspace():
        return False
    word = text[:i].split()[-1].lower() if text[:i].split() else ""
    if word.endswith(_ABBREVIATIONS):
        return False
    rest = rest.lstrip()
    return not rest or rest[0].isupper() or rest[0] in "`:"


def section_descriptions(obj: griffe.Object) -> dict[str, str]:
    """``{name: description}`` from the docstring's ``Args:`` / ``Parameters`` section, Google or numpy style."""
    if obj.docstring is None:
        return {}
    out: dict[str, str] = {}
    for parse in (griffe.parse_google, griffe.parse_numpy):
        for section in parse(griffe.Docstring(obj.docstring.value, parent=obj), warnings=False):
            if section.kind is griffe.DocstringSectionKind.parameters:
                for param in section.value:
                    if param.description:
                        out.setdefault(param.name.lstrip("*"), " ".join(param.description.split()))
    return out


def field_comments(cls: griffe.Class) -> dict[str, str]:
    """``{field: comment}`` for a dataclass's fields whose line ends in a ``# comment``."""
    out: dict[str, str] = {}
    for name, member in cls.members.items():
        if member.is_alias or not member.is_attribute or not member.lines:
            continue
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO("\n".join(member.lines).strip() + "\n").readline))
        except (tokenize.TokenError, SyntaxError, IndentationError):
            continue
        comments = [t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT]
        if comments and comments[-1]:
            out[name] = " ".join(comments)
    return out


def parameters(obj: griffe.Object) -> list[griffe.Parameter]:
    """The parameters a caller passes: without a method's ``self`` / ``cls``."""
    try:
        params = list(obj.parameters)
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):  # an __init__ from outside the package
        return []
    bound = obj.is_class or (obj.parent is not None and obj.parent.is_class and "staticmethod" not in obj.labels)
    if bound and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return params


def rows(obj: griffe.Object) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) per parameter, as Markdown cells."""
    params = parameters(obj)
    names = [p.name for p in params]
    docs = [obj] + ([obj.members["__init__"]] if obj.is_class and "__init__" in obj.members else [])
    descriptions: dict[str, str] = {}
    for doc in docs:
        for name, text in section_descriptions(doc).items():
            descriptions.setdefault(name, text)
    for doc in docs:
        for name, text in described(doc.docstring.value if doc.docstring else "", names).items():
            descriptions.setdefault(name, text)
    if obj.is_class and "dataclass" in obj.labels:
        for name, text in field_comments(obj).items():
            descriptions.setdefault(name, text)
    return [(_name(p), _code(p.annotation), _default(p), escape(descriptions.get(p.name, ""))) for p in params]


def _name(param: griffe.Parameter) -> str:
    star = {griffe.ParameterKind.var_positional: "*", griffe.ParameterKind.var_keyword: "**"}.get(param.kind, "")
    return f"`{star}{param.name}`"


def _code(text) -> str:
    text = " ".join(str(text).split()) if text is not None else ""
    if not text:
        return ""
    run = "``" if "`" in text else "`"
    return f"{run}{text}{run}" if run == "`" else f"{run} {text} {run}"


def _default(param: griffe.Parameter) -> str:
    if param.kind in (griffe.ParameterKind.var_positional, griffe.ParameterKind.var_keyword):
        return ""
    if param.default is None:
        return "*required*"
    default = param.default
    # a dataclass field(default_factory=...): what the factory makes, e.g. [StageConfig()] or list()
    if isinstance(default, griffe.ExprCall) and not default.arguments and isinstance(default.function, griffe.ExprLambda):
        default = default.function.body
    text = str(default)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, str):  # as the signature shows it: "auto", not 'auto'
        text = json.dumps(value, ensure_ascii=False)
    return _code(text)


def escape(text: str) -> str:
    """``text`` fit for one table cell: its ``|`` outside code spans escaped (inside them a pipe splits no cell)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "`":
            stop = span_end(text, i)
            out.append(text[i:stop])
            i = stop
            continue
        out.append("\\|" if text[i] == "|" else text[i])
        i += 1
    return "".join(out)


def table(obj: griffe.Object) -> str:
    """The parameter table of ``obj`` in Markdown ("" when it takes none)."""
    cells = rows(obj)
    if not cells:
        return ""
    lines = [TITLE, "", f'<div class="{CLASS}" markdown="1">', "", "| Name | Type | Default | Description |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {kind} | {default} | {text} |" for name, kind, default, text in cells]
    return "\n".join([*lines, "", "</div>"])


def with_table(doc: str, block: str) -> str:
    """``doc`` with ``block`` before its ``Example:`` section (at the end when it has none)."""
    if not block:
        return doc
    lines = doc.splitlines()
    at = next((i for i, line in enumerate(lines) if _EXAMPLE.match(line)), len(lines))
    head, tail = "\n".join(lines[:at]).rstrip(), "\n".join(lines[at:])
    return "\n\n".join(part for part in (head, block, tail) if part)


def documented(pkg: griffe.Module):
    """The package's public functions, methods and classes that have a docstring (not aliases, not dunders)."""
    stack = [pkg]
    while stack:
        obj = stack.pop()
        for name, member in obj.members.items():
            if member.is_alias or name.startswith("_"):
                continue
            if member.is_module or member.is_class:
                stack.append(member)
            if (member.is_class or member.is_function) and member.docstring is not None \
                    and "property" not in member.labels:
                yield member


class ParameterTables(griffe.Extension):
    """Puts :func:`table` into each documented function's, method's and class's docstring."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        griffe.DataclassesExtension().on_package(pkg=pkg)  # the fields as __init__ parameters, whatever the order
        for obj in documented(pkg):
            obj.docstring.value = with_table(obj.docstring.value, table(obj))
