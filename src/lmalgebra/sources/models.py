"""Model references: parsed and checked against their kind, then resolved, loaded and
fingerprinted by that kind's class (:mod:`lmalgebra.sources.kinds`).

Kinds: a Hugging Face model (a directory, hub id, ``package:NAME`` or ``gguf:FILE``), an ONNX
encoder (a ``.onnx`` file run with onnxruntime and a named tokenizer), precomputed embeddings (a
file of vectors, one per span), and a Python object given to ``lmalgebra.decompose()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import SettingsError, home_expanded
from lmalgebra.sources.gguf_models import GGUF_PREFIX
from lmalgebra.sources.model_source import ModelFields, ReferencedModel, exists
from lmalgebra.sources.packaged import PACKAGE_PREFIX


def _kinds() -> Mapping[str, type[ReferencedModel]]:
    """The registry of kinds (``sources.kinds``), imported on first use: the kinds' classes
    import numpy, which the command line does not need to parse its arguments."""
    from lmalgebra.sources.kinds import KINDS

    return KINDS


def _split_kind(path: str) -> tuple[str | None, str, str | None]:
    """``"onnx:m.onnx#tok"`` -> ``("onnx", "m.onnx", "tok")``; no kind named -> ``(None, ...)``."""
    for kind, source in _kinds().items():
        named = source.named_by(path)
        if named is not None:
            return kind, *named
    return None, path, None


class ModelRef(ModelFields):
    """A model to embed with: where it comes from and how to load it."""

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in _kinds():
            *first, last = (repr(k) for k in _kinds())
            raise PydanticCustomError(
                "literal_error",
                "Input should be {expected}",
                {"expected": f"{', '.join(first)} or {last}"},
            )
        return kind

    @model_validator(mode="before")
    @classmethod
    def _kind_prefix(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            return data
        kind, path, tokenizer = _split_kind(data["path"])
        if kind is None:
            return data
        if data.get("kind", kind) != kind:
            raise UserInputError(
                f"model {data.get('name', path)!r}: path says {kind} but kind is {data['kind']}"
            )
        if tokenizer is not None and data.get("tokenizer", tokenizer) != tokenizer:
            raise UserInputError(f"model {data.get('name', path)!r}: two tokenizers given")
        update = {"kind": kind, "path": path}
        return {**data, **update, **({"tokenizer": tokenizer} if tokenizer else {})}

    @model_validator(mode="after")
    def _check_kind(self) -> ModelRef:
        applies = _kinds()[self.kind].options
        options = dict.fromkeys(o for source in _kinds().values() for o in source.options)
        wrong = [o for o in options if o not in applies and getattr(self, o) not in (None, False)]
        if wrong:
            raise UserInputError(
                f"model {self.name!r}: {', '.join(wrong)} does not apply to "
                f"{_kinds()[self.kind].what}"
            )
        if self.trust_remote_code and not _kinds()[self.kind].runs_remote_code:
            raise UserInputError(
                f"model {self.name!r}: trust_remote_code would be ignored: "
                f"{_kinds()[self.kind].what} runs no code of its own"
            )
        if self.trust_remote_code and not runs_own_code(self.kind, self.path):
            raise UserInputError(
                f"model {self.name!r}: trust_remote_code would be ignored: {self.path} runs no "
                "code of its own (transformers builds a GGUF file's architecture itself)"
            )
        if self.seed and not self.random_init:
            raise UserInputError(
                f"model {self.name!r}: seed {self.seed} would be ignored: it seeds random_init "
                "only (the model's own weights are read)"
            )
        if self.revision is not None and self.path.startswith((PACKAGE_PREFIX, GGUF_PREFIX)):
            raise UserInputError(
                f"model {self.name!r}: revision {self.revision!r} would be ignored: it applies "
                f"to a Hugging Face hub id only, not {self.path}"
            )
        return self

    @property
    def source(self) -> ReferencedModel:
        """The model this reference names, as its kind's class."""
        from lmalgebra.sources.kinds import source_of

        return source_of(self)

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """CLI form: ``[NAME=][random:]PATH[@REVISION]``, ``[NAME=][random:]gguf:FILE``,
        ``[NAME=]onnx:FILE[#TOKENIZER]`` or ``[NAME=]precomputed:FILE``; a part refused is
        named in the reference as given (it had been named as ``ModelRef: key 'name'``)."""
        try:
            return cls._parse(text)
        except SettingsError as err:
            said = str(err).removeprefix(f"{cls.__name__}: ")
            raise UserInputError(f"model reference {text!r}: {said}") from None

    @classmethod
    def named(cls, name: str, reference: str) -> ModelRef:
        """An entry of a mapping name -> reference (``{"mine": "random:gpt2"}``): ``reference``
        as on the command line without its ``NAME=``, under ``name``; either refused is named as
        given (a blank name had been named as ``ModelRef: key 'name'``, the class, not the
        argument)."""
        if not reference.strip():
            raise UserInputError(f"model {name!r}: the reference is empty")
        try:
            return cls._parse(reference, name)
        except SettingsError as err:
            said = str(err).removeprefix(f"{cls.__name__}: ").removeprefix("key 'name': ")
            raise UserInputError(f"model {name!r} ({reference}): {said}") from None

    @classmethod
    def _parse(cls, text: str, given: str | None = None) -> ModelRef:
        """``text`` as ``[NAME=]REFERENCE``, or as ``REFERENCE`` named ``given``."""
        name, ref = _named(text) if given is None else (given, text)
        kind, file, tokenizer = _split_kind(ref)
        if kind is not None:
            if not file:
                raise UserInputError(f"model reference {text!r} names no file")
            suffixes = tuple(s for source in _kinds().values() for s in source.suffixes)
            stem = Path(file.rstrip("/")).stem if file.endswith(suffixes) else None
            default = stem or Path(file.removeprefix(PACKAGE_PREFIX).rstrip("/")).name
            name = default if given is None and not name else name
            return cls(name=name, path=file, kind=kind, tokenizer=tokenizer)
        random_init = ref.startswith("random:")
        ref = ref.removeprefix("random:")
        gguf = ref.startswith(GGUF_PREFIX)
        # a file path (a GGUF file's, a local path as it stands): an @ in it is no revision
        path, _, revision = (ref, "", "") if gguf or exists(ref) else ref.partition("@")
        if not path.removeprefix(GGUF_PREFIX).strip():  # blanks had been named as a model name
            raise UserInputError(f"model reference {text!r} names no path or hub id")
        if given is None and not name:
            readable = path.removeprefix(PACKAGE_PREFIX)  # package:minilm -> minilm
            readable = Path(readable.removeprefix(GGUF_PREFIX)).stem if gguf else readable
            name = Path(readable.rstrip("/")).name + ("-random" if random_init else "")
        return cls(name=name, path=path, revision=revision or None, random_init=random_init)


