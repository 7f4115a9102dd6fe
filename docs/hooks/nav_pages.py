"""MkDocs hook: a page left out of ``nav:`` in mkdocs.yml still gets a place in the navigation.

A page under ``docs/`` that the nav does not list (``not_in_nav`` excepted) is appended to the nav section that
already holds pages of its folder (``docs/guides/new-task.md`` → Guides), titled by its first ``# `` heading; a
page of a folder no section holds goes at the end of the top level. So a new guide shows up without touching
mkdocs.yml, and listing it there (to choose its place and title) still wins.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path, PurePosixPath

log = logging.getLogger("mkdocs.plugins.twotower_nav_pages")


def _pages(nav) -> list[str]:
    out: list[str] = []
    if isinstance(nav, str):
        out.append(nav)
    elif isinstance(nav, dict):
        for value in nav.values():
            out += _pages(value)
    elif isinstance(nav, list):
        for item in nav:
            out += _pages(item)
    return out


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ").capitalize()


def _section_for(nav: list, folder: str) -> list | None:
    """The first list in ``nav`` (depth first) that directly holds a page of ``folder``."""
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            if isinstance(value, str) and str(PurePosixPath(value).parent) == folder:
                return nav
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else []):
            if isinstance(value, list):
                found = _section_for(value, folder)
                if found is not None:
                    return found
    return None


def _excluded(rel: str, patterns: str | None) -> bool:
    for pattern in (patterns or "").splitlines():
        pattern = pattern.strip().lstrip("/")
        if pattern and (rel.startswith(pattern.rstrip("*")) if pattern.endswith("/") else fnmatch.fnmatch(rel, pattern)):
            return True
    return False


def on_config(config):
    nav = config.get("nav")
    if not nav:
        return config
    docs = Path(config["docs_dir"])
    listed = set(_pages(nav))
    skip = "\n".join(str(config.get(key) or "") for key in ("exclude_docs", "not_in_nav"))
    for path in sorted(docs.rglob("*.md")):
        rel = path.relative_to(docs).as_posix()
        if rel in listed or _excluded(rel, skip):
            continue
        folder = str(PurePosixPath(rel).parent)
        section = _section_for(nav, folder) if folder != "." else None
        (section if section is not None else nav).append({_title(path): rel})
        log.info("nav: %s is not listed in mkdocs.yml; shown as '%s' with the pages of %s/", rel, _title(path), folder)
    return config
