"""The hostile-input sweep's cases, generated from the code: every path parameter of the command
tree (typer's own and the flags generated from the configs), hostile paths to give them, damages
to do to a run's files, every key of a settings class and hostile values to give it.

A new command, flag or recipe key is found here without editing the sweep.
"""

from __future__ import annotations

import functools
import math
import os
import random
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel

import lmalgebra.cli  # noqa: F401  (registers the commands)
from lmalgebra.cli.app import app
from lmalgebra.cli.config_options import MODEL_FLAG, ConfigFlag
from lmalgebra.cli.path_values import _takes_path
from lmalgebra.core.settings import is_empty_path


@dataclass(frozen=True)
class PathParameter:
    """One parameter of a command that names a path: ``option`` is its flag (``--out``), or
    None for an argument; ``model`` when it is a model reference (``NAME=PATH``)."""

    command: tuple[str, ...]
    name: str
    option: str | None
    model: bool = False

    @property
    def id(self) -> str:
        return f"{'-'.join(self.command)}:{self.option or self.name.upper()}"

    def given(self, value: str) -> list[str]:
        """The command line's words that give ``value`` to this parameter."""
        text = f"sweep={value}" if self.model else value
        return [text] if self.option is None else [self.option, text]


@functools.cache
def commands() -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf command of the command tree: (its words, the click command)."""

    def walk(command: Any, words: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
        subs = getattr(command, "commands", None)
        if not subs:
            yield words, command
            return
        for name, sub in sorted(subs.items()):
            yield from walk(sub, (*words, name))

    return list(walk(typer.main.get_command(app), ()))


def config_flags_of(command: Any) -> dict[str, ConfigFlag]:
    """The flags ``config_options.with_config_flags`` generated for ``command``, by parameter
    name: found in the closures of its callback (typer wraps it, the decorator keeps them)."""
    found: dict[str, ConfigFlag] = {}
    seen: set[int] = set()
    stack = [command.callback]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, list) and item and all(isinstance(f, ConfigFlag) for f in item):
            found.update({f.parameter_name: f for f in item})
        for cell in getattr(item, "__closure__", None) or ():
            contents = cell.cell_contents
            if callable(contents) or isinstance(contents, list):
                stack.append(contents)
        wrapped = getattr(item, "__wrapped__", None)
        if wrapped is not None:
            stack.append(wrapped)
    return found


def _names_a_path(flag: ConfigFlag) -> bool:
    annotation, metadata = flag.field.annotation, flag.field.metadata
    return is_empty_path(annotation, "", metadata) or is_empty_path(annotation, [""])


def path_parameters() -> list[PathParameter]:
    """Every parameter of every command that takes a path or a model reference."""
    found = []
    for words, command in commands():
        flags = config_flags_of(command)
        for param in command.params:
            flag = flags.get(param.name)
            model = flag is not None and flag.style == MODEL_FLAG
            if not (_takes_path(param) or model or (flag is not None and _names_a_path(flag))):
                continue
            longest = max((o for o in param.opts if o.startswith("--")), key=len, default=None)
            found.append(PathParameter(words, param.name, longest, model))
    return found


def lone_arguments() -> list[PathParameter]:
    """The path arguments that are all their command needs (``merge verify RUN_DIR``,
    ``decompose RECIPE``): a hostile value there is what the command meets, nothing else given."""
    found = []
    for parameter in path_parameters():
        command = dict(commands())[parameter.command]
        param = next(p for p in command.params if p.name == parameter.name)
        others = [p for p in command.params if p.name != parameter.name]
        # settings a flag must give, unless the argument is the recipe the flags lay over (an
        # argument not required: ``decompose RECIPE``, or flags alone)
        needed = [f for f in config_flags_of(command).values() if f.field.is_required()]
        recipe = not param.required
        if (
            parameter.option is None
            and not any(p.required for p in others)
            and (recipe or not needed)
        ):
            found.append(parameter)
    return found


# a directory to write that is not there yet, or is empty, is what an output parameter wants;
# a file of plain text is what a corpus is
VALID_OUTPUTS = ("missing", "empty_directory")
VALID_CORPORA = ("regular_file",)


def is_output(parameter: PathParameter) -> bool:
    """Whether ``parameter`` names what the command writes."""
    return parameter.option == "--out" or parameter.command == ("merge", "init")


def is_valid(parameter: PathParameter, kind: str) -> bool:
    """Whether the hostile path ``kind`` is a value ``parameter`` takes as it should."""
    corpus = (parameter.option or "").endswith("corpus.paths")
    return (is_output(parameter) and kind in VALID_OUTPUTS) or (corpus and kind in VALID_CORPORA)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))


def _loop(path: Path) -> None:
    other = path.with_name(f"{path.name}-other")
    path.symlink_to(other)
    other.symlink_to(path)


def _user_directory(path: Path) -> None:
    path.mkdir()
    (path / "notes.txt").write_text("my own notes\n", encoding="utf-8")


def _unreadable(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def made(path: Path) -> None:
        make(path)
        path.chmod(0)

    return made


def _text(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


# hostile path -> how it is made at a path (None: the path is given as the name says)
HOSTILE_PATHS: dict[str, Callable[[Path], None] | None] = {
    "missing": lambda path: None,
    "empty_directory": lambda path: path.mkdir(),
    "regular_file": _text(b"plain text\n"),
    "fifo": _fifo,
    "socket": _socket,
    "dangling_link": lambda path: path.symlink_to(path.with_name(f"{path.name}-gone")),
    "link_loop": _loop,
    "dev_zero": None,
    "random_bytes": _text(random.Random(7).randbytes(4096)),
    "invalid_utf8": _text(b"caf\xe9 \xff\xfe na\xefve\n"),
    "under_a_file": None,
    "user_directory": _user_directory,
    "unreadable_file": _unreadable(_text(b"secret\n")),
    "unreadable_directory": _unreadable(lambda path: path.mkdir()),
}
UNREADABLE = ("unreadable_file", "unreadable_directory")  # run bound by file permissions


def hostile_path(root: Path, kind: str) -> Path:
    """The hostile path ``kind`` (a key of ``HOSTILE_PATHS``), made in ``root``."""
    if kind == "dev_zero":
        return Path("/dev/zero")
    path = root / kind
    if kind == "under_a_file":
        (root / "a-file").write_text("x\n", encoding="utf-8")
        return root / "a-file" / "below"
    make = HOSTILE_PATHS[kind]
    assert make is not None
    make(path)
    return path


def readable_again(root: Path) -> None:
    """Everything under ``root`` readable and writable by its owner, so it can be removed."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            if not path.is_symlink():
                path.chmod(0o700)


