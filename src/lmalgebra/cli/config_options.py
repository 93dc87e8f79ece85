"""Command-line flags generated from a typed config: one flag per field, named by its recipe key.

``config_flags`` walks a pydantic model, nested models included, and describes one flag per leaf
field: ``--spans.length`` sets ``spans.length``, ``--batch_size`` sets ``batch_size``: the flag is
the key, so a setting has one name in a recipe, on the command line and as a Python keyword. A field
may declare a documented short form (``json_schema_extra={"short_flag": "-T"}``). The help text is
the field's ``description`` and the default shown is the field's default, so both are written once,
at the field. ``with_config_flags`` adds those flags to a typer command and hands it the values the
user gave as a nested dict of recipe keys, ready to lay over a YAML recipe: a flag that is not given
overrides nothing.

Values are read by the field's type: a list is repeated or comma-separated (``--basis a,b``), a
tuple is one comma list (``--spans.counts 20,5,5``), a bool is ``--x/--no-x``, a ``Literal`` is one
of its choices, a field that is a list or a mapping (``training.teachers``) one YAML value
(``'{en: [a], fr: [b]}'``, or ``a,b`` for a list). A value that does not parse stops the command
with one line naming the flag.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import typer
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from rich.markup import escape

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import parse_yaml
from lmalgebra.core.settings import EMPTY_PATH, bool_for_number, inside_value, is_empty_path
from lmalgebra.sources.models import ModelRef

FlagKind = Literal["value", "list", "tuple", "switch", "structured"]
# a list or tuple default longer than this is summarised in --help, not spelled out
_LONGEST_DEFAULT = 6


@dataclass(frozen=True)
class FlagStyle:
    """What the type of a field does not say about its flag.

    ``comma_separated``: whether list items may be joined by commas (not for paths, which may
    contain them). ``parse``: turns one item of a list into the value the config expects (a model
    reference string into a model entry). ``metavar``: the value's placeholder in ``--help``.
    """

    comma_separated: bool = True
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None


def model_entry(text: str) -> dict[str, Any]:
    """``[NAME=][random:]PATH[@REVISION]`` (and the onnx:/precomputed: forms) as a recipe entry."""
    return ModelRef.parse(text).model_dump()


MODEL_FLAG = FlagStyle(comma_separated=False, parse=model_entry, metavar="MODEL")  # one per flag


@dataclass(frozen=True)
class ConfigFlag:
    """One field of a config as a command-line flag."""

    key: str  # the dotted recipe key, e.g. ``spans.length``
    field: FieldInfo
    item_type: Any  # the field's type without ``None``; for a list, the item type
    kind: FlagKind
    style: FlagStyle
    panel: str | None  # the nested config it belongs to, a section of --help

    @property
    def parameter_name(self) -> str:
        return self.key.replace(".", "__")

    @property
    def names(self) -> list[str]:
        """The flag, ``--`` and the recipe key, then the field's documented short form if any."""
        extra = self.field.json_schema_extra
        short = extra.get("short_flag") if isinstance(extra, dict) else None
        return [f"--{self.key}", *([str(short)] if short else [])]

    @property
    def label(self) -> str:
        return " / ".join(self.names)

    def option(self) -> Any:
        """The typer option, with the help and default taken from the field."""
        if self.kind == "switch":
            declarations = [f"{n}/--no-{n.removeprefix('--')}" for n in self.names if n[1] == "-"]
        else:
            declarations = self.names
        help_text = self.field.description or ""
        default = default_text(self)
        if default is not None:
            # written into the help: click would show a computed default as "(text)"
            help_text += f" [default: {default}]"
        return typer.Option(
            *declarations,
            help=escape(help_text),  # brackets in descriptions are text, not rich markup
            metavar=self.style.metavar or (None if self.kind == "switch" else _metavar(self)),
            rich_help_panel=self.panel,
        )

    def parameter(self) -> inspect.Parameter:
        """The keyword parameter typer reads the option from (``None`` when not given)."""
        kinds = {"value": str, "tuple": str, "list": list[str], "switch": bool, "structured": str}
        raw = kinds[self.kind]
        return inspect.Parameter(
            self.parameter_name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[raw | None, self.option()],
        )

    def convert(self, given: Any) -> Any:
        """The config value of what the user typed (a string, strings, or a bool)."""
        if self.kind == "switch":
            return bool(given)
        if self.kind in ("list", "tuple") and self.style.comma_separated:
            given = self._flow_list(given)
        if self.kind == "list":
            text = ",".join(given)
            if text.strip() == "null" and type(None) in typing.get_args(self.field.annotation):
                return None  # YAML's null, as a recipe reads it: none, over the recipe's list
            # a blank item of a list of paths (one a flag) is kept, to be refused as empty
            kept = not self.style.comma_separated
            items = [i.strip() for v in given for i in self._split(v) if i.strip() or kept]
            if self.style.parse is not None:
                return [self.style.parse(item) for item in items]
            return self._validate(items, text)
        if self.kind == "tuple":
            items = [i.strip() for i in given.split(",")]
            length = len(typing.get_args(self.item_type))
            if ... not in typing.get_args(self.item_type) and len(items) != length:
                raise UserInputError(
                    f"{self.label} {given!r}: expected {length} values, comma-separated"
                )
            return self._validate(items, given)
        if self.kind == "structured":
            return self._validate(self._structured(given), given)
        return self._validate(given, given)

    def _structured(self, text: str) -> Any:
        """A list or a mapping written as YAML (``[a, b]``, ``{en: [a], fr: [b]}``), or YAML's
        null (``null``: none, as in a recipe; it had been taken for a name); a bare ``a,b`` is a
        comma list."""
        value = parse_yaml(text, f"{self.label} {text!r}")  # as a recipe reads it
        if isinstance(value, (list, dict)) or (value is None and text.strip()):
            return value
        return [item.strip() for item in text.split(",") if item.strip()]

    def _flow_list(self, given: Any) -> Any:
        """YAML's ``[a, b]`` (a list as a recipe writes it) as the comma list ``a,b``; anything
        else as given (its items had been read as ``[a`` and ``b]``, each no number)."""
        text = (given if isinstance(given, str) else ",".join(given)).strip()
        if not (text.startswith("[") and text.endswith("]")):
            return given
        value = self._structured(text)
        joined = ",".join(map(str, value)) if isinstance(value, list) else text
        return joined if isinstance(given, str) else [joined]

    def _split(self, value: str) -> list[str]:
        return value.split(",") if self.style.comma_separated else [value]

    def _validate(self, value: Any, text: str) -> Any:
        if isinstance(value, str) and _without_none(self.field.annotation) is float:
            with contextlib.suppress(ValueError):
                if not math.isfinite(float(value)):  # NaN would fail ge=0 with a confusing reason
                    raise UserInputError(f"{self.label} {text!r}: not a finite number")
        if is_empty_path(self.field.annotation, value, self.field.metadata):  # not Path(".")
            raise UserInputError(f"{self.label} {text!r}: {EMPTY_PATH}")
        if bool_for_number(self.field.annotation, value):  # YAML's ``{alm: true}``, as a file's
            raise UserInputError(f"{self.label} {text!r}: a boolean is no number")
        annotation: Any = self.field.annotation
        for constraint in self.field.metadata:  # such as ``ge=1``
            annotation = Annotated[annotation, constraint]
        try:
            read = TypeAdapter(annotation).validate_python(value)
        except ValidationError as err:
            raise UserInputError(f"{self.label} {text!r}: {inside_value(err)}") from None
        if any(isinstance(v, float) and not math.isfinite(v) for v in _values(read)):
            raise UserInputError(f"{self.label} {text!r}: not a finite number")  # ``{alm: .nan}``
        return read


