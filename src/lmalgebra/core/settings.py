"""The base of every settings class (recipes, configurations, specs), built from YAML or Python.

pydantic reports a bad value as a ``ValidationError`` of several lines per problem. ``Settings``
turns it, wherever the class is built (``TrainingSpec(steps=-1)``, ``model_validate``), into one
:class:`SettingsError` line naming the class, the first offending key and the value given: a
``UserInputError`` (one line and exit status 2 on the command line) that is also the
``ValueError`` pydantic's own error is. Readers of a file re-word it with the file's name
(``recipe_files.validate``), from the ``ValidationError`` it keeps.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from typing_extensions import Self

from lmalgebra.core.errors import UserInputError, UserValueError

_SHOWN = (bool, int, float, str, type(None))  # inputs short enough to quote in a message


# the source of settings given as flags alone, no file: its refusals name the flags
COMMAND_LINE = "command line"


def describe(
    err: ValidationError, source: str, tagged: bool = False, flags: bool | Collection[str] = False
) -> str:
    """One line naming the first offending key (dotted path), the value given and the source;
    ``flags``: the values came from the command line's flags (True), or those of these dotted
    keys did, laid over a file's: such a key is named as its flag, from the command line
    (``--study.level``; "key 'study.level'" had named a key of no file, or blamed the file for
    a flag's value).

    ``tagged``: the data was validated as a tagged union, whose tag leads every error's path
    (it is not a key). A value no member of a union field takes (``list[str] | dict[...]``) is
    named by its key, and by what the member it got furthest in refused, or every member's
    expectation: pydantic's path names the members by their types, which are no keys."""
    errors: list[dict[str, Any]] = [
        {**e, "loc": e["loc"][1:] if tagged else e["loc"]} for e in err.errors()
    ]
    # a misspelled key shows up as "missing" + "extra": name the key the user actually wrote
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    first, msg = _past_unions(first, errors)
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if not first["loc"] and first["type"] == "value_error":  # the class's own check of the whole
        return f"{source}: {msg.removeprefix('Value error, ')}"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {key!r}"
    as_flag = flags if isinstance(flags, bool) else _under(key, flags)
    if as_flag and not isinstance(flags, bool):
        source = COMMAND_LINE
    named = f"--{key}" if as_flag else f"key {key!r}"
    if first["type"] == "missing":
        *within, last = first["loc"] or ("",)
        if isinstance(last, int) and within:  # a tuple cut short: no key is missing
            parent = ".".join(str(p) for p in within)
            parent = f"--{parent}" if as_flag else f"key {parent!r}"
            return f"{source}: {parent}: too few values (none at position {last + 1})"
        return f"{source}: missing {named}"
    given = first.get("input")
    shown = f", got {given!r}" if isinstance(given, _SHOWN) and len(repr(given)) <= 80 else ""
    if first["type"] == "path_type":  # not pydantic's "valid path for <class 'pathlib.Path'>"
        msg = "must be a path"
    if given is None and first["type"] in ("path_type", "string_type"):  # `out: ~` in YAML
        shown += " (YAML's null: an empty value, ~ or null; '~' in quotes is the home directory)"
    return f"{source}: {named}: {msg}{shown}"


def _under(key: str, keys: Collection[str]) -> bool:
    """Whether the dotted ``key`` is one of ``keys`` or inside one."""
    return any(key == k or key.startswith(f"{k}.") for k in keys)


def inside_value(err: ValidationError) -> str:
    """What a value given whole (a flag's) was refused for: the key or position inside it
    that failed (``xx.1`` of ``{xx: [bl, 3]}``, past the members of a union, as
    :func:`describe` names a recipe's) with what it holds, or the reason alone where the value
    itself failed."""
    errors: list[dict[str, Any]] = [dict(e) for e in err.errors()]
    first, msg = _past_unions(errors[0], errors)
    if not first["loc"]:
        return msg
    given = first.get("input")
    shown = f", got {given!r}" if isinstance(given, _SHOWN) and len(repr(given)) <= 80 else ""
    loc = first["loc"]
    if len(loc) == 1 and isinstance(loc[0], int):  # an item of a list given whole
        return f"item {loc[0] + 1}: {msg}{shown}"
    return f"key {'.'.join(str(p) for p in loc)!r}: {msg}{shown}"


_BARE_TYPES = frozenset({"int", "float", "str", "bool", "none", "bytes"})


def _member_tag(part: Any) -> bool:
    """Whether a path element is pydantic's name of a union member (``list[str]``,
    ``dict[str,list[str]]``, ``int``, ``function-after[...]``, a model's class name)."""
    return isinstance(part, str) and bool(
        part in _BARE_TYPES or "[" in part or "-" in part or part[:1].isupper()
    )


def _past_unions(first: dict[str, Any], errors: list[dict[str, Any]]) -> tuple[dict, str]:
    """``first`` with the union members' names left out of its path, and its message: where no
    member took the value, the error of the member that got furthest (the value had its type),
    or, when none got past the type, what each member expects (``... a valid list or a valid
    dictionary``)."""
    loc, msg = tuple(first["loc"]), str(first["msg"])
    at = 0
    while at < len(loc):
        if not _member_tag(loc[at]):
            at += 1
            continue
        members = [
            e
            for e in errors
            if len(e["loc"]) > at and tuple(e["loc"][:at]) == loc[:at] and _member_tag(e["loc"][at])
        ]
        if len({e["loc"][at] for e in members}) < 2:  # a key that only looks like a type name
            at += 1
            continue
        deepest = max(members, key=lambda e: len(e["loc"]))
        if len(deepest["loc"]) > at + 1:
            loc, msg, first = tuple(deepest["loc"]), str(deepest["msg"]), deepest
        else:
            expected = dict.fromkeys(
                str(e["msg"]).removeprefix("Input should be ") for e in members
            )
            msg = "Input should be " + " or ".join(expected)
        errors = [e for e in errors if tuple(e["loc"][: at + 1]) == loc[: at + 1]]
        loc = loc[:at] + loc[at + 1 :]
        errors = [{**e, "loc": tuple(e["loc"][:at]) + tuple(e["loc"][at + 1 :])} for e in errors]
    return {**first, "loc": loc}, msg


_SEQUENCES = (list, tuple, set, frozenset)


BOOL_NAMES = ("bool", "bool_")  # numpy's boolean scalar type, as numpy 2 and 1 name it


def is_boolean(value: Any) -> bool:
    """Whether ``value`` is a boolean: Python's, or numpy's (``np.bool_``, which is no ``bool``
    and which pydantic reads as the integer 0 or 1)."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in BOOL_NAMES)


def bool_for_number(annotation: Any, value: Any) -> bool:
    """Whether ``value`` holds a boolean where ``annotation`` promises a number and no boolean
    (``steps: true``, ``layers: [true, 2]``): pydantic takes ``True`` for ``1``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return bool_for_number(typing.get_args(annotation)[0], value)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if is_boolean(value):
            return not any(_admits_bool(a) for a in options) and any(
                _admits_number(a) for a in options
            )
        return any(bool_for_number(a, value) for a in options if typing.get_origin(a))
    if is_boolean(value):
        return _admits_number(annotation) and not _admits_bool(annotation)
    if isinstance(value, _SEQUENCES) and origin in (*_SEQUENCES, typing.Sequence):
        items = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return any(bool_for_number(a, v) for a in items for v in value)
    if isinstance(value, Mapping) and origin in (dict, Mapping):  # ``objective_mix: {alm: yes}``
        return any(bool_for_number(typing.get_args(annotation)[1], v) for v in value.values())
    return False


def ordered(annotation: Any) -> bool:
    """Whether ``annotation`` promises an ordered sequence (a list or tuple, ``None`` or not),
    which a ``set`` is not."""
    return any(
        typing.get_origin(_bare(a)) in (list, tuple, typing.Sequence) or _bare(a) in (list, tuple)
        for a in _options(_bare(annotation))
    )


def home_expanded(path: Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` read as that home directory (left as it is
    where there is no such user)."""
    return Path(os.path.expanduser(path))  # noqa: PTH111 (Path's raises for no such user)


# one plain directory name: a run's language, teacher and student names, and a corpus entry's
# LANG=PATH language code (one rule for a code, on the command line or in a recipe)
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
PLAIN_NAME_RULE = "1 to 100 ASCII letters, digits, '.', '_', '-'; not starting with '.'"
EMPTY_PATH = "an empty path; name a file or directory ('.' for the current one)"


class _PathText:
    """The mark of :data:`PathText`."""


PATH_TEXT = _PathText()
# text that names a file, a directory or a hub id (a model's path, a tokenizer, a corpus file):
# refused blank as a ``Path`` is, where ``Path("")`` had read the current directory
PathText = Annotated[str, PATH_TEXT]


def is_empty_path(annotation: Any, value: Any, metadata: Sequence[Any] = ()) -> bool:
    """Whether ``value`` is a blank string, or a list holding one, where ``annotation`` (with a
    field's ``metadata``) promises a path: ``Path``, ``PathText``, either or ``None``, or a list
    of them."""
    if isinstance(value, list):
        items = typing.get_args(annotation) if typing.get_origin(annotation) is list else ()
        return any(is_empty_path(item, v) for item in items for v in value)
    if not isinstance(value, str) or value.strip():
        return False
    return PATH_TEXT in metadata or _names_path(annotation)


def _names_path(annotation: Any) -> bool:
    if annotation is Path:
        return True
    arguments = typing.get_args(annotation)
    if typing.get_origin(annotation) is Annotated:
        return PATH_TEXT in arguments[1:] or _names_path(arguments[0])
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and any(
        _names_path(a) for a in arguments
    )


def path_texts(settings: BaseModel, prefix: str = "") -> typing.Iterator[tuple[str, str]]:
    """Every path a settings object holds (fields that promise a ``Path`` or a ``PathText``,
    in nested settings, mappings and lists too), as (dotted key, text)."""
    for name, field in type(settings).model_fields.items():
        key, value = f"{prefix}{name}", getattr(settings, name)
        if PATH_TEXT in field.metadata or _names_path(field.annotation) or _lists_paths(field):
            items = value if isinstance(value, list) else [value]
            yield from ((key, str(v)) for v in items if v is not None)
        else:
            yield from _nested_paths(value, key)


def recipe_paths(
    settings: BaseModel, overrides: Mapping[str, Any], outputs: Sequence[str]
) -> list[tuple[str, str]]:
    """The paths (key, text) that ``settings`` takes from its recipe file: those a flag gave
    (``overrides``: a section's keys or a whole key) left out, and those of ``outputs`` (keys it
    writes to) that the file does not set (a default, which names nothing of the file's).
    An output the file names is read from the current directory as an input is: one naming a
    run beside the recipe alone had been left there, and a new run made here."""
    given = [f"{k}.{s}" for k, v in overrides.items() if isinstance(v, Mapping) for s in v]
    given += [k for k, v in overrides.items() if not isinstance(v, Mapping)]
    unset = [k for k in outputs if k not in settings.model_fields_set]
    return [
        (key, text)
        for key, text in path_texts(settings)
        if key not in unset and not any(f"{key}.".startswith(f"{g}.") for g in given)
    ]


def refuse_found_elsewhere(
    texts: Iterable[tuple[str, str]], source: Path, base: Path, where: str, term: str = "recipe"
) -> None:
    """Refuse the first relative path of ``texts`` (key, path as written in the file ``source``,
    a ``term``: a recipe, a spec) that names something from ``base`` (``where``: what it is, the
    recipe's directory) and nothing from the current directory, which a recipe's relative paths
    are read from (as ``from_pretrained`` reads them): read from here it would be none, or a
    hub id."""
    try:
        here = Path.cwd()
    except OSError:  # no current directory: a relative path fails where it is read
        return
    base = Path(os.path.realpath(base))  # as the current directory is told: no `..` in it
    exists = os.path.lexists  # a link to nothing is there too
    for key, text in texts if here != base else ():
        path = home_expanded(Path(text))
        if path.is_absolute() or exists(path) or not exists(base / path):
            continue
        raise UserInputError(
            f"{source}: key {key!r}: {text!r} names something from {base}, {where}, and nothing "
            f"from the current directory {here}, which a {term}'s relative paths are read "
            f"from: run the command from {base} (or name it by an absolute path in the {term})"
        )


def _lists_paths(field: Any) -> bool:
    return typing.get_origin(field.annotation) is list and any(
        _names_path(a) for a in typing.get_args(field.annotation)
    )


def _nested_paths(value: Any, key: str) -> typing.Iterator[tuple[str, str]]:
    if isinstance(value, BaseModel):
        yield from path_texts(value, f"{key}.")
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from _nested_paths(item, f"{key}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _nested_paths(item, f"{key}.{i}")


INT64_MAX = 2**63 - 1
SEED_MAX = 2**64 - 1  # numpy takes no negative seed, torch none beyond this


def _outside(value: Any, low: int, high: int) -> bool:
    """Whether ``value`` is, or a sequence holding, an integer outside ``low`` to ``high``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return not low <= value <= high
    if isinstance(value, _SEQUENCES):
        return any(_outside(v, low, high) for v in value)
    return False


def _admits_text(annotation: Any) -> bool:
    """Whether ``annotation`` holds text but no ``Path`` (``str``, ``PathText | None``,
    ``list[PathText]``): a path object given there is read as its text."""
    options = [_bare(a) for a in _options(annotation)]
    if any(a is Path for a in options):
        return False
    return any(
        a is str
        or (typing.get_origin(a) in (list, tuple) and str in map(_bare, typing.get_args(a)))
        for a in options
    )


def _options(annotation: Any) -> tuple[Any, ...]:
    """The members of a union annotation, or the annotation alone."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return typing.get_args(annotation) if union else (annotation,)


def _bare(annotation: Any) -> Any:
    """``annotation`` without its ``Annotated`` metadata (``PathText`` is ``str``)."""
    if typing.get_origin(annotation) is Annotated:
        return typing.get_args(annotation)[0]
    return annotation


def _admits_number(annotation: Any) -> bool:
    return annotation in (int, float)


def _admits_bool(annotation: Any) -> bool:
    return annotation is bool or annotation is Any


SettingsT = TypeVar("SettingsT", bound="Settings")


class SettingsError(UserInputError, ValueError):
    """A settings class built from a bad value: one line; ``validation`` is pydantic's error."""

    def __init__(self, message: str, validation: ValidationError) -> None:
        super().__init__(message)
        self.validation = validation


def _key_of_subclass(kind: type[BaseModel], err: ValidationError) -> str:
    """For an unknown key of ``kind`` that a class built on it has (``TrainingSpec`` given
    ``objective_mix``, a key of a causal recipe's ``CausalTrainingSpec``), or else a class built
    on one of its bases (``MaskedStudentSpec`` given ``init``, a ``CausalStudentSpec``'s), which
    class that is."""
    unknown = next((e for e in err.errors() if e["type"] == "extra_forbidden"), None)
    if unknown is None or len(unknown["loc"]) != 1:
        return ""
    bases = [b for b in kind.__mro__ if issubclass(b, Settings) and b is not Settings]
    for base in bases:
        owner = _owner_below(base, str(unknown["loc"][0]), kind)
        if owner is not None:
            # where the caller imports it: ``lmalgebra.api.pretrain``, not the module that
            # defines it (a spec of pretrain had been named by ``lmalgebra.distill...``)
            name = f"{vars(owner).get('public_module') or owner.__module__}.{owner.__name__}"
            on = f"{base.__name__}, as {kind.__name__} is" if base is not kind else kind.__name__
            return f": a key of {name} (built on {on}): build one of those instead"
    return ""


def _owner_below(base: type[BaseModel], key: str, given: type[BaseModel]) -> type | None:
    """The first class built on ``base`` (``given`` and those built on it aside, unless ``base``
    is ``given``) that has settings key ``key``."""
    below, seen = list(base.__subclasses__()), {given} if base is not given else set()
    while below:
        cls = below.pop(0)
        if cls in seen:
            continue
        if key in cls.model_fields:
            return cls
        below += cls.__subclasses__()
    return None


def _refuses_empty(kind: type[BaseModel]) -> bool:
    """Whether settings class ``kind`` refuses to be built of no keys."""
    try:
        kind.model_validate({})
    except (ValidationError, UserInputError):
        return True
    return False


class Settings(BaseModel):
    """A pydantic model whose bad values raise :class:`SettingsError` (see the module)."""

    # the module a caller imports the class from, set on the class itself where that is not the
    # module that defines it (``lmalgebra.api.pretrain``): a refusal names the class so
    public_module: ClassVar[str | None] = None

    def __init__(self, /, **data: Any) -> None:
        token = _BUILT.set(type(self))
        try:
            super().__init__(**data)
        except ValidationError as err:
            message = describe(err, type(self).__name__) + _key_of_subclass(type(self), err)
            raise SettingsError(message, err) from None
        except SettingsError:
            raise
        except UserInputError as err:  # a rule across keys: a ValueError, as a bad value's is
            if isinstance(err, ValueError):
                raise
            raise UserValueError(str(err)) from None
        finally:
            _BUILT.reset(token)

    # pydantic's own mark of its __init__ (RootModel's too): validation, of this model and of the
    # models that hold it, goes on calling the validator directly, not this method, so only the
    # outermost settings class a user builds words the error
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="before")
    @classmethod
    def _sections_by_their_keys(cls, data: Any) -> Any:
        """A required section left out, which an empty one would not fill either, read as an
        empty one: the refusal names the key it needs (``tokenizer: give tokenizer.vocab_size
        ... or tokenizer.path``) where it had named the section alone ("missing key
        'tokenizer'", a flag no command has). A section an empty one fills stays missing, and
        so does every section beside an unknown key, which is named first."""
        if not isinstance(data, dict) or not data.keys() <= cls.model_fields.keys():
            return data
        missing: dict[str, dict[str, Any]] = {
            name: {}
            for name, field in cls.model_fields.items()
            if field.is_required()
            and name not in data
            and isinstance(field.annotation, type)
            and issubclass(field.annotation, Settings)
            and _refuses_empty(field.annotation)
        }
        return {**data, **missing} if missing else data

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean where a number is promised is refused, not read as 0 or 1 (a YAML
        ``steps: yes``, ``seed: true``)."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and bool_for_number(field.annotation, value):
            promised = "number" if "float" in str(field.annotation) else "integer"
            raise PydanticCustomError("bool_for_number", f"a boolean is no {promised}")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_set_for_sequence(cls, value: Any, info: ValidationInfo) -> Any:
        """A Python ``set`` where a list or tuple is promised is refused, not read in the order
        it iterates, which changes from process to process (strings hash differently in each):
        a ``layer_map`` had been read either way round, and corpus ``paths`` in another order
        had been other documents to a run resumed."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and isinstance(value, set | frozenset) and ordered(field.annotation):
            raise PydanticCustomError(
                "unordered",
                f"a {type(value).__name__} has no order of its own (a set of strings iterates "
                "in another order in each process); give a list",
            )
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_int_beyond_64_bits(cls, value: Any, info: ValidationInfo) -> Any:
        """An integer no 64-bit integer holds (``2**63`` and beyond) is refused where it is
        read, not passed on to fail inside torch; a seed, which seeds numpy's generators and
        torch's, is one from 0 to ``2**64 - 1`` (a negative one or a larger one had ended in
        a traceback from either)."""
        if "seed" in (info.field_name or ""):
            if _outside(value, 0, SEED_MAX):
                raise PydanticCustomError("seed", f"Input should be a seed from 0 to {SEED_MAX}")
        elif _outside(value, -INT64_MAX - 1, INT64_MAX):
            raise PydanticCustomError(
                "int_beyond_64_bits", f"Input should be at most {INT64_MAX} (a 64-bit integer)"
            )
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _no_empty_path(cls, value: Any, info: ValidationInfo) -> Any:
        """An empty string where a path is promised is refused, not read as ``Path(".")``: an
        ``output_dir: ""`` (a template's unset variable) would write into the current
        directory."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and is_empty_path(field.annotation, value, field.metadata):
            raise PydanticCustomError("empty_path", EMPTY_PATH)
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any, info: ValidationInfo) -> Any:
        """A path object (``pathlib.Path``) where a setting holds text (a model's ``path``, a
        ``reference_tokenizer``: a directory, or a hub id that no ``Path`` holds) is its text,
        not refused as "a valid string"; so are those of a list of such texts."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not _admits_text(field.annotation):
            return value
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, list | tuple) and any(isinstance(v, os.PathLike) for v in value):
            return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _home_expanded(cls, value: Any) -> Any:
        """A path's leading ``~`` (``~user``) read as the home directory, for every path a
        setting holds, input or output: one given where no shell expands it (a recipe, a quoted
        flag) had made a directory named ``~`` here."""
        return home_expanded(value) if isinstance(value, Path) else value

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as err:
            message = describe(err, cls.__name__) + _key_of_subclass(cls, err)
            raise SettingsError(message, err) from None


def revalidated(settings: SettingsT, source: str) -> SettingsT:
    """``settings`` checked again from its values, as if built anew: pydantic validates neither
    ``model_copy(update=...)`` nor ``model_construct``, so a settings object given to the API
    may hold a ``None``, a boolean or a string where its class promises a section, an integer
    or a path, which would otherwise be reached as an attribute deep inside the run. ``source``:
    the call and argument, as the message names them."""
    try:
        data = settings.model_dump(exclude_unset=True, warnings=False)  # what was given
    except (AttributeError, TypeError, ValueError) as err:  # a value pydantic cannot serialise
        raise UserInputError(
            f"{source}: {type(settings).__name__} does not read back: {err}"
        ) from None
    try:
        return type(settings).model_validate(data)
    except SettingsError as err:
        raise SettingsError(f"{source} {err}", err.validation) from None


# whether the settings being checked came from the command line (or a recipe it reads), whose
# refusals name flags, or from Python, whose refusals name the keys the call was given
_AS_FLAGS: ContextVar[bool] = ContextVar("settings_as_flags", default=False)


@contextmanager
def spelled_as_flags(flags: bool) -> Iterator[None]:
    """Within the block, :func:`setting` names a setting as a flag (``flags``) or as a key."""
    token = _AS_FLAGS.set(flags)
    try:
        yield
    finally:
        _AS_FLAGS.reset(token)


# the settings class a Python caller is building itself (``StudySpec(level=0.9)``), while
# its validators run: a section built alone names its keys without the section's prefix
_BUILT: ContextVar[type[BaseModel] | None] = ContextVar("settings_built", default=None)


def section_key(section: type[BaseModel], prefix: str) -> str:
    """The prefix of the keys of ``section`` in its refusals: ``prefix`` (``study.``, spelled
    as :func:`setting` spells it) within a recipe, nothing where the caller built the section
    itself (``StudySpec(level=0.9)`` had been told about ``study.level``)."""
    built = _BUILT.get()
    return "" if built is not None and issubclass(built, section) else setting(prefix)


@contextmanager
def keys_alone(section: type[BaseModel]) -> Iterator[None]:
    """Within the block, the keys of ``section`` are named as :func:`section_key` names those of
    a section built alone: a Python caller gave them as a mapping of the section's own keys
    (``training={"gold_only": True}``)."""
    token = _BUILT.set(section)
    try:
        yield
    finally:
        _BUILT.reset(token)


def switched_on(section: type[BaseModel], prefix: str, name: str) -> str:
    """The switch ``name`` of ``section`` turned on, as the caller gave it: the flag
    ``--training.gold_only`` to the command line, the keyword ``gold_only=True`` to a caller
    who gave the section's keys alone, the key ``training.gold_only: true`` in a recipe (which
    a Python caller had been told)."""
    key = section_key(section, prefix)
    if key.startswith("--"):
        return f"{key}{name}"
    return f"{key}{name}: true" if key else f"{name}=True"


def setting(key: str) -> str:
    """The setting ``key`` (dotted: ``study.level``) as the reader of a refusal gave it: the
    flag ``--study.level`` to the command line (a recipe's key is its flag), the key
    ``study.level`` to Python (``study={"level": ...}``; a top-level key is the keyword)."""
    return f"--{key}" if _AS_FLAGS.get() else key


def refuse_ignored(settings: BaseModel, prefix: str, unused: Mapping[str, str]) -> None:
    """Refuse a field given a value other than its default that the rest of ``settings`` makes
    the run ignore. ``unused``: each such field (of those that do not apply to this run) -> what
    it applies to; ``prefix`` spells the field's key (``setting("study.")``)."""
    fields = type(settings).model_fields
    for name, applies_to in unused.items():
        value = getattr(settings, name)
        if value != fields[name].get_default(call_default_factory=True):
            raise UserInputError(
                f"{prefix}{name} {value!r} would be ignored: it applies to {applies_to} only"
            )
