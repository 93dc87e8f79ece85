"""The command-line application object, its console and the parsing helpers the commands share."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from lmalgebra.core.errors import UserInputError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Measure how much of one language model is contained in others (LMD).",
)
console = Console()


def split_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [item for value in values for item in value.split(",") if item]


def parse_numbers(text: str | None, kind: type, flag: str) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserInputError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