def _values(value: Any) -> list[Any]:
    """The items of a list or the values of a mapping a structured flag's YAML gave."""
    return list(value.values()) if isinstance(value, Mapping) else [value]


def _without_none(annotation: Any) -> Any:
    """``int | None`` -> ``int``; other types as they are."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _is_config(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _kind(key: str, annotation: Any, style: FlagStyle) -> tuple[FlagKind, Any]:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "switch", bool
    if origin is list:
        (item,) = typing.get_args(annotation)
        if _is_config(item) and style.parse is None:
            raise TypeError(f"{key}: a list of configs needs a FlagStyle.parse")
        return "list", item
    if origin is tuple:
        return "tuple", annotation
    if origin is dict or (
        origin in (Union, types.UnionType)
        and all(
            typing.get_origin(a) in (list, dict)
            for a in typing.get_args(annotation)
            if a is not type(None)
        )
    ):  # a mapping, or a list or a mapping (``training.teachers``): written as YAML
        return "structured", annotation
    if origin in (dict, Mapping, Union, types.UnionType) or _is_config(annotation):
        raise TypeError(f"{key}: no flag for a field of type {annotation}; skip it")
    return "value", annotation


def config_flags(
    model: type[BaseModel],
    styles: Mapping[str, FlagStyle] | None = None,
    skip: Collection[str] = (),
    prefix: str = "",
) -> list[ConfigFlag]:
    """A flag for every field of ``model``, nested configs walked, in field order.

    ``styles``: per dotted key, parsing and placeholder; ``skip``: dotted keys that get no flag
    (a field no command line can express, such as a mapping of names to configs); ``prefix``:
    where ``model`` sits in a larger recipe (``"training."``).
    """
    styles = styles or {}
    flags = _walk(model, prefix, styles, skip)
    unknown = set(styles) - {f.key for f in flags}
    if unknown:
        raise ValueError(f"styles for keys without a flag in {model.__name__}: {sorted(unknown)}")
    return flags


def _walk(
    model: type[BaseModel], prefix: str, styles: Mapping[str, FlagStyle], skip: Collection[str]
) -> list[ConfigFlag]:
    flags = []
    for name, field in model.model_fields.items():
        key = prefix + name
        if key in skip:
            continue
        annotation = _without_none(field.annotation)
        if _is_config(annotation):
            flags += _walk(annotation, f"{key}.", styles, skip)
            continue
        style = styles.get(key, FlagStyle())
        kind, item_type = _kind(key, annotation, style)
        flags.append(ConfigFlag(key, field, item_type, kind, style, prefix.rstrip(".") or None))
    return flags


def default_text(flag: ConfigFlag) -> str | None:
    """The default as ``--help`` shows it; ``None`` when the field is required or unset."""
    if flag.field.is_required() or flag.field.default_factory_takes_validated_data:
        return None  # required, or computed from other keys (its description says how)
    value = flag.field.get_default(call_default_factory=True)
    if value is None:
        return None
    if isinstance(value, bool):
        # the spelling that is in force, as click shows switches
        return flag.key if value else f"no-{flag.key}"
    if isinstance(value, (list, tuple)):
        if len(value) > _LONGEST_DEFAULT:
            return f"{len(value)} values, {_shown(value[0])} to {_shown(value[-1])}"
        return ",".join(_shown(v) for v in value)
    return _shown(value)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _metavar(flag: ConfigFlag) -> str:
    def name(annotation: Any) -> str:
        if typing.get_origin(annotation) is Annotated:  # a PathText: the text it holds
            annotation = typing.get_args(annotation)[0]
        if typing.get_origin(annotation) is Literal:
            return "|".join(str(a) for a in typing.get_args(annotation))
        names = {int: "INT", float: "FLOAT", str: "TEXT"}
        return names.get(annotation, getattr(annotation, "__name__", "VALUE").upper())

    if flag.kind == "tuple":
        return ",".join(name(a) for a in typing.get_args(flag.item_type))
    if flag.kind == "structured":
        return "{KEY: VALUE}" if typing.get_origin(flag.item_type) is dict else "A,B|{KEY: [A]}"
    if flag.kind == "list":
        return f"{name(flag.item_type)},..." if flag.style.comma_separated else name(flag.item_type)
    return name(flag.item_type)


def given_values(flags: list[ConfigFlag], values: Mapping[str, Any]) -> dict[str, Any]:
    """The flags the user gave, converted and nested by recipe key (``{"spans": {"length": 8}}``).

    ``values``: parameter name -> what typer parsed (``None``, or an empty list, when not given).
    """
    nested: dict[str, Any] = {}
    for flag in flags:
        given = values.get(flag.parameter_name)
        if given is None or (flag.kind == "list" and not given):
            continue
        *parents, leaf = flag.key.split(".")
        level = nested
        for parent in parents:
            level = level.setdefault(parent, {})
        level[leaf] = flag.convert(given)
    return nested


def with_config_flags(
    flags: list[ConfigFlag],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add ``flags`` to a command; it receives what was given as ``overrides=``.

    The decorated command declares its other parameters as usual, plus a keyword-only
    ``overrides: dict[str, Any]``; typer sees those parameters followed by one option per flag.
    """

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "overrides"]
        names = {f.parameter_name for f in flags}

        def run(**values: Any) -> Any:
            generated = {name: values.pop(name) for name in names}
            return command(**values, overrides=given_values(flags, generated))

        run.__name__, run.__qualname__ = command.__name__, command.__qualname__
        run.__doc__, run.__module__ = command.__doc__, command.__module__
        parameters = [*kept, *(f.parameter() for f in flags)]
        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        return run

    return decorate
