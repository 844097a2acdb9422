"""Command-line flags for the methods' options, built from the :class:`~normx.methods.Option` objects the methods
carry: one flag per option name (``--n-steps``, ``--aggregation``, ``--no-biases``, ...), whatever method takes it.
"""

from __future__ import annotations

import argparse
from typing import Any

from normx.methods import Option, get_method, list_methods


def _by_name(methods: list[str] | None = None) -> dict[str, list[tuple[str, Option]]]:
    options: dict[str, list[tuple[str, Option]]] = {}
    for method in list_methods(experimental=True) if methods is None else methods:
        for name, option in get_method(method).options.items():
            options.setdefault(name, []).append((method, option))
    return options


def flag_of(option: Option) -> str:
    if option.flag:
        return option.flag
    dashed = option.name.replace("_", "-")
    return f"--no-{dashed}" if option.type is bool and option.default is True else f"--{dashed}"


def add_method_flags(parser: argparse.ArgumentParser, methods: list[str] | None = None,
                     own: tuple[str, ...] = ()) -> None:
    """One flag per option of the registered methods (or of ``methods`` only: a command for some of them; ``own``:
    options the command has flags of its own for), in a group of their own; unset flags read as None."""
    group = parser.add_argument_group("method options (only for the methods that take them; see `normx methods`)")
    for name, takers in sorted(_by_name(methods).items()):
        if name in own:
            continue
        first = takers[0][1]
        same: dict[tuple[str, str], list[str]] = {}  # methods that say the same of the option, together
        for method, option in takers:
            same.setdefault((option.help, repr(option.default)), []).append(method)
        if first.type is bool:  # a flag's help says what giving it does, not the option's default value
            word = "off" if first.default is True else "on"
            helps = "; ".join(f"{', '.join(methods)}: turns {word} '{text}'" for (text, _), methods in same.items())
            action = "store_false" if first.default is True else "store_true"
            group.add_argument(flag_of(first), dest=name, action=action, default=None, help=helps)
            continue
        helps = "; ".join(f"{', '.join(methods)}: {text} (default {default})"
                          for (text, default), methods in same.items())
        choices = None
        if all(option.choices for _, option in takers):
            choices = list(dict.fromkeys(c for _, option in takers for c in option.choices))
        kind = first.type if first.type in (int, float) else str
        group.add_argument(flag_of(first), dest=name, type=kind, choices=choices, default=None, help=helps)


def given_options(args: argparse.Namespace, methods: list[str] | None = None, own: tuple[str, ...] = ()
                  ) -> dict[str, Any]:
    """The method options set on the command line (name -> value), of the flags :func:`add_method_flags` added for
    ``methods`` (and ``own``)."""
    return {name: getattr(args, name) for name in _by_name(methods)
            if name not in own and getattr(args, name, None) is not None}


def option_words(args: argparse.Namespace) -> list[str]:
    """The method options set on the command line, as they were typed (to record a command)."""
    takers = _by_name()
    words = []
    for name, value in given_options(args).items():
        option = takers[name][0][1]
        words.append(flag_of(option) if option.type is bool else f"{flag_of(option)} {value}")
    return words
