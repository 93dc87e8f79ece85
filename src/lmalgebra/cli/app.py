"""The command-line application object and its console, shared by the commands.

Global options (``--version``, ``-v``/``-q``) are handled here; ``-h`` works wherever ``--help``
does, and ``--install-completion`` sets up shell completion.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.console import Console

HELP = (
    "lmalgebra: linear algebra over language models.\n\n"
    "Two jobs. LMD: `decompose` fits every model's embeddings on the others' (ridge, closed "
    "form) and reports pairwise and group R^2, how much of one model the others contain. "
    "MergeDistill: `merge` distils several teacher LMs (masked LMs, or causal LMs with any "
    "tokenizers), each with its own tokenizer and languages, into one student, and scores it "
    "against its teachers; `pretrain` makes teachers.\n\n"
    "Example: lmalgebra decompose --models a=package:minilm --models b=package:minilm-sre "
    "--corpus.paths package:wiki-en --corpus.text_column extract --out runs/minilm"
)
CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
    help=HELP,
)
console = Console()


def _version(value: bool) -> None:
    if value:
        from lmalgebra import __version__

        console.print(f"lmalgebra {__version__}")
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug messages too.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")] = False,
) -> None:
    """Global options: set how much the commands log."""
    if verbose and quiet:
        raise typer.BadParameter("--verbose and --quiet exclude each other")
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.getLogger().setLevel(level)
