"""The command-line application object and its console, shared by the commands."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Measure how much of one language model is contained in others (LMD).",
)
console = Console()
