"""The documentation site: the API page lists every exported name, and the strict build that
`make lint` runs fails on a broken link, anchor or API reference, in the site or in README.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lmalgebra

ROOT = Path(__file__).resolve().parents[2]
API_PAGE = ROOT / "docs" / "api.md"


def test_the_api_page_lists_every_exported_name() -> None:
    listed = set(re.findall(r"^::: ([\w.]+)$", API_PAGE.read_text(encoding="utf-8"), re.M))
    for name in lmalgebra.__all__:
        if name == "__version__":
            continue
        value = getattr(lmalgebra, name)
        assert f"{value.__module__}.{name}" in listed, name
    assert "lmalgebra.experimental" in listed


def _site_copy(tmp_path: Path) -> Path:
    """What the build reads, in a scratch folder: the configuration, docs/, README.md and the
    benchmark figures; the package sources linked, not copied."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    (copy / "bench").mkdir()
    for name in ("mkdocs.yml", "README.md", "bench/RESULTS.md"):
        shutil.copy(ROOT / name, copy / name)
    (copy / "src").symlink_to(ROOT / "src")
    (copy / "examples").symlink_to(ROOT / "examples")
    (copy / "experiments").symlink_to(ROOT / "experiments")  # the recorded results docs render
    (copy / "bench" / "results").symlink_to(ROOT / "bench" / "results")  # and the benchmarks'
    return copy


def _build(repo: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
    ]  # --quiet would drop the warnings
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [*command, "-f", str(repo / "mkdocs.yml"), "-d", str(repo / "site")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)  # the page still holds what this test breaks
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_the_strict_build_fails_on_a_broken_link_anchor_or_reference(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    repo = _site_copy(tmp_path)
    intact = _build(repo)
    assert intact.returncode == 0, intact.stderr[-3000:]
    assert (repo / "site" / "api" / "index.html").is_file()

    docs = repo / "docs"
    _replace(docs / "index.md", "(lmd/method.md)", "(lmd/no-such-page.md)")
    _replace(docs / "lmd/results.md", "(studies.md#bootstrap-intervals)", "(studies.md#no-such)")
    with (docs / "python-api.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the solver][lmalgebra.stats.no_such_solver].\n")
    _replace(repo / "README.md", "(docs/faults.md)", "(docs/no-faults.md)")
    _replace(repo / "README.md", "(docs/getting-started.md)", "(docs/getting-started.md#nowhere)")
    broken = _build(repo)
    assert broken.returncode != 0
    for culprit in (
        "lmd/no-such-page.md",
        "#no-such",
        "lmalgebra.stats.no_such_solver",
        "docs/no-faults.md (no such file)",
        "docs/getting-started.md#nowhere (no heading with anchor #nowhere)",
    ):
        assert culprit in broken.stderr, (culprit, broken.stderr[-3000:])


def test_the_readme_is_a_landing_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for section in ("## Set-up: two commands", "## Python API", "## Dependencies, and why"):
        assert section in readme
    assert "make demo" in readme and "make test" in readme


def _command_options() -> dict[str, set[str]]:
    """Every ``lmalgebra`` command (``merge train``...) -> the option names it accepts."""
    import typer.main

    from lmalgebra.cli import app

    found: dict[str, set[str]] = {}

    def walk(command, prefix: str) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{prefix} {name}".strip())
        if not hasattr(command, "commands"):
            names = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            found[prefix] = names | {"--help"}

    walk(typer.main.get_command(app), "")
    return found


def test_every_flag_the_documentation_shows_exists() -> None:
    """``lmalgebra CMD ... --flag`` in the README, the documentation and the package's own
    messages: the command takes that flag (a flag lost in a merge, or renamed, is caught)."""
    options = _command_options()
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py")]
    pattern = re.compile(r"lmalgebra ((?:merge |pretrain |experimental )?[a-z][a-z-]*)([^`\n]*)")
    missing = []
    for path in texts:
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            command = match.group(1).strip()
            if command not in options:
                continue
            for flag in re.findall(
                r"(?<![\w-])(--[a-z][A-Za-z0-9_.-]*[A-Za-z0-9_])", match.group(2)
            ):
                if flag not in options[command] and flag.islower():  # KEY: a placeholder
                    missing.append(f"{path.relative_to(ROOT)}: lmalgebra {command} {flag}")
    assert len(options) > 15 and "--dry-run" in options["decompose"]
    assert not missing, "\n".join(sorted(set(missing)))


# flags of other tools that the pages name in backticks: pip, torchrun, accelerate, the scripts
OTHER_TOOLS = {"--no-deps", "--node-rank", "--num_processes", "--model", "--corpus", "--steps"}
OTHER_TOOLS |= {"--scale", "--tag", "--loaded", "--no-bf16"}


def test_every_flag_named_in_backticks_exists() -> None:
    """A flag the README or a page names in backticks (`--scale.method`, outside a command
    line) is some command's: scale.md had named `--method`, which no command takes."""
    every = set().union(*_command_options().values()) | OTHER_TOOLS
    flag = re.compile(r"`(--[a-z][A-Za-z0-9_.-]*[A-Za-z0-9_])")
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for name in flag.findall(path.read_text(encoding="utf-8"))
        if name not in every and not name.endswith(".KEY")  # --scale.KEY: a placeholder
    ]
    assert not missing, "\n".join(missing)
    # every boolean option is a switch: `--study.similarity false` (scale.md) reads `false` as
    # the recipe
    valued = re.compile(r"`--[a-z][A-Za-z0-9_.-]* (?:true|false)\b")
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert not [hit for path in texts for hit in valued.findall(path.read_text(encoding="utf-8"))]


