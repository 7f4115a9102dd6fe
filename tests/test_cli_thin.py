"""The CLI is a thin shell over the public API: a command module imports from ``twotower`` only names in
``twotower.__all__`` (plus the CLI's own printing module ``twotower.console``, the exported errors and ``twotower.checks``' switch to
flag names in messages), so the
commands and the API cannot drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

import twotower

PACKAGE = Path(twotower.__file__).resolve().parent
# twotower.checks: only its switch that makes the library's messages name options as flags (--epochs, not epochs=)
CLI_LAYER = {"twotower.console", "twotower.errors", "twotower.cli", "twotower.checks"}


def command_modules() -> list[Path]:
    found = [PACKAGE / "cli.py", *PACKAGE.rglob("commands.py"), *PACKAGE.rglob("*_commands.py")]
    return sorted(set(found))


def internal_imports(source: str) -> list[str]:
    """Every import of a twotower module, or of a twotower name outside the public API, in ``source``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("twotower.") and alias.name not in CLI_LAYER:
                    bad.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("twotower")):
            module = node.module or ""
            if node.level or (module != "twotower" and module not in CLI_LAYER):
                bad.append(f"from {'.' * node.level}{module} import …")
            elif module == "twotower":
                bad += [f"from twotower import {a.name}" for a in node.names if a.name not in twotower.__all__]
    return bad


def test_the_checker_finds_internal_imports():
    assert internal_imports("from twotower.evaluation.pipeline import run_eval") != []
    assert internal_imports("def f():\n    import twotower.retrieval.store as s") != []
    assert internal_imports("from twotower import _EXPORTS") != []
    assert internal_imports("from .pipeline import mine_pairs") != []
    assert internal_imports("import twotower as tt\nfrom twotower import Index, evaluate\n"
                            "from twotower.console import console\nfrom twotower.errors import TwoTowerError") == []


def test_every_command_module_goes_through_the_public_api():
    modules = command_modules()
    assert len(modules) >= 8  # cli.py and the seven command modules it registers
    offenders = {str(p.relative_to(PACKAGE)): bad for p in modules if (bad := internal_imports(p.read_text()))}
    assert offenders == {}


def test_every_registered_command_module_is_checked():
    from twotower.cli import COMMAND_MODULES

    checked = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in command_modules()}
    assert set(COMMAND_MODULES) <= checked


def test_library_modules_never_import_the_cli():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path in command_modules() or path.name == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "twotower.cli" or n.endswith("commands") or n == "twotower.console" for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_library_modules_never_print_or_exit():
    """Output is the CLI's: library code logs and raises, it never prints or ends the process."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path in command_modules() or path.name == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("print", "sys.exit", "exit", "quit", "os._exit", "typer.Exit", "SystemExit"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert offenders == []
