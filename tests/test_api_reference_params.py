"""The API reference's parameter tables (docs/hooks/griffe_params.py), checked without building the site: the
package loaded by griffe with the extensions mkdocs.yml gives mkdocstrings, as mkdocstrings loads it.

- every parameter of a signature has its row, in order, with its annotation as written and its default;
- each table renders as a Markdown table of four cells a row (a ``|`` of an annotation or a description splits
  no cell), after the prose and before the ``Example:`` block;
- descriptions come only from an ``Args:`` / ``Parameters`` section, a clause opening with ````name``:`` or a
  dataclass field's trailing comment; anything else leaves the cell empty.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import textwrap
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")
markdown = pytest.importorskip("markdown")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_hook", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


params = _hook("griffe_params")
api_reference = _hook("api_reference")


@pytest.fixture(scope="module")
def package():
    """``twotower`` as mkdocstrings loads it: the handler's paths and extensions from mkdocs.yml."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    handler = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    options = handler["handlers"]["python"]["options"]
    assert any(ext.endswith("griffe_params.py:ParameterTables") for ext in options["extensions"]), \
        "mkdocs.yml does not give mkdocstrings the ParameterTables extension"
    assert options.get("show_docstring_parameters") is False, "an Args: section would show in two tables"
    extensions = griffe.load_extensions(*(str(ROOT / ext) for ext in options["extensions"]))
    paths = [str(ROOT / p) for p in handler["handlers"]["python"]["paths"]]
    return griffe.load("twotower", search_paths=paths, extensions=extensions)


def _griffe_object(package, dotted: str):
    """``Index.build`` -> the griffe object that ``tt.Index.build``'s page renders."""
    import twotower

    head, *rest = dotted.split(".")
    path = api_reference._target(twotower, head).removeprefix("twotower.")
    return package[".".join([path, *rest])]


def _runtime(dotted: str):
    import twotower

    obj = twotower
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _table(doc: str) -> list[list[str]]:
    """The parameter table's rows of a docstring, as cell texts (Markdown), header and rule left out."""
    lines = doc.splitlines()
    start = lines.index("| Name | Type | Default | Description |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line.strip()[1:-1]))
    return rows


def _cells(line: str) -> list[str]:
    """A table row's cells: split at each ``|`` that is neither escaped nor inside a code span."""
    cells, cell, i = [], "", 0
    while i < len(line):
        if line[i] == "`":
            stop = params.span_end(line, i)
            cell, i = cell + line[i:stop], stop
        elif line.startswith("\\|", i):
            cell, i = cell + "\\|", i + 2
        elif line[i] == "|":
            cells, cell, i = cells + [cell.strip()], "", i + 1
        else:
            cell, i = cell + line[i], i + 1
    return cells + [cell.strip()]


def _expected_default(param: inspect.Parameter) -> str:
    if param.default is inspect.Parameter.empty:
        return "*required*"
    value = param.default
    return f"`{json.dumps(value) if isinstance(value, str) else repr(value)}`"


@pytest.mark.parametrize("name", ["evaluate", "train", "fit", "Index.build", "Index.search", "TrainConfig",
                                  "StageConfig", "Encoder.load"])
def test_every_parameter_has_a_row_with_its_annotation_and_default(package, name):
    obj = _griffe_object(package, name)
    rows = _table(obj.docstring.value)
    runtime = _runtime(name)
    signature = inspect.signature(runtime)
    expected = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    assert [row[0] for row in rows] == [f"`{stars.get(p.kind, '')}{p.name}`" for p in expected], \
        f"{name}: the table's names are not the signature's"
    for row, param in zip(rows, expected):
        if isinstance(param.annotation, str):  # from __future__ import annotations: the annotation as written
            assert row[1] == f"`{param.annotation}`", f"{name}({param.name}): type {row[1]!r}"
        if param.kind in stars:
            assert row[2] == "", f"{name}(*{param.name}): a default for a variadic parameter"
        elif param.default is not inspect.Parameter.empty and type(param.default).__name__ == "_HAS_DEFAULT_FACTORY_CLASS":
            assert row[2] not in ("", "*required*"), f"{name}({param.name}): the factory default is missing"
        else:
            assert row[2] == _expected_default(param), f"{name}({param.name}): default {row[2]!r}"


def test_a_dataclass_factory_default_shows_what_the_factory_makes(package):
    stages = {row[0]: row for row in _table(_griffe_object(package, "TrainConfig").docstring.value)}["`stages`"]
    assert stages[1:3] == ["`list[StageConfig]`", "`[StageConfig()]`"]


def test_descriptions_come_from_the_docstrings_and_the_field_comments(package):
    def cells(name: str) -> dict[str, str]:
        return {row[0].strip("`*"): row[3] for row in _table(_griffe_object(package, name).docstring.value)}

    train, evaluate, search, config = cells("train"), cells("evaluate"), cells("Index.search"), cells("TrainConfig")
    # ``hard_negatives``: ``none`` | ``bm25`` ... -- the pipes outside code escaped for the table
    assert train["hard_negatives"].startswith(r"``none`` \| ``bm25`` (mined before training) \| ``model``")
    assert train["config"].startswith("a :class:`~twotower.TrainConfig` or a TOML file")
    # the clause ends at its sentence's end, not at the next parameter's mention
    assert evaluate["dataset"] == "a :class:`~twotower.Dataset` or a BEIR folder (``split``, default ``test``)."
    assert evaluate["metrics"].startswith('e.g. ``("ndcg@10",')  # "e.g." ends no sentence
    assert evaluate["metrics"].endswith("by default nDCG@10, Recall@100, MRR@10, P@1, Recall@1000.")
    # ``a``/``b``: one description for both
    assert search["prf_depth"] == search["prf_weight"] == "dense pseudo-relevance feedback (Rocchio on vectors)."
    assert search["lam"] == ""  # the docstring says nothing of it in that form: nothing is made up
    # a dataclass field: its line's trailing comment; a comment on the lines above is not taken
    assert config["device"] == r"auto \| cpu \| cuda \| cuda:N (twotower.encoders.device)"
    assert config["attention_dropout"] == ""


def test_each_table_renders_four_cells_a_row_after_the_prose_and_before_the_example(package):
    checked = 0
    for obj in params.documented(package):
        doc = obj.docstring.value
        if params.TITLE not in doc:
            assert not params.parameters(obj), f"{obj.path}: parameters but no table"
            continue
        checked += 1
        html = markdown.markdown(doc, extensions=["tables", "md_in_html", "attr_list"])
        table = re.search(r'<div class="doc-param-table">\s*<table>(.*?)</table>', html, re.DOTALL)
        assert table, f"{obj.path}: the parameter table does not render as a table"
        body = table.group(1).split("<tbody>")[1]
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.DOTALL)
        assert len(rows) == len(params.parameters(obj)), f"{obj.path}: {len(rows)} rows"
        bad = [row for row in rows if row.count("<td") != 4]
        assert not bad, f"{obj.path}: rows without four cells (an unescaped '|'?): {bad[:2]}"
        example = re.search(r"^Examples?:", doc, re.MULTILINE)
        if example:
            assert doc.index(params.TITLE) < example.start(), f"{obj.path}: the table stands after the example"
    assert checked > 50


