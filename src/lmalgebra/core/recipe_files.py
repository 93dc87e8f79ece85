"""Typed recipes from YAML: unknown keys and bad values are reported with the key and the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from lmalgebra.core.errors import UserInputError

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def describe(err: ValidationError, source: str) -> str:
    """One line naming the first offending key (dotted path) and the source."""
    errors = err.errors()
    # a misspelled key shows up as "missing" + "extra": name the key the user actually wrote
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {key!r}"
    if first["type"] == "missing":
        return f"{source}: missing key {key!r}"
    return f"{source}: key {key!r}: {first['msg']}"


def validate(cls: type[ConfigT], data: dict[str, Any], source: str) -> ConfigT:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe(err, source)) from None


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserInputError(f"recipe {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserInputError(f"recipe {path} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserInputError(f"recipe {path}: the top level must be a mapping of keys")
    return data
