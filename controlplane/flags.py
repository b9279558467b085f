"""Command-line flags generated from config dataclasses, and the configs built back from them.

Every number or name field of a config becomes a flag (`--field-name`, or the flag its
`params.param` metadata names) whose default and help come from the field; a nested config adds
its own fields; a `params.selector` field becomes a choice flag (e.g. `--routing-policy`) plus
the fields of every choice's params, their help prefixed with the choice's name. A flag for a
choice not taken is ignored. Flag names must be unique across one parser.
"""

from __future__ import annotations

import argparse
from dataclasses import Field, fields, is_dataclass
from typing import Any

from kvplane.controlplane.core.params import flag_of, help_of


def _dest(f: Field) -> str:
    return flag_of(f)[2:].replace("-", "_")


def add_config_arguments(parser: argparse.ArgumentParser, defaults: Any, help_prefix: str = "") -> None:
    """Adds a flag for every field of the config instance `defaults` (recursively)."""
    for f in fields(defaults):
        default = getattr(defaults, f.name)
        if "params_types" in f.metadata:
            types = f.metadata["params_types"]()
            parser.add_argument(
                flag_of(f), dest=_dest(f), default=default.name, choices=[t.name for t in types],
                help=f"{help_prefix}{help_of(f)} (default %(default)s)",
            )  # fmt: skip
            for params_type in types:
                chosen = default if type(default) is params_type else params_type()
                add_config_arguments(parser, chosen, f"{params_type.name} {f.name}: ")
        elif is_dataclass(default):
            add_config_arguments(parser, default, help_prefix)
        else:
            choices = f.metadata.get("choices")
            parser.add_argument(
                flag_of(f), dest=_dest(f), type=type(default), default=default,
                choices=choices() if choices else None,
                help=f"{help_prefix}{help_of(f)} (default %(default)s)",
            )  # fmt: skip


def config_from_args(args: argparse.Namespace, defaults: Any) -> Any:
    """The config of `defaults`' type with every field read back from `args` (validated by the
    config's own constructor)."""
    values = {}
    for f in fields(defaults):
        default = getattr(defaults, f.name)
        if "params_types" in f.metadata:
            name = getattr(args, _dest(f))
            params_type = next(t for t in f.metadata["params_types"]() if t.name == name)
            values[f.name] = config_from_args(args, default if type(default) is params_type else params_type())
        elif is_dataclass(default):
            values[f.name] = config_from_args(args, default)
        else:
            values[f.name] = getattr(args, _dest(f))
    return type(defaults)(**values)
