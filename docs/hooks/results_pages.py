"""MkDocs hook: the committed benchmark results (``benchmarks/results/``) as pages of the site.

Every file under ``benchmarks/results/`` is served at ``results/runs/<its path>``: each ``.md`` table becomes a
page (with a line naming the command and the machine, read from its ``.json`` twin's ``"command"`` and
``"machine"`` where the table does not state them), plots and JSON files are copied as they are, so the tables'
relative links keep working. A page holding ``<!-- results-runs -->`` gets the list of every run: page, command,
machine. Nothing is copied into docs/: the results stay where the benchmark scripts write them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.structure.files import File

MARKER = "<!-- results-runs -->"
PREFIX = "results/runs"
_COMMAND = re.compile(r"^Command:\s*`(?P<cmd>[^`]+)`", re.M)
_MACHINE = re.compile(r"^Machine:\s*(?P<machine>.+)$", re.M)


def results_dir(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent / "benchmarks" / "results"


def machine_text(machine) -> str:
    """A JSON ``"machine"`` record as one line: CPU, cores, torch, fast bf16, GPU where recorded."""
    if not isinstance(machine, dict):
        return str(machine) if machine else ""
    parts = [str(machine.get("cpu") or "")]
    if machine.get("cores"):
        parts.append(f"{machine['cores']} cores")
    if machine.get("gpu"):
        parts.append(str(machine["gpu"]))
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    if machine.get("fast_bf16") is True:
        parts.append("fast bf16")
    return ", ".join(p for p in parts if p)


def run_info(md_path: Path) -> dict:
    """Title, command and machine of one results table: from the table's own lines, else its JSON twin."""
    text = md_path.read_text(encoding="utf-8")
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), md_path.stem)
    twin = md_path.with_suffix(".json")
    data = {}
    if twin.is_file():
        try:
            data = json.loads(twin.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
    if not isinstance(data, dict):
        data = {}
    command = _COMMAND.search(text)
    machine = _MACHINE.search(text)
    return {
        "title": title,
        "command": command.group("cmd") if command else (data.get("command") or ""),
        "machine": machine.group("machine").strip() if machine else machine_text(data.get("machine")),
        "states_command": bool(command),
        "states_machine": bool(machine),
        "text": text,
    }


def page_text(md_path: Path) -> str:
    info = run_info(md_path)
    lines = info["text"].splitlines()
    extra = []
    if not info["states_command"] and info["command"]:
        extra.append(f"Command: `{info['command']}`")
    if not info["states_machine"] and info["machine"]:
        extra.append(f"Machine: {info['machine']}")
    if extra:
        at = next((i + 1 for i, line in enumerate(lines) if line.startswith("# ")), 0)
        lines[at:at] = ["", *[e + "\n" for e in extra]]
    return "\n".join(lines) + "\n"


def on_files(files, config):
    root = results_dir(config)
    if not root.is_dir():
        return files
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        uri = f"{PREFIX}/{path.relative_to(root).as_posix()}"
        if path.suffix == ".md":
            files.append(File.generated(config, uri, content=page_text(path)))
        else:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def runs_table(config) -> str:
    root = results_dir(config)
    rows = ["| run | command | machine |", "|---|---|---|"]
    for path in sorted(root.rglob("*.md")):
        info = run_info(path)
        rel = path.relative_to(root).as_posix()
        command = f"`{info['command']}`".replace("|", "\\|") if info["command"] else "in the page"
        rows.append(f"| [{info['title']}](runs/{rel}) | {command} | {info['machine'] or 'in the page'} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, runs_table(config))
