"""Typed recipes from YAML: unknown keys and bad values are reported with the key and the file."""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from lmalgebra.core.errors import UserInputError, did_you_mean
from lmalgebra.core.settings import (
    COMMAND_LINE,
    SettingsError,
    describe,
    home_expanded,
    recipe_paths,
    refuse_found_elsewhere,
    spelled_as_flags,
)
from lmalgebra.core.text_files import local_namesake, read_text

ConfigT = TypeVar("ConfigT", bound=BaseModel)


def with_default(model: type[BaseModel], name: str, value: Any) -> Any:
    """Field ``name`` of ``model`` (its constraints and description) with another default: for a
    subclass whose settings default otherwise."""
    from pydantic.fields import FieldInfo

    return FieldInfo.merge_field_infos(model.model_fields[name], default=value)


class Call(str):
    """A Python call (and its argument) as :func:`validate` names it: ``Call("decompose_plan()")``,
    ``Call("merge() students")``. A rule across keys refused there names the call, as its
    arguments are named; a file's or a flag's source (a plain ``str``) is named by the rule's
    own words, which name the flags."""

    __slots__ = ()


def validate(
    cls: type[ConfigT], data: dict[str, Any], source: str, flagged: Collection[str] = ()
) -> ConfigT:
    """``cls`` from ``data``; one line naming the key and ``source`` (a file, a flag) when a
    value is bad, and the call (``source`` a :class:`Call`) when a rule across keys refuses
    them, as its arguments are named; such a rule names the settings as flags (``--study.level``)
    to a file or the command line, as keys (``study.level``) to a call (``setting``).
    ``flagged``: the dotted keys given as flags over the file ``source`` (``flag_keys``), whose
    bad values are named as the command line's."""
    flags: bool | Collection[str] = True if source == COMMAND_LINE else flagged
    try:
        with spelled_as_flags(not isinstance(source, Call)):
            return cls.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe(err, source, flags=flags)) from None
    except SettingsError as err:
        raise UserInputError(describe(err.validation, source, flags=flags)) from None
    except UserInputError as err:
        if not isinstance(source, Call) or str(err).startswith(source):
            raise
        raise type(err)(f"{source}: {err}") from None


