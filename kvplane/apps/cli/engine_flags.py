"""Engine flags on a command that starts agents (`kvplane up`): `--engine NAME` and every engine's
own flags, forwarded to each agent only when given, so the agent's defaults stay the one source.

The flags come from the engine plugins (dataplane/engines/registry.py), the same place `kvplane
agent` reads them from, so a new engine's flags reach `kvplane up` without code here. A flag the
command already defines itself (`kvplane up --model`, `--num-blocks`) keeps the command's meaning.
"""

from __future__ import annotations

import argparse

from kvplane.dataplane import engines


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Adds --engine and the engines' flags; returns the actions to forward (forward_args)."""
    taken = set(parser._option_string_actions)
    forwarded = [
        parser.add_argument(
            "--engine",
            choices=engines.ENGINE_NAMES,
            default=argparse.SUPPRESS,
            help=f"the engine every agent serves (default: the agent's, {engines.DEFAULT_ENGINE}); its flags below are forwarded",
        )  # fmt: skip
    ]
    staging = argparse.ArgumentParser(add_help=False)
    for plugin in engines.plugins():
        plugin.add_arguments(staging.add_argument_group(plugin.NAME))
    group = parser.add_argument_group("engine flags", "forwarded to every agent when given (see `kvplane agent --help`)")
    for action in staging._actions:
        if not action.option_strings or taken & set(action.option_strings):
            continue
        forwarded.append(
            group.add_argument(
                *action.option_strings,
                dest=action.dest,
                type=action.type,
                choices=action.choices,
                metavar=action.metavar,
                help=action.help.replace("%(default)s", str(action.default)) if action.help else None,
                default=argparse.SUPPRESS,
            )  # fmt: skip
        )
    return forwarded


def forward_args(args: argparse.Namespace, actions: list[argparse.Action]) -> list[str]:
    """The agent arguments for the forwarded flags that were given, in definition order."""
    argv: list[str] = []
    for action in actions:
        if action.dest in vars(args):
            argv += [action.option_strings[0], str(getattr(args, action.dest))]
    return argv
