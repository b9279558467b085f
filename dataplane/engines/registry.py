"""The engine registry: every engine the agent can run, by name, and how to build one.

Each engine is a package under dataplane/engines/ whose `plugin` module (see EnginePlugin) holds
its flags, its validated config dataclass and its factory. Plugin modules are imported by name
only when asked for, and must import nothing heavy themselves: `kvplane agent` imports every
plugin to build its flags, whichever engine it then runs; the factory imports the engine itself.

Flags share one namespace: an engine adds only flags no engine listed before it defines, and may
read those (`--model`, `--block-size`, ...) in its config_from_args.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any, Protocol

from kvplane.dataplane.engines.base import EngineAdapter

DEFAULT_ENGINE = "reference"
# name -> plugin module, in the order their flags are listed. The one list of engine names.
_PLUGIN_MODULES = {
    "reference": "kvplane.dataplane.engines.reference.plugin",
    "sim": "kvplane.dataplane.engines.sim.plugin",
    "vllm": "kvplane.dataplane.engines.vllm.plugin",
    "sglang": "kvplane.dataplane.engines.sglang.plugin",
}
ENGINE_NAMES = tuple(_PLUGIN_MODULES)


class UnknownEngineError(ValueError):
    """No engine of that name is registered."""


class EngineSettings(Protocol):
    def validate(self) -> Any:
        """Raises ValueError naming the first bad field; returns self."""
        ...


class EnginePlugin(Protocol):
    """The module attributes of an engine's plugin module."""

    NAME: str
    SUMMARY: str  # one line for --help
    CONFIG_TYPE: type  # its config dataclass; AgentConfig checks the config it is given

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        """Adds this engine's own flags, with defaults read from CONFIG_TYPE."""
        ...

    def config_from_args(self, args: argparse.Namespace) -> EngineSettings:
        """The validated config from parsed flags; ValueError naming the bad flag."""
        ...

    def create(self, config: Any) -> EngineAdapter:
        """Builds the engine, not started. May block for long (loading weights, connecting): the
        agent calls it in a worker thread. Raises RuntimeError with what to do when the engine
        cannot run here (e.g. its optional dependencies are not installed)."""
        ...


def plugin(name: str) -> EnginePlugin:
    """The plugin of engine `name`; UnknownEngineError listing the known names otherwise."""
    module = _PLUGIN_MODULES.get(name)
    if module is None:
        raise UnknownEngineError(f"unknown engine {name!r}; known engines: {', '.join(ENGINE_NAMES)}")
    return importlib.import_module(module)  # type: ignore[return-value]


def plugins() -> list[EnginePlugin]:
    """Every registered plugin, in ENGINE_NAMES order."""
    return [plugin(name) for name in ENGINE_NAMES]


def check_config(name: str, config: Any) -> None:
    """ValueError unless `config` is a valid config of engine `name` (which must be known)."""
    p = plugin(name)
    if not isinstance(config, p.CONFIG_TYPE):
        raise ValueError(f"engine {name!r} takes a {p.CONFIG_TYPE.__name__}, got a {type(config).__name__}")
    config.validate()


def create(name: str, config: Any) -> EngineAdapter:
    """Builds engine `name` from its config (see EnginePlugin.create: may block for long)."""
    check_config(name, config)
    return plugin(name).create(config)
