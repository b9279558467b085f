"""`kvplane`: the entry point. Parses the command line, runs one command, turns errors into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from kvplane.apps.cli import admin, certs, config, delegate, generate, top, up
from kvplane.apps.cli.common import CliError, exit_code_of, usage_error
from kvplane.errors import KvplaneError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvplane",
        description="Client and admin CLI for kvplane, a prefill/decode disaggregated LLM serving plane.",
        epilog="exit codes: 0 ok, 1 other failure, 2 usage, 3 request refused as invalid, "
        "4 not authenticated or not allowed, 5 control plane unavailable, 6 rejected by admission (retry later)",
    )
    parser.add_argument("--version", action="version", version=f"kvplane {_version()}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    generate.register(subparsers)
    admin.register(subparsers)
    config.register(subparsers)
    top.register(subparsers)
    up.register(subparsers)
    certs.register(subparsers)
    delegate.register(subparsers)
    return parser


def _version() -> str:
    try:
        return metadata.version("kvplane")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


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
        return e.exit_code if isinstance(e, CliError) else exit_code_of(e)
    except KeyboardInterrupt:
        print("kvplane: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); nothing more to say to it.
        sys.stderr.close()
        return 1
