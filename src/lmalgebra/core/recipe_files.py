"""Typed recipes from YAML: unknown keys and bad values are reported with the key and the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import read_text

ConfigT = TypeVar("ConfigT", bound=BaseModel)
_SHOWN = (bool, int, float, str, type(None))  # inputs short enough to quote in a message


def describe(err: ValidationError, source: str) -> str:
    """One line naming the first offending key (dotted path), the value given and the source."""
    errors = err.errors()
    # a misspelled key shows up as "missing" + "extra": name the key the user actually wrote
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {key!r}"
    if first["type"] == "missing":
        return f"{source}: missing key {key!r}"
    given = first.get("input")
    shown = f", got {given!r}" if isinstance(given, _SHOWN) and len(repr(given)) <= 80 else ""
    return f"{source}: key {key!r}: {first['msg']}{shown}"


def validate(cls: type[ConfigT], data: dict[str, Any], source: str) -> ConfigT:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe(err, source)) from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line for a YAML error: where (line, column) and what, without the quoted excerpt."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if isinstance(err, yaml.constructor.ConstructorError) and "tag" in str(err.problem):
        tag = str(err.problem).rsplit("tag ", 1)[-1].strip("'").replace("tag:yaml.org,2002:", "!!")
        return f"{where}tag {tag} is not allowed (plain YAML only: no Python objects)"
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def read_yaml(path: Path) -> dict[str, Any]:
    text = read_text(path, "recipe")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UserInputError(f"recipe {path} is not valid YAML: {_yaml_problem(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserInputError(f"recipe {path}: the top level must be a mapping of keys")
    return data
