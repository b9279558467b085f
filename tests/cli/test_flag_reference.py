"""docs/operations.md's flag tables are what the servers' parsers give (kvplane/apps/cli/flag_reference.py).

In process: the parsers are built as `kvplane controlplane` and `kvplane agent` build them, no server starts.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

import pytest

from kvplane.apps.cli import flag_reference
from kvplane.apps.cli.flag_reference import COMMANDS, DOC, SERVERS, WRITE_COMMAND, begin_marker, end_marker, render, render_server
from kvplane.controlplane.core.params import param
from kvplane.controlplane.flags import add_config_arguments


def _region(text: str, server: str) -> str:
    start = text.index(begin_marker(server)) + len(begin_marker(server))
    return text[start : text.index(end_marker(server))].strip("\n")


@pytest.mark.parametrize("server", sorted(COMMANDS))
def test_operations_md_lists_the_flags_the_parser_has(server: str) -> None:
    assert _region(DOC.read_text(), server) == render_server(server), (
        f"docs/operations.md's `kvplane {server}` flag tables differ from the parser: run `{WRITE_COMMAND}`"
    )


@pytest.mark.parametrize("server", sorted(COMMANDS))
def test_every_flag_has_exactly_one_row(server: str) -> None:
    parser = flag_reference.server_parser(server)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    rows = re.findall(r"^\| `(--[a-z0-9-]+)`", render(parser), re.M)  # a row's first flag (aliases follow it)
    assert sorted(rows) == sorted(flags)
    assert len(rows) == len(set(rows))
    if server in SERVERS:
        assert {"--config", "--insecure", "--metrics-port"} <= set(rows)  # the shared groups are there too
    else:  # kvplane sim: the planner's flags beside its own
        assert {"--workload", "--routing-policy", "--sim-gpu"} <= set(rows)


@dataclass(frozen=True)
class _WidgetConfig:
    max_widgets: int = param(8, "widgets per worker (0 = none)")
    mode: str = param("fast", "how widgets run", choices=lambda: ("fast", "slow"))


def test_a_config_dataclass_renders_as_a_table_with_its_defaults() -> None:
    parser = argparse.ArgumentParser(prog="kvplane widgets")
    parser.add_argument("--dry-run", action="store_true", help="print what would run")
    parser.add_argument("--label", default=None, metavar="TEXT", help="a | b, *not* <bold>, `x|y` (default: none)")
    add_config_arguments(parser.add_argument_group("widgets", "the widget pool"), _WidgetConfig(max_widgets=3))

    assert render(parser) == (
        "**general**\n\n"
        "| flag | default | help |\n"
        "|---|---|---|\n"
        "| `--dry-run` | off | print what would run |\n"
        "| `--label` | — | a \\| b, \\*not\\* \\<bold>, `x\\|y` (default: none) |\n\n"
        "**widgets**: the widget pool\n\n"
        "| flag | default | help |\n"
        "|---|---|---|\n"
        "| `--max-widgets` | `3` | widgets per worker (0 = none) |\n"
        "| `--mode` | `fast` | how widgets run; one of `fast`, `slow` |"
    )


STALE_DOC = """# Ops

Before.

{begin}
| `--gone` | `1` | a flag the parser no longer has |
{end}

After.
"""


def test_write_replaces_only_the_marked_tables_and_check_then_passes(tmp_path, capsys) -> None:
    doc = tmp_path / "operations.md"
    doc.write_text("".join(STALE_DOC.format(begin=begin_marker(s), end=end_marker(s)) for s in sorted(COMMANDS)))

    assert flag_reference.main(["--check", "--doc", str(doc)]) == 1
    assert WRITE_COMMAND in capsys.readouterr().err

    assert flag_reference.main(["--write", "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "--gone" not in text
    assert text.count("Before.") == text.count("After.") == len(COMMANDS)
    for server in COMMANDS:
        assert _region(text, server) == render_server(server)
    assert flag_reference.main(["--check", "--doc", str(doc)]) == 0
    assert flag_reference.main(["--write", "--doc", str(doc)]) == 0
    assert doc.read_text() == text  # a second write changes nothing


def test_a_doc_without_the_markers_is_refused_by_name(tmp_path, capsys) -> None:
    doc = tmp_path / "operations.md"
    doc.write_text("# Ops\n\nno tables here\n")
    assert flag_reference.main(["--write", "--doc", str(doc)]) == 1
    assert "flags:controlplane begin" in capsys.readouterr().err
    assert doc.read_text() == "# Ops\n\nno tables here\n"
