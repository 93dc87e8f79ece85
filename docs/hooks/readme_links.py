"""MkDocs hook: the README's links, checked by the same build as the site's.

README.md is read outside the site (after cloning, or on a code host), so the build's own link
validation never sees it. After the build, every relative link of README.md must name a file of
the repository, and its anchor (``#...``) a heading of that page: for a page of the site, an
anchor the build made; for another Markdown file, README.md itself included, one of its headings
slugged as the site slugs them. A broken link is a warning, so ``mkdocs build --strict`` (and
``make lint``, which runs it) fails on it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from markdown.extensions.toc import slugify

log = logging.getLogger("mkdocs.hooks.readme_links")

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#+\s+(.*?)\s*$")
_EXPLICIT_ID = re.compile(r'id="([^"]+)"')
_FENCE = re.compile(r"^\s*```")
_anchors: dict[str, set[str]] = {}  # a page of the site (path under docs/) -> its anchors


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    _anchors[page.file.src_uri] = set(_EXPLICIT_ID.findall(html))
    return html


def _outside_fences(text: str) -> list[tuple[int, str]]:
    """The numbered lines of ``text`` that are not in a fenced code block."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def heading_anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as the site's table of contents makes them."""
    text = path.read_text(encoding="utf-8")
    found = set(_EXPLICIT_ID.findall(text))
    for _, line in _outside_fences(text):
        heading = _HEADING.match(line)
        if heading:
            found.add(slugify(re.sub(r"[`*]", "", heading.group(1)), "-"))
    return found


def broken_links(readme: Path, docs_dir: Path, site_anchors: dict[str, set[str]]) -> list[str]:
    """Each broken relative link of ``readme``, as ``README.md:LINE: TARGET (why)``."""
    root = readme.parent
    broken = []
    for number, line in _outside_fences(readme.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path = (root / path_part).resolve() if path_part else readme
            where = f"{readme.name}:{number}: {target}"
            if not path.exists():
                broken.append(f"{where} (no such file)")
                continue
            if not anchor:
                continue
            if path.is_relative_to(docs_dir) and path.suffix == ".md":
                anchors = site_anchors.get(path.relative_to(docs_dir).as_posix(), set())
            else:
                anchors = heading_anchors(path)
            if anchor not in anchors:
                broken.append(f"{where} (no heading with anchor #{anchor})")
    return broken


def on_post_build(config: Any, **kwargs: Any) -> None:
    readme = Path(config.config_file_path).parent / "README.md"
    for problem in broken_links(readme, Path(config.docs_dir).resolve(), _anchors):
        log.warning("broken link in %s", problem)
