"""`kvplane`: the entry point. Parses the command line, runs one command, turns errors into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvplane.apps.cli import admin, certs, config, delegate, generate, top, up
from kvplane.apps.cli.common import CliError, usage_error
from kvplane.errors import KvplaneError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvplane",
        description="Client and admin CLI for kvplane, a prefill/decode disaggregated LLM serving plane.",
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    generate.register(subparsers)
    admin.register(subparsers)
    config.register(subparsers)
    top.register(subparsers)
    up.register(subparsers)
    certs.register(subparsers)
    delegate.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        found = delegate.find(argv)
        if found is not None:
            return delegate.run(*found)
        parser = build_parser()
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):
            return usage_error(parser)
        return int(args.func(args) or 0)
    except (KvplaneError, CliError) as e:
        print(f"kvplane: error: {e}", file=sys.stderr)
        return e.exit_code if isinstance(e, CliError) else 1
    except KeyboardInterrupt:
        print("kvplane: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); nothing more to say to it.
        sys.stderr.close()
        return 1
