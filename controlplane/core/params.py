"""Configuration fields that document themselves, and the number checks every config shares.

Rule: a config dataclass declares each tunable with `param(default, help)`; the field's metadata
holds its help text and, where the command line has always used another name, its flag. The
control plane's flags are generated from these fields (controlplane/main.py), so a default and
its description live in one place. `check_numbers` gives every config the same validation
messages ("<Config>.<field> must be ...").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import Field, field, fields, is_dataclass
from typing import Any


def param(default: Any, help: str, *, flag: str | None = None, choices: Callable[[], Sequence[str]] | None = None) -> Any:
    """A config field with its help text; `flag` overrides the generated `--field-name`;
    `choices` lists the accepted values of a name field."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


def selector(default_factory: Callable[[], Any], help: str, *, flag: str, params_types: Callable[[], Sequence[type]]) -> Any:
    """A config field holding the params of one of several implementations (each params
    dataclass has a ClassVar `name`): the flag names the implementation, and each one's params
    are configured by their own fields."""
    return field(default_factory=default_factory, metadata={"help": help, "flag": flag, "params_types": params_types})


def flag_of(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def help_of(f: Field) -> str:
    return f.metadata.get("help", "")


def check_numbers(config: Any, *, integers: Iterable[str] = (), positive: Iterable[str] = ()) -> None:
    """Every number field of `config` is finite and >= 0; those named are also integers / > 0.
    Name fields (a string default) and nested configs are left to their owner."""
    name = type(config).__name__
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(f.default, str) or is_dataclass(value):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name}.{f.name} must be a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"{name}.{f.name} must be >= 0, got {value!r}")
    for field_name in positive:
        if getattr(config, field_name) <= 0:
            raise ValueError(f"{name}.{field_name} must be > 0, got {getattr(config, field_name)!r}")
    for field_name in integers:
        if not isinstance(getattr(config, field_name), int):
            raise ValueError(f"{name}.{field_name} must be an integer, got {getattr(config, field_name)!r}")
