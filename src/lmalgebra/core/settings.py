"""The base of every settings class (recipes, configurations, specs), built from YAML or Python.

pydantic reports a bad value as a ``ValidationError`` of several lines per problem. ``Settings``
turns it, wherever the class is built (``TrainingSpec(steps=-1)``, ``model_validate``), into one
:class:`SettingsError` line naming the class, the first offending key and the value given: a
``UserInputError`` (one line and exit status 2 on the command line) that is also the
``ValueError`` pydantic's own error is. Readers of a file re-word it with the file's name
(``recipe_files.validate``), from the ``ValidationError`` it keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from typing_extensions import Self

from lmalgebra.core.errors import UserInputError

_SHOWN = (bool, int, float, str, type(None))  # inputs short enough to quote in a message


def describe(err: ValidationError, source: str, tagged: bool = False) -> str:
    """One line naming the first offending key (dotted path), the value given and the source.

    ``tagged``: the data was validated as a tagged union, whose tag leads every error's path
    (it is not a key)."""
    errors = err.errors()
    # a misspelled key shows up as "missing" + "extra": name the key the user actually wrote
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = first["loc"][1:] if tagged else first["loc"]
    key = ".".join(str(p) for p in loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {key!r}"
    if first["type"] == "missing":
        return f"{source}: missing key {key!r}"
    given = first.get("input")
    shown = f", got {given!r}" if isinstance(given, _SHOWN) and len(repr(given)) <= 80 else ""
    return f"{source}: key {key!r}: {first['msg']}{shown}"


class SettingsError(UserInputError, ValueError):
    """A settings class built from a bad value: one line; ``validation`` is pydantic's error."""

    def __init__(self, message: str, validation: ValidationError) -> None:
        super().__init__(message)
        self.validation = validation


class Settings(BaseModel):
    """A pydantic model whose bad values raise :class:`SettingsError` (see the module)."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise SettingsError(describe(err, type(self).__name__), err) from None

    # pydantic's own mark of its __init__ (RootModel's too): validation, of this model and of the
    # models that hold it, goes on calling the validator directly, not this method, so only the
    # outermost settings class a user builds words the error
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as err:
            raise SettingsError(describe(err, cls.__name__), err) from None


def refuse_ignored(settings: BaseModel, prefix: str, unused: Mapping[str, str]) -> None:
    """Refuse a field given a value other than its default that the rest of ``settings`` makes
    the run ignore. ``unused``: each such field (of those that do not apply to this run) -> what
    it applies to; ``prefix`` spells the field's flag (``--study.``)."""
    fields = type(settings).model_fields
    for name, applies_to in unused.items():
        value = getattr(settings, name)
        if value != fields[name].get_default(call_default_factory=True):
            raise UserInputError(
                f"{prefix}{name} {value!r} would be ignored: it applies to {applies_to} only"
            )