def flag_keys(overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys that flags set in ``overrides`` (``{"study": {"level": 2}}``:
    ``study.level``)."""
    keys: list[str] = []
    for key, value in overrides.items():
        if isinstance(value, Mapping) and value:
            keys += flag_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line for a YAML error: where (line, column) and what, without the quoted excerpt."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if isinstance(err, yaml.constructor.ConstructorError) and "tag" in str(err.problem):
        tag = str(err.problem).rsplit("tag ", 1)[-1].strip("'").replace("tag:yaml.org,2002:", "!!")
        return f"{where}tag {tag} is not allowed (plain YAML only: no Python objects)"
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


RECIPE_PREFIX = "recipe:"


def shipped_recipes() -> list[str]:
    """Names of the recipes that ship with the package (``recipe:NAME``)."""
    from importlib.resources import files

    return sorted(
        p.name.removesuffix(".yaml")
        for p in files("lmalgebra.recipes").iterdir()
        if p.name.endswith(".yaml")
    )


def recipe_path(path: Path | str, term: str = "recipe", shipped: bool = False) -> Path:
    """``path``, or for ``recipe:NAME`` the shipped recipe of that name (from any directory)
    where the file read is a decomposition recipe (``shipped``); elsewhere (a merge recipe, a
    pretrain spec: ``term``) one is refused as what it is, where a merge had been given a
    decomposition recipe ("unknown key 'models'") and told of no recipe by the decomposition
    recipes' names, and a pretrain told the spec does not exist."""
    text = str(path)
    if text.lower() in ("true", "false") and not Path(text).exists():  # `--figures false`
        raise UserInputError(
            f"{term} {text} does not exist: a switch takes no value (--FLAG or --no-FLAG, not "
            f"--FLAG {text}), so {text!r} was read as the {term}"
        )
    if not text.startswith(RECIPE_PREFIX) or (not shipped and os.path.lexists(text)):
        return Path(path)
    if not shipped:  # the one reader of other recipes is the merge's
        what = "MergeDistill recipe" if term == "recipe" else term
        raise UserInputError(
            f"{term} {text}: {RECIPE_PREFIX}NAME names a decomposition recipe shipped with "
            f"lmalgebra (for lmalgebra decompose), not a {what}; name the file's path"
        )
    from importlib.resources import files

    name = text.removeprefix(RECIPE_PREFIX).removesuffix(".yaml")
    known = shipped_recipes()
    if name not in known:
        raise UserInputError(
            f"no shipped recipe {name!r}{did_you_mean(name, known)}; shipped: {', '.join(known)}"
            f"{local_namesake(text)}"
        )
    return Path(str(files("lmalgebra.recipes") / f"{name}.yaml"))


# the most values a recipe may expand to through its aliases (``*name``): a recipe holds a few
# hundred; a chain of aliases each repeating the one before ("billion laughs") expands to more
# than any command could read
MOST_VALUES = 100_000


# the tags of YAML 1.1 that plain recipe values leave alone (see ``_RecipeLoader``)
_BOOL, _TIMESTAMP = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp"


class _DuplicateKey(yaml.MarkedYAMLError):
    """A key given twice in one mapping (PyYAML keeps the later, dropping the earlier)."""


class _RecipeLoader(yaml.SafeLoader):
    """Plain YAML (``yaml.safe_load``'s) that refuses a key given twice in one mapping: the
    later had replaced the earlier, a whole section (``spans:`` twice) with it. A key beside a
    merge key (``<<: *base``) overrides what the merge brings, as YAML has it.

    Booleans are ``true`` and ``false`` alone, as in YAML 1.2, and dates are text: YAML 1.1 read
    ``no``, ``yes``, ``on``, ``off`` as booleans and ``2024-01-01`` as a date, so a language
    code ``no`` (Norwegian), a teacher named ``on`` or a hub revision of a date had been refused
    as no text, named by ``False``. A switch written so still reads as one (``whole_word:
    yes``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise _DuplicateKey(
                    problem=f"key {key_node.value!r} is given twice in one mapping (first on "
                    f"line {seen[key] + 1}): the later would replace the earlier; keep one",
                    problem_mark=key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


_RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RecipeLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _expanded_size(value: Any, sizes: dict[int, int | None]) -> int:
    """How many values ``value`` holds with every alias written out (``sizes``: of the lists and
    mappings seen, by ``id``; None while one is being counted); -1 for a value that holds
    itself (``&a [*a]``)."""
    if not isinstance(value, (list, dict)):
        return 1
    if id(value) in sizes:
        known = sizes[id(value)]
        return -1 if known is None else known
    sizes[id(value)] = None
    total = 1
    for item in value.values() if isinstance(value, dict) else value:
        size = _expanded_size(item, sizes)
        if size < 0:
            return -1
        total += size
    sizes[id(value)] = total
    return total


def parse_yaml(text: str, what: str) -> Any:
    """The value the YAML ``text`` holds, read as a recipe is (plain YAML, no key twice, YAML
    1.2's booleans: ``_RecipeLoader``); one line starting with ``what`` (the file, the flag and
    its value) when it is no such YAML or expands beyond ``MOST_VALUES`` through its aliases."""
    try:
        data = yaml.load(text, Loader=_RecipeLoader)  # a SafeLoader
    except yaml.YAMLError as err:
        raise UserInputError(f"{what} is not valid YAML: {yaml_problem(err)}") from None
    except RecursionError:  # PyYAML reads each level of nesting a call deeper
        raise UserInputError(
            f"{what}: its values nest too deeply to be read (lists or mappings hundreds of levels "
            "deep); write them flatter"
        ) from None
    size = _expanded_size(data, {})
    if size < 0 or size > MOST_VALUES:
        held = "holds itself" if size < 0 else f"expands to more than {MOST_VALUES} values"
        raise UserInputError(
            f"{what}: a value {held} through its aliases (*name, of an &name anchor); "
            "write the values out"
        )
    return data


def read_yaml(path: Path, term: str = "recipe", shipped: bool = False) -> dict[str, Any]:
    """The keys of the YAML file ``path``; ``term``: what messages call the file (a pretrain
    spec is no recipe); ``shipped``: a decomposition recipe, which ``recipe:NAME`` names from
    those shipped (``recipe_path``)."""
    path = recipe_path(path, term, shipped)
    data = parse_yaml(read_text(path, term), f"{term} {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserInputError(f"{term} {path}: the top level must be a mapping of keys")
    return data


def layered(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``overrides`` laid over it, section by section: a nested mapping of
    overrides replaces only the keys it gives."""
    out = dict(data)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = layered(out[key], value)
        else:
            out[key] = value
    return out


def load_settings(
    cls: type[ConfigT], path: Path | None, overrides: dict[str, Any], term: str = "recipe"
) -> ConfigT:
    """A ``cls`` from a YAML file (optional) with command-line values laid over it; errors
    name the file, or the command line when there is none, and call the file ``term`` (a
    pretrain ``spec``; its messages had called it a recipe)."""
    data = read_yaml(path, term) if path is not None else {}
    source = str(path) if path else COMMAND_LINE
    settings = validate(cls, layered(data, overrides), source, flag_keys(overrides))
    if path is not None:  # a relative path of the file found beside it alone: named
        base = home_expanded(path).absolute().parent
        texts = recipe_paths(settings, overrides, ("out",))
        refuse_found_elsewhere(texts, path, base, f"the {term}'s directory", term)
    return settings