def _flip_byte(path: Path) -> None:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    if data:
        data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same time: a quiet change


def _replaced(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.unlink()
        make(path)

    return damage


# damage -> how it is done to a file of a run
DAMAGES: dict[str, Callable[[Path], None]] = {
    "deleted": lambda path: path.unlink(),
    "emptied": lambda path: path.write_bytes(b""),
    "halved": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "byte_flipped": _flip_byte,
    "json_object": lambda path: path.write_text("{}", encoding="utf-8"),
    "directory": _replaced(lambda path: path.mkdir()),
    "dangling_link": _replaced(lambda path: path.symlink_to(path.with_name("gone"))),
    "fifo": _replaced(_fifo),
}


def copy_tree(source: Path, target: Path) -> Path:
    """``source`` copied to ``target``, links as links."""
    shutil.copytree(source, target, symlinks=True)
    return target


# hostile values of a setting: what goes wrong in a hand-written recipe
HOSTILE_VALUES: dict[str, Any] = {
    "wrong_type": {"a": "mapping"},
    "negative": -1,
    "zero": 0,
    "huge": 10**18,
    "nan": math.nan,
    "empty_string": "",
    "list": [1, 2],
    "bool": True,
}


def setting_keys(model: type[BaseModel], data: Any, prefix: str = "") -> list[str]:
    """Every leaf key of ``model`` as a dotted path; where a field maps names to settings
    (``languages``, ``teachers``), walked through the first name ``data`` holds there."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _settings_type(field.annotation)
        given = data.get(name) if isinstance(data, dict) else None
        if inner is not None and isinstance(given, list) and given:  # a list of settings
            keys += setting_keys(inner, given[0], f"{key}.0.")
        elif inner is not None and not _maps_names(field.annotation):
            keys += setting_keys(inner, given, f"{key}.")
        elif inner is not None and isinstance(given, dict) and given:
            first = sorted(given)[0]
            keys += setting_keys(inner, given[first], f"{key}.{first}.")
        else:
            keys.append(key)
    return keys


def _settings_type(annotation: Any) -> type[BaseModel] | None:
    """The settings class ``annotation`` holds (alone, optional or as a mapping's value)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _settings_type(arg)
        if found is not None:
            return found
    return None


def _maps_names(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is dict


def with_setting(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``data`` with the dotted ``key`` set to ``value`` (parents made)."""
    import copy

    changed = copy.deepcopy(data)
    *parents, leaf = key.split(".")
    level: Any = changed
    for parent in parents:
        if isinstance(level, list):  # a list of settings: its item by number
            level = level[int(parent)]
        elif not isinstance(level.get(parent), dict | list):
            level[parent] = {}
            level = level[parent]
        else:
            level = level[parent]
    if isinstance(level, list):
        level[int(leaf)] = value
    else:
        level[leaf] = value
    return changed
