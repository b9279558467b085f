"""Helpers every CLI command shares: the endpoint option, argument types, JSON and table output."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from kvplane import errors
from kvplane.client import DEFAULT_ENDPOINT, ENDPOINT_ENV, Client
from kvplane.security import flags as security_flags
from kvplane.security.credentials import CredentialsError

# Exit codes, one per thing a script may want to tell apart (docs/operations.md lists them).
EXIT_FAILED = 1  # any other failure (the server refused for another reason, not found, ...)
EXIT_USAGE = 2  # the command line is wrong (argparse's own code), or local credentials are
EXIT_INVALID = 3  # the server refused the request as malformed (INVALID_ARGUMENT): fix it, do not retry
EXIT_AUTH = 4  # not authenticated or not allowed (UNAUTHENTICATED, PERMISSION_DENIED)
EXIT_UNAVAILABLE = 5  # the control plane could not be reached or did not answer in time
EXIT_REJECTED = 6  # admission control refused the request (RESOURCE_EXHAUSTED): retry after the hint

_EXIT_BY_ERROR: tuple[tuple[type[errors.KvplaneError], int], ...] = (
    (errors.RejectedError, EXIT_REJECTED),
    (errors.InvalidArgumentError, EXIT_INVALID),
    (errors.UnauthenticatedError, EXIT_AUTH),
    (errors.PermissionDeniedError, EXIT_AUTH),
    (errors.UnavailableError, EXIT_UNAVAILABLE),
)


def exit_code_of(error: errors.KvplaneError) -> int:
    """The exit code for a failed call: which kind of failure, so a script can react to it."""
    return next((code for kind, code in _EXIT_BY_ERROR if isinstance(error, kind)), EXIT_FAILED)


class CliError(Exception):
    """A user-facing failure: printed as one line on stderr, then exit with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def extra_needed(*, extra: str, what: str) -> Iterator[None]:
    """Turns a third-party package missing while `what` imports or runs into a CliError naming the
    extra to install: the base install is the SDK and the client commands (grpcio, protobuf);
    servers, `kvplane up` and `kvplane certs` need more (pyproject.toml's extras)."""
    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "kvplane").split(".")[0] == "kvplane":
            raise  # our own module missing is a bug, not an install choice
        raise CliError(
            f"{what} needs the package {e.name!r}, which kvplane's base install leaves out: pip install 'kvplane[{extra}]'", EXIT_USAGE
        ) from None


def import_extra(module: str, *, extra: str, what: str) -> ModuleType:
    """`module`, imported under extra_needed()."""
    with extra_needed(extra=extra, what=what):
        return importlib.import_module(module)


def usage_error(parser: argparse.ArgumentParser) -> int:
    """A command group run without its subcommand: its help goes to stderr (it is an error), exit code 2."""
    parser.print_help(sys.stderr)
    return 2


def client_parent() -> argparse.ArgumentParser:
    """Options shared by every command that talks to a control plane."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--endpoint",
        default=None,
        help=f"control plane host:port, or several replicas comma-separated, tried in turn (default: ${ENDPOINT_ENV}, else {DEFAULT_ENDPOINT})",
    )
    parent.add_argument("--timeout", type=positive_float, default=None, metavar="SECONDS", help="deadline for the call")
    security_flags.add_client_arguments(parent)
    return parent


def connect(args: argparse.Namespace, timeout: float | None = None) -> Client:
    """The SDK client for a command's --endpoint, --timeout and credential flags."""
    try:
        credentials = security_flags.client_credentials_from_args(args)
        return Client(args.endpoint, timeout=timeout or args.timeout, credentials=credentials, token=args.token)
    except CredentialsError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def format_bytes(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