def _rows(code: str, path: str) -> dict[str, list[str]]:
    """The table of ``path`` in a module of ``code``, by parameter name: [type, default, description]."""
    with griffe.temporary_visited_module(textwrap.dedent(code)) as module:
        griffe.DataclassesExtension().on_package(pkg=module)
        return {row[0].strip("`*"): row[1:] for row in _table(params.table(module[path]))}


def test_args_sections_google_and_numpy_give_descriptions():
    google = _rows('''
        def f(a: int, b: str = "x", *rest, **kw):
            """Do it.

            Args:
                a: the first one,
                    over two lines.
                b: the second | or not.
            """
        ''', "f")
    assert google == {"a": ["`int`", "*required*", "the first one, over two lines."],
                      "b": ["`str`", '`"x"`', r"the second \| or not."], "rest": ["", "", ""], "kw": ["", "", ""]}
    numpy = _rows('''
        class C:
            """A thing."""

            def m(self, k: int | None = None):
                """Do it.

                Parameters
                ----------
                k : int or None
                    how many.
                """
        ''', "C.m")
    assert numpy == {"k": ["`int | None`", "`None`", "how many."]}


def test_clauses_open_with_the_name_and_a_colon_and_stop_at_their_end():
    doc = ("Run it. ``a``: one thing (see ``b``: not a clause of its own here); still a. Not a. ``b`` is said "
           "here without a colon, ``c``: three (``d``: four), e.g. ``x``; the end. Weighted by ``e``: not one. "
           "``f=True``: the flag on.")
    assert params.described(doc, ["a", "b", "c", "d", "e", "f"]) == {
        "a": "one thing (see ``b``: not a clause of its own here); still a.",
        "c": "three (``d``: four), e.g. ``x``; the end.",
        "d": "four",
        "f": "``f=True``: the flag on.",
    }


def test_dataclass_fields_take_only_their_own_lines_comment():
    rows = _rows('''
        from dataclasses import dataclass, field

        @dataclass
        class Cfg:
            """Settings."""

            # a comment above is about whatever follows, not this field alone
            name: str = "x"
            sizes: list[int] = field(default_factory=list)  # one per layer | or none
            count: int = 3  # how many "#" marks
        ''', "Cfg")
    assert rows == {"name": ["`str`", '`"x"`', ""], "sizes": ["`list[int]`", "`list()`", r"one per layer \| or none"],
                    "count": ["`int`", "`3`", 'how many "#" marks']}
