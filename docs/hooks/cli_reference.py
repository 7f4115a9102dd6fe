"""MkDocs hook: the command-line reference, generated from the typer app (``twotower.cli:app``) at build time.

A page holding the line ``<!-- cli-reference -->`` gets, in its place, one section per command and sub-command
(usage, help text, arguments and options with their types and defaults), read from the same click objects that
``twotower COMMAND --help`` prints; a new command or option appears on the next build. Typer may bring its own copy
of click, so the objects are read by what they have (``list_commands``, ``param_type_name``), not by their class.
"""

from __future__ import annotations

MARKER = "<!-- cli-reference -->"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, angle brackets as entities, one line."""
    text = " ".join(str(text).split())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _is_option(param) -> bool:
    return getattr(param, "param_type_name", "") == "option"


def _is_group(command) -> bool:
    return hasattr(command, "list_commands") and hasattr(command, "get_command")


def _type_name(param, ctx) -> str:
    """The value's type as --help shows it (``path``, ``int range``, ``list[str]``), with the range's bounds."""
    if _is_option(param) and param.is_flag:
        return "flag"
    kind = getattr(param, "type", None)
    if getattr(kind, "choices", None):
        return " \\| ".join(str(c) for c in kind.choices)
    shown = param.display_type(ctx) if callable(getattr(param, "display_type", None)) else getattr(kind, "name", "")
    shown = str(shown).strip("<>").replace(" range", "")
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is not None and hi is not None:
        shown += f" {lo}–{hi}"
    elif lo is not None:
        shown += f" ≥ {lo}"
    elif hi is not None:
        shown += f" ≤ {hi}"
    return _cell(shown)


def _default(param) -> str:
    if param.required:
        return "required"
    default = param.default
    if default is None or callable(default) or getattr(param, "show_default", True) is False:
        return ""
    if _is_option(param) and param.is_flag and param.secondary_opts:
        # a --x/--no-x pair: name the side that is on by default
        return f"`{(param.opts if default else param.secondary_opts)[0]}`"
    if isinstance(default, (list, tuple)):
        return ", ".join(f"`{d}`" for d in default) if default else ""
    if _is_option(param) and param.is_flag:
        return "on" if default else "off"
    return f"`{default}`"


def _help_text(command) -> str:
    text = (command.help or command.short_help or "").strip()
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def _section(path: list[str], command, ctx, level: int) -> list[str]:
    name = " ".join(path)
    out = [f"{'#' * level} `{name}` {{ #{'-'.join(path)} }}", ""]
    help_text = _help_text(command)
    if help_text:
        out += [help_text, ""]
    pieces = " ".join(command.collect_usage_pieces(ctx))
    out += ["```text", f"Usage: {name} {pieces}".rstrip(), "```", ""]
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)
              and p.name not in ("help", "install_completion", "show_completion")]
    arguments = [p for p in params if getattr(p, "param_type_name", "") == "argument"]
    options = [p for p in params if _is_option(p)]
    if arguments:
        out += ["| Argument | Type | Default | Description |", "|---|---|---|---|"]
        for p in arguments:
            out.append(f"| `{p.name.upper()}` | {_type_name(p, ctx)} | {_default(p)} | {_cell(getattr(p, 'help', '') or '')} |")
        out.append("")
    if options:
        out += ["| Option | Type | Default | Description |", "|---|---|---|---|"]
        for p in options:
            flags = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            out.append(f"| {flags} | {_type_name(p, ctx)} | {_default(p)} | {_cell(p.help or '')} |")
        out.append("")
    if _is_group(command):
        names = command.list_commands(ctx)
        if names:
            out += ["Commands: " + ", ".join(f"[`{c}`](#{'-'.join([*path, c])})" for c in names) + ".", ""]
        for sub in names:
            child = command.get_command(ctx, sub)
            if child is None or child.hidden:
                continue
            sub_ctx = child.context_class(child, info_name=sub, parent=ctx)
            out += _section([*path, sub], child, sub_ctx, min(level + 1, 4))
    return out


def cli_markdown() -> str:
    """The reference of every ``twotower`` command as Markdown."""
    import typer

    from twotower.cli import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="twotower")
    lines = _section(["twotower"], root, ctx, 2)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_markdown())