def _rendered_results():
    """``docs/hooks/rendered_results.py``, imported by path (docs/ is no package)."""
    import importlib.util

    path = ROOT / "docs" / "hooks" / "rendered_results.py"
    spec = importlib.util.spec_from_file_location("rendered_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rendered_figures_match_their_recorded_results() -> None:
    """Every rendered block of README.md and docs/ is its results' rendering: a new run cannot
    leave a stale figure behind (``python docs/hooks/rendered_results.py`` rewrites them)."""
    rendered = _rendered_results()
    found = [b for page in rendered.pages() for b in rendered.blocks(page.read_text("utf-8"))]
    assert {name for name, _, _ in found} == set(rendered.RENDERERS)
    assert rendered.stale() == []


def test_a_figure_edited_by_hand_is_stale(tmp_path: Path, monkeypatch) -> None:
    rendered = _rendered_results()
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text("utf-8")
    name, path, body = rendered.blocks(text)[0]
    edited = re.sub(r"\d\.\d{3}", "9.999", body, count=1)
    assert edited != body
    readme.write_text(text.replace(body, edited), encoding="utf-8")
    monkeypatch.setattr(rendered, "pages", lambda: [readme])
    found = rendered.stale()
    assert len(found) == 1 and f"{name} from {path}" in found[0]


@pytest.mark.parametrize(
    ("stem", "script"),
    [
        ("real_teachers", "real_teachers"),
        ("real_teachers_fresh_clone", "real_teachers"),
        ("little_data", "distillation_regimes"),
        ("merge", "distillation_regimes"),
        ("merge_text", "distillation_regimes"),
        ("merge_long", "distillation_regimes"),
    ],
)
def test_recorded_experiment_tables_are_their_results_rendered(stem: str, script: str) -> None:
    """An experiment's Markdown (included by the docs) is its recorded JSON as the experiment's
    own ``markdown`` renders it: neither edited by hand nor left behind by a newer run."""
    import importlib

    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        module = importlib.import_module(script)
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    import json

    results = ROOT / "experiments" / "results"
    recorded = json.loads((results / f"{stem}.json").read_text(encoding="utf-8"))
    if (results / f"{stem}.md").is_file():
        assert module.markdown(recorded) == (results / f"{stem}.md").read_text(encoding="utf-8")
    else:  # a JSON alone (a rerun): it renders
        assert module.markdown(recorded).startswith("Run ")


def test_recorded_results_are_strict_json() -> None:
    """A recorded result holding ``NaN`` (``causal_budget.json``'s gap closed for English, the
    wide bench's diagonals) is refused by strict JSON readers: the scripts write null, as the
    library's writers do."""
    import json

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    for folder in ("experiments/results", "bench/results"):
        for path in sorted((ROOT / folder).rglob("*.json")):
            try:
                json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
            except ValueError as err:
                raise AssertionError(f"{path.relative_to(ROOT)}: {err}") from None


def test_the_outputs_table_names_every_file_a_decomposition_writes() -> None:
    """docs/lmd/results.md's Outputs table covers every name a run owns (``schema.OWNED``):
    ``provenance.json`` and ``reduction.csv`` had been left out."""
    from fnmatch import fnmatch

    from lmalgebra.lmd.rundir.schema import OWNED

    page = (ROOT / "docs" / "lmd" / "results.md").read_text(encoding="utf-8")
    cells = re.findall(r"^\| (`.*?) \|", page.split("## Outputs", 1)[1].split("\n## ")[0], re.M)
    patterns = []
    for cell in cells:
        for name in re.findall(r"`([^`]+)`", cell):
            alternatives = re.search(r"\{(\w+(?:,\w+)+)\}", name)
            names = (
                [name]
                if not alternatives
                else [
                    name.replace(alternatives.group(0), a) for a in alternatives.group(1).split(",")
                ]
            )
            patterns += [re.sub(r"\{\w+\}", "*", n) for n in names]
    missing = [name for name in OWNED if not any(fnmatch(name, p) for p in patterns)]
    assert not missing, missing


def test_the_development_page_names_every_test_folder() -> None:
    """docs/development.md's map of the tests names each folder of them (``experimental/`` had
    been left out)."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    text = text[text.index("Tests mirror the package") :].split("\n\n")[0]
    folders = [p.name for p in (ROOT / "tests").iterdir() if any(p.glob("test_*.py"))]
    assert len(folders) > 10
    assert [f for f in sorted(folders) if f"{f}/`" not in text] == []


def test_the_python_api_page_names_every_experimental_feature() -> None:
    """The Python API page's list of experimental features holds each of them: every
    experimental loss of lmalgebra's own (``prefix_all_kl`` had been left out)."""
    from lmalgebra.core import plugins

    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    listed = text[text.index("**Experimental**") :]
    group = plugins.declared(plugins.CAUSAL_LOSSES)
    ours = [n for n, point in group.items() if point.value.startswith("lmalgebra.experimental.")]
    assert ours
    for name in [*ours, "select_teachers", "init_embeddings: teachers"]:
        assert f"`{name}`" in listed or f"`student.{name}`" in listed, name
