"""The flag tables of docs/operations.md, rendered from the servers' own parsers.

`kvplane controlplane` and `kvplane agent` build their flags in code: most are generated from the
config dataclasses (controlplane/flags.py, each field's `param` help), the rest are written once in
the server's main, the engine plugins, security/flags.py and telemetry/flags.py. This module
builds those very parsers (delegate.build_parser, as the CLI does) and renders each argument group
as a Markdown table (flag, default, help), so the docs cannot drift from the code:

    python -m kvplane.apps.cli.flag_reference            # print the tables
    python -m kvplane.apps.cli.flag_reference --write    # rewrite them in docs/operations.md
    python -m kvplane.apps.cli.flag_reference --check    # exit 1 when the docs differ

In the docs each command's tables (the servers' and `kvplane sim`'s) sit between
`<!-- flags:NAME begin ... -->` and `<!-- flags:NAME end -->`; only the text between the markers is generated. A help text that ends
in "(default %(default)s)" loses that suffix here: the default has its own column.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

from kvplane.apps.cli.delegate import DELEGATES, Delegate, build_parser

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
WRITE_COMMAND = "python -m kvplane.apps.cli.flag_reference --write"
# The servers whose flags the docs list, by command name: `kvplane controlplane`, `kvplane agent`.
SERVERS: dict[str, Delegate] = {d.command[0]: d for d in DELEGATES if d.server}
# Every command with a generated table: the servers and `kvplane sim` (the planner's flags with
# the simulator's own).
COMMANDS: dict[str, Delegate] = {**SERVERS, "sim": next(d for d in DELEGATES if d.command == ("sim",))}
_DEFAULT_SUFFIX = " (default %(default)s)"
_NO_VALUE = "—"


def begin_marker(server: str) -> str:
    return f"<!-- flags:{server} begin (generated from the parser: {WRITE_COMMAND}) -->"


def end_marker(server: str) -> str:
    return f"<!-- flags:{server} end -->"


def server_parser(server: str) -> argparse.ArgumentParser:
    """The parser `kvplane SERVER` runs with (its --config flag included); any of COMMANDS."""
    delegate = COMMANDS[server]
    return build_parser(delegate, importlib.import_module(delegate.module))


def render(parser: argparse.ArgumentParser) -> str:
    """Every flag of `parser` but --help, one Markdown table per argument group, in the parser's order."""
    sections = []
    for group in parser._action_groups:  # argparse keeps its groups only here; --help walks the same list
        actions = [a for a in group._group_actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = "general" if group is parser._optionals else group.title
        heading = f"**{_cell(title)}**" + (f": {_cell(group.description)}" if group.description else "")
        rows = [f"| {_flag(a)} | {_default(a)} | {_help(a)} |" for a in actions]
        sections.append("\n".join([heading, "", "| flag | default | help |", "|---|---|---|", *rows]))
    return "\n\n".join(sections)


def render_server(server: str) -> str:
    return render(server_parser(server))


def _flag(action: argparse.Action) -> str:
    return ", ".join(f"`{option}`" for option in action.option_strings)


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    value = action.default
    if value is None or value == "" or value == []:
        return _NO_VALUE
    return f"`{_code(str(value))}`"


def _help(action: argparse.Action) -> str:
    text = (action.help or "").removesuffix(_DEFAULT_SUFFIX)
    # As argparse expands it for --help (HelpFormatter._expand_help): %(default)s, %(choices)s ...
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in action.choices)
    text = text % params
    if action.choices is not None:
        text += ("; one of " if text else "one of ") + ", ".join(f"`{c}`" for c in action.choices)
    return _cell(text)


def _code(text: str) -> str:
    return text.replace("|", "\\|")


def _cell(text: str) -> str:
    """`text` as one table cell: emphasis and HTML tags' characters escaped outside code spans."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside `code spans`
        parts[i] = re.sub(r"([*<])", r"\\\1", parts[i])
    return _code("`".join(parts))


def replace_tables(text: str, server: str, tables: str) -> str:
    """`text` with the region between `server`'s markers replaced by `tables`; ValueError naming a
    missing marker."""
    begin, end = begin_marker(server), end_marker(server)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no '{begin}' ... '{end}' region for `kvplane {server}`'s flags")
    return text[: start + len(begin)] + "\n\n" + tables + "\n\n" + text[stop:]


def generated(text: str) -> str:
    """`text` with every server's tables as the parsers give them now."""
    for server in COMMANDS:
        text = replace_tables(text, server, render_server(server))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvplane.apps.cli.flag_reference", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite the tables in {DOC.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 when the tables in {DOC.name} differ from the parsers")
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown file (default: docs/operations.md)")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print("\n\n".join(f"## kvplane {server}\n\n{render_server(server)}" for server in COMMANDS))
        return 0
    text = args.doc.read_text()
    try:
        new = generated(text)
    except ValueError as e:
        print(f"{args.doc}: {e}", file=sys.stderr)
        return 1
    if args.check:
        if new != text:
            print(f"{args.doc}: the flag tables differ from the parsers; run `{WRITE_COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.doc.write_text(new)
        print(f"{args.doc}: flag tables rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
