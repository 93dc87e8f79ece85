"""``lmalgebra pretrain masked|causal|head-only``: teachers made here, one command per kind, each
with a flag for every key of its spec (``distill.pretrain.specs``); a YAML file of the same keys
may hold them, flags given override it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from lmalgebra.cli.app import CommandGroup, app, bold, console
from lmalgebra.cli.config_options import FlagStyle, config_flags, with_config_flags
from lmalgebra.cli.merge import ProgressOpt, RestartOpt
from lmalgebra.core.recipe_files import load_settings
from lmalgebra.distill.pretrain.specs import CausalPretrainSpec, HeadOnlySpec, MaskedPretrainSpec

pretrain_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="Pre-train a teacher: a masked or causal LM from scratch, or a masked-LM head on a "
    "frozen encoder.",
)
app.add_typer(pretrain_app, name="pretrain")
SpecArg = Annotated[
    Path | None, typer.Argument(help="YAML file of the spec's keys (flags override it).")
]
STYLES = {"corpus.paths": FlagStyle(comma_separated=False, metavar="PATH")}
FLAGS_NOTE = (
    "\n\nEvery key of the spec has a flag (--out, --training.steps); the "
    "defaults shown apply when neither a flag nor the file sets them."
)
KINDS: dict[str, type[BaseModel]] = {
    "masked": MaskedPretrainSpec,
    "causal": CausalPretrainSpec,
    "head-only": HeadOnlySpec,
}


def _register(kind: str, spec_type: type[BaseModel]) -> None:
    """``pretrain KIND``: a flag per key of ``spec_type``, the spec built and made."""

    def command(
        spec: SpecArg = None,
        progress: ProgressOpt = True,
        restart: RestartOpt = False,
        *,
        overrides: dict[str, Any],
    ) -> None:
        from lmalgebra.api.pretrain import pretrain

        settings: Any = load_settings(spec_type, spec, overrides, "pretrain spec")
        target = pretrain(settings, progress, restart)
        console.print(f"{kind} teacher saved to", bold(target))

    command.__name__ = f"pretrain_{kind.replace('-', '_')}"
    flags = with_config_flags(config_flags(spec_type, STYLES))(command)
    pretrain_app.command(kind, help=f"{spec_type.__doc__}{FLAGS_NOTE}")(flags)


for _kind, _spec in KINDS.items():
    _register(_kind, _spec)
