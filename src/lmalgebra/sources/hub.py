"""The Hugging Face hub: fetch a model's or tokenizer's snapshot, or say in one line why not.

Every reference that is not a local path, a packaged asset or a file goes through ``snapshot``
(a snapshot already in the Hugging Face cache is used without a connection). When the hub cannot
be reached (``HF_HUB_OFFLINE`` set, no connection) the message names the id and says so, with the
offline alternatives, instead of the hub client's traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import home_expanded

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_local(path: str) -> bool:
    """Whether ``path`` is meant as a local path (not a hub id): it starts like one, exists, or
    is no valid repository id."""
    local = home_expanded(Path(path))
    return path.startswith((".", "/", "~")) or local.exists() or not _HUB_ID.match(path)


def snapshot(
    owner: str, repo: str, revision: str | None, patterns: list[str] | None = None
) -> Path:
    """A hub snapshot of ``repo`` (from the Hugging Face cache when it is there). ``owner`` starts
    every message ("model 'bert'")."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except Exception as err:  # the hub client raises many types; all mean "cannot get it"
        reason = _unreachable(err)
        if reason is not None:
            raise UserInputError(
                f"{owner}: {repo!r} could not be reached: the Hugging Face hub is offline "
                f"({reason}) and {repo!r} is not in its local cache{_no_directory(repo)}; use a "
                "local directory or a package: model instead (`lmalgebra packaged` lists them)"
            ) from err
        raise UserInputError(
            f"{owner}: cannot fetch {repo!r} from the hub ({type(err).__name__})"
            f"{_no_directory(repo)}; give a local directory instead"
        ) from err


def _no_directory(repo: str) -> str:
    """For an id whose owner part is a local directory (``models/bert`` where ``models/`` is
    here), that no directory of the whole name is there either: a path mistyped had been named
    as a hub id alone."""
    owner, _, name = repo.partition("/")
    if owner and name and home_expanded(Path(owner)).is_dir():
        return f", nor is there a directory {repo} here ({owner}/ holds no {name})"
    return ""


def _unreachable(err: BaseException) -> str | None:
    """Why the hub could not be reached, when that is what ``err`` says; None for other errors
    (a repository or revision the hub does not have, a refused token)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    # without a connection, or offline, the client reports that no cached snapshot was found
    if not any(
        isinstance(e, LocalEntryNotFoundError | ConnectionError | TimeoutError) for e in chain
    ):
        return None
    if getattr(constants, "HF_HUB_OFFLINE", False):
        return "HF_HUB_OFFLINE is set"
    causes = [type(e).__name__ for e in chain if not isinstance(e, LocalEntryNotFoundError)]
    return "no connection" + (f": {causes[0]}" if causes else "")
