"""Griffe extension of the documentation build: config field descriptions are plain text.

A pydantic field's ``description`` is also its command-line help, where it reads as written
(``[NAME=][random:]PATH``); as the field's docstring on the API page, Markdown would take such
brackets for reference links. This escapes them, after griffe-pydantic has turned the
descriptions into docstrings (list this extension after it in ``mkdocs.yml``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_BRACKET = re.compile(r"(?<!\\)([\[\]])")


def _escape(obj: griffe.Object) -> None:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if "pydantic-field" in member.labels and member.docstring is not None:
            member.docstring.value = _BRACKET.sub(r"\\\1", member.docstring.value)
        _escape(member)  # type: ignore[arg-type]


class PlainFieldDescriptions(griffe.Extension):
    """Escapes Markdown brackets in the docstrings griffe-pydantic makes from descriptions."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _escape(pkg)
