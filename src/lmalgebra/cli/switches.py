"""Switches (``--dry-run``, ``--overwrite``) given a value, as a user used to ``--flag true``
writes them: refused naming the switch.

A switch takes no value, so the word after it is the command's next argument: ``merge train
--dry-run yes recipe.yaml`` had read ``yes`` as the recipe and refused ``recipe.yaml`` as an
extra argument, and ``merge evaluate RUN --overwrite true`` refused ``true`` alone, neither naming
the switch. Every command of the tree has its arguments checked so before click reads them.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

from lmalgebra.core.errors import UserInputError

# words that say yes or no, as a value of a switch would be written; an existing file of such a
# name is an argument, as click reads it
TRUTH_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f"})


def refuse_switch_values(command: Any) -> Any:
    """``command`` (a click command or group, as typer builds it) whose commands, and theirs,
    refuse a switch followed by a yes-or-no word; returns it."""
    for sub in getattr(command, "commands", {}).values():
        refuse_switch_values(sub)
    if getattr(command, "commands", None) is None:
        command.parse_args = _checked(command, command.parse_args)
    return command


def _switches(command: Any) -> set[str]:
    """The names of ``command``'s switches (``--dry-run``, ``--no-progress``, ``-n``)."""
    return {
        name
        for param in getattr(command, "params", [])
        if getattr(param, "is_flag", False) and not getattr(param, "count", False)
        for name in (*param.opts, *param.secondary_opts)
    }


def _checked(command: Any, parse: Callable[[Any, list[str]], Any]) -> Callable[..., Any]:
    @functools.wraps(parse)
    def parse_args(ctx: Any, args: list[str]) -> Any:
        refuse_valued_switch(args, _switches(command))
        return parse(ctx, args)

    return parse_args


def refuse_valued_switch(args: Sequence[str], switches: set[str]) -> None:
    """Refuse a switch of ``switches`` followed by a yes-or-no word (``TRUTH_WORDS``) that no
    file is named: ``--dry-run yes``. After ``--`` every word is an argument."""
    for given, following in itertools.pairwise(args):
        if given == "--":
            return
        if (
            given in switches
            and following.lower() in TRUTH_WORDS
            and not os.path.lexists(following)
        ):
            raise UserInputError(
                f"{given} is a switch and takes no value, got {following!r} after it: give "
                f"{given} alone to turn it on, or leave it out"
            )