def refuse_same_model(models: Sequence[ModelRef]) -> None:
    """Refuse two names for one model: the same reference (a local path however spelled,
    ``./m/a`` and ``m/a``, or a link to it; a hub id at the same revision), kind and options.
    Each would be embedded and fitted as a model of its own, R^2 1 on the other. Models given
    as Python objects (kind ``memory``) are not compared."""
    seen: dict[tuple[Any, ...], ModelRef] = {}
    for model in models:
        if model.kind == "memory":
            continue
        key = _same_key(model)
        if key in seen:
            first = seen[key]
            paths = {first.path: None, model.path: None}
            raise UserInputError(
                f"models {first.name!r} and {model.name!r} are the same model "
                f"({' and '.join(paths)}): each would be fitted on the other, its copy; "
                "name it once"
            )
        seen[key] = model


def _same_key(model: ModelRef) -> tuple[Any, ...]:
    """What makes ``model`` the model it is: its fields but the name, its local paths (the
    model's, its tokenizer's) resolved."""
    fields = model.model_dump(exclude={"name"})
    for key in ("path", "tokenizer"):
        fields[key] = _where(fields[key])
    return tuple(sorted(fields.items()))


def _where(path: str | None) -> str | None:
    """``path`` (after a ``gguf:`` prefix) resolved where it names something here."""
    if path is None:
        return None
    prefix = GGUF_PREFIX if path.startswith(GGUF_PREFIX) else ""
    local = path.removeprefix(prefix)
    return prefix + str(home_expanded(Path(local)).resolve()) if exists(local) else path


def runs_own_code(kind: str, path: str) -> bool:
    """Whether a model of ``kind`` at ``path`` may run code shipped with it: a transformers
    model, but not a GGUF file (``gguf:``), whose architecture transformers builds itself."""
    return _kinds()[kind].runs_remote_code and not path.startswith(GGUF_PREFIX)


def allow_remote_code(entries: list[dict[str, Any]], flag: str) -> None:
    """Set ``trust_remote_code`` on the model entries of the command line (``--models``) whose
    kind runs code of its own; ``flag`` (``--trust-remote-code``) was given. Refused when no
    entry takes it: models of a recipe say it themselves, ONNX and precomputed ones run none."""
    takers = [
        e for e in entries if runs_own_code(e.get("kind", "transformers"), str(e.get("path", "")))
    ]
    if not takers:
        where = (
            "the models it applies to are those given with --models, and none is given (a "
            "recipe's model sets trust_remote_code: true itself)"
            if not entries
            else "none of the --models runs code of its own (ONNX, precomputed and GGUF "
            "models run none)"
        )
        raise UserInputError(f"{flag} would be ignored: {where}")
    for entry in takers:
        entry["trust_remote_code"] = True


def _named(text: str) -> tuple[str, str]:
    """``[NAME=]REFERENCE`` as ``(NAME, REFERENCE)`` (``""``: no name given), split at the first
    ``=``: a path may hold one (``runs/lr=0.1/model``), and had been split at its last. Text
    before the ``=`` that holds a ``/`` or a kind's ``:`` is a path's, no name, and so is a
    local path that stands whole."""
    name, given, ref = text.partition("=")
    if not given or "/" in name or ":" in name or exists(text):
        return "", text
    return name, ref
