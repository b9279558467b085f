"""Server flags from a config file and from KVPLANE_* environment variables.

Every long flag of `kvplane controlplane` and `kvplane agent` (`--flag-name`) can also be given
- as the environment variable `KVPLANE_FLAG_NAME`, and
- as the key `flag-name` (or `flag_name`) of the YAML mapping in `--config FILE` (or $KVPLANE_CONFIG).
The parser stays the one source of names, defaults, types and choices: the flags are generated from
the config dataclasses (or written once in the server's main), and this module only turns the
other sources into the parser's defaults. Precedence: the command line, then the environment, then
the file, then the built-in default. A value is converted and checked by its flag's own type and
choices, so a bad one fails as the flag would, naming where it came from. A repeatable flag takes a
YAML list (a comma-separated list in the environment); a switch takes true/false (1/0, yes/no,
on/off). A file key that names no flag is refused: a typo would otherwise change nothing, silently.
This is how Kubernetes manifests and systemd units usually configure a server (ConfigMap file plus
a few environment overrides); Dynamo and vLLM take a YAML config file the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ENV_PREFIX = "KVPLANE_"
ENV_CONFIG = "KVPLANE_CONFIG"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class FlagSourceError(ValueError):
    """A config file or environment variable that does not fit its flag."""


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None, metavar="FILE.yaml",
        help=f"read flags from a YAML mapping of flag names to values (default ${ENV_CONFIG}); every flag can also be set by "
        f"{ENV_PREFIX}FLAG_NAME; the command line wins over the environment, which wins over the file",
    )  # fmt: skip


def apply(parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Sets `parser`'s defaults from the config file named in `argv` (or the environment) and from
    the environment, so that `parser.parse_args(argv)` sees the command line over both."""
    by_name = dict(_long_flags(parser))
    path = _config_path(argv, environ)
    if path is not None:
        for key, value in _read_yaml(path).items():
            name = str(key).replace("_", "-")
            if name not in by_name:
                raise FlagSourceError(f"{path}: {key!r} is not a flag of {parser.prog} (see --help)")
            _set_default(parser, by_name[name], value, f"{path}: {key}")
    for name, action in by_name.items():
        env_name = ENV_PREFIX + name.replace("-", "_").upper()
        if env_name in environ and env_name != ENV_CONFIG:
            raw = environ[env_name]
            value: Any = raw.split(",") if isinstance(action, argparse._AppendAction) else raw
            _set_default(parser, action, value, f"${env_name}")


def _long_flags(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.dest == "config":
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                yield option[2:], action


def _config_path(argv: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", default=environ.get(ENV_CONFIG) or None)
    known, _ = early.parse_known_args(list(argv))
    return Path(known.config) if known.config else None


def _read_yaml(path: Path) -> dict[Any, Any]:
    import yaml  # noqa: PLC0415 (only servers given a config file need it)

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise FlagSourceError(f"cannot read the config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise FlagSourceError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FlagSourceError(f"{path} must hold a mapping of flag names to values, got a {type(data).__name__}")
    return data


def _set_default(parser: argparse.ArgumentParser, action: argparse.Action, value: Any, where: str) -> None:
    parser.set_defaults(**{action.dest: _convert(action, value, where)})


def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        switch = _switch(value, where)
        return switch if isinstance(action, argparse._StoreTrueAction) else not switch
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one(action, item, where) for item in items]
    if isinstance(value, (list, dict)):
        raise FlagSourceError(f"{where}: expected one value, got a {type(value).__name__}")
    return _one(action, value, where)


def _switch(value: Any, where: str) -> bool:
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise FlagSourceError(f"{where}: expected true or false, got {value!r}")


def _one(action: argparse.Action, value: Any, where: str) -> Any:
    if action.type is bool:  # bool("false") is True: read it as a switch
        return _switch(value, where)
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = action.type(text) if action.type is not None else text
    except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
        raise FlagSourceError(f"{where}: {e}") from None
    if action.choices is not None and converted not in action.choices:
        raise FlagSourceError(f"{where}: {converted!r} is not one of {sorted(map(str, action.choices))}")
    return converted
