"""The CLI is a thin shell over the public API: a command module (every module of ``twotower.cli``) imports from
the library only names in ``twotower.__all__``, plus the CLI package's own modules, the exported errors and
``twotower.checks``' switch to flag names in messages, so the commands and the API cannot drift apart. The one
exception is ``twotower.cli.helpers`` (the checks a command runs before any loading, finding a data set's folder):
it may import exactly the library modules listed in HELPERS_IMPORT."""

from __future__ import annotations

import ast
from pathlib import Path

import twotower

PACKAGE = Path(twotower.__file__).resolve().parent
CLI = PACKAGE / "cli"
# twotower.checks: only its switch that makes the library's messages name options as flags (--epochs, not epochs=)
CLI_LAYER = {"twotower.errors", "twotower.checks"}
HELPERS = CLI / "helpers.py"
# what the helpers reach below the public API for: the output checks, a BEIR folder's files (outputs must not
# overwrite them), the service's option and port checks, and resolving a data set's folder
HELPERS_IMPORT = {"twotower.io", "twotower.data.beir", "twotower.serve.app", "twotower.serve.port",
                  "twotower.data.fetch", "twotower.data.metadata"}  # metadata: the limits a JSON option is read within


def command_modules() -> list[Path]:
    return sorted(CLI.rglob("*.py"))


def is_cli(module: str) -> bool:
    return module == "twotower.cli" or module.startswith("twotower.cli.")


def internal_imports(source: str) -> list[str]:
    """Every import of a twotower module, or of a twotower name outside the public API, in ``source``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("twotower.") and alias.name not in CLI_LAYER and not is_cli(alias.name):
                    bad.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("twotower")):
            module = node.module or ""
            if node.level or (module != "twotower" and module not in CLI_LAYER and not is_cli(module)):
                bad.append(f"from {'.' * node.level}{module} import …")
            elif module == "twotower":
                bad += [f"from twotower import {a.name}" for a in node.names if a.name not in twotower.__all__]
    return bad


def test_the_checker_finds_internal_imports():
    assert internal_imports("from twotower.evaluation.pipeline import run_eval") != []
    assert internal_imports("def f():\n    import twotower.retrieval.store as s") != []
    assert internal_imports("from twotower import _EXPORTS") != []
    assert internal_imports("from .pipeline import mine_pairs") != []
    assert internal_imports("from twotower.io import check_output_dir") != []
    assert internal_imports("from twotower.clinic import x") != []  # a prefix of the name is not the package
    assert internal_imports("import twotower as tt\nfrom twotower import Index, evaluate\n"
                            "from twotower.cli.console import console\nfrom twotower.cli.helpers import check_port\n"
                            "from twotower.errors import TwoTowerError") == []


def test_every_command_module_goes_through_the_public_api():
    modules = [p for p in command_modules() if p != HELPERS]
    assert len(modules) >= 12  # the package, __main__, console and the command modules
    offenders = {str(p.relative_to(PACKAGE)): bad for p in modules if (bad := internal_imports(p.read_text()))}
    assert offenders == {}


def test_the_helpers_import_only_the_listed_library_modules():
    """A new reach below the public API is a decision: it is added to HELPERS_IMPORT, or made public."""
    found = {line.split()[1] for line in internal_imports(HELPERS.read_text())}
    assert found == HELPERS_IMPORT


def test_every_command_is_defined_in_a_checked_module():
    """Each command's function lives in a module of twotower.cli, so the checks above see it."""
    import typer

    from twotower.cli import app

    checked = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in command_modules()}

    def callbacks(cmd, path: str):
        yield path, cmd.callback
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from callbacks(sub, f"{path} {name}")

    found = list(callbacks(typer.main.get_command(app), "twotower"))
    assert len(found) >= 25
    outside = {path: fn.__module__ for path, fn in found if fn is not None and fn.__module__ not in checked}
    assert outside == {}


def test_library_modules_never_import_the_cli():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(CLI):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(is_cli(n) for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_library_modules_never_print_or_exit():
    """Output is the CLI's: library code logs and raises, it never prints or ends the process."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(CLI):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("print", "sys.exit", "exit", "quit", "os._exit", "typer.Exit", "SystemExit"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert offenders == []
