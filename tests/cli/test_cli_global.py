"""Global command-line options: --version, -h everywhere, -v/-q, and the top-level help."""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

import pytest

from lmalgebra import __version__
from lmalgebra.cli import main


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str):
    monkeypatch.setattr(sys, "argv", ["lmalgebra", *args])
    try:
        main()
    except SystemExit as stop:
        code = int(stop.code or 0)
    else:
        code = 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(monkeypatch, capsys, "--version")
    assert code == 0 and out.strip() == f"lmalgebra {__version__}"


@pytest.mark.parametrize(
    "command", [[], ["decompose"], ["spans"], ["report"], ["merge"], ["merge", "train"]]
)
def test_short_help_everywhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(monkeypatch, capsys, *command, "-h")
    assert code == 0 and "Usage:" in out


@pytest.mark.parametrize("group", [[], ["merge"], ["pretrain"], ["experimental"]])
def test_command_lists_show_each_summary_as_one_paragraph(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], group: list[str]
) -> None:
    # a summary whose docstring spans lines reads as one paragraph in its group's list, not
    # cut where the source's lines end ("masked runs, masked-token" / "accuracy, ...")
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run(monkeypatch, capsys, *group, "--help")
    assert code == 0
    panel = out[out.index("Commands") :].splitlines()[1:]
    rows = panel[: next(i for i, line in enumerate(panel) if line.startswith("\u2570"))]
    used = [len(row.rstrip("\u2502").rstrip()) for row in rows]
    for k in range(1, len(rows)):  # a summary wraps only where its next word does not fit
        if rows[k][2] == " ":  # row k continues the summary of the row above it
            word = rows[k].strip("\u2502 ").split()[0]
            assert used[k - 1] + 1 + len(word) > max(used), (rows[k - 1], rows[k])
    if group == ["merge"]:
        assert "masked runs, masked-token accuracy, perplexity" in out


@pytest.mark.parametrize("command", [["decompose"], ["merge", "train"], ["experimental", "select"]])
def test_a_commands_help_paragraphs_wrap_at_the_terminals_width(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A help paragraph had kept its docstring's line breaks: on an 80-column terminal
    ("a flag given overrides the" / "recipe, one not given ...") a line broke midway."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(monkeypatch, capsys, *command, "--help")
    assert code == 0
    text = "\n".join(line.rstrip() for line in out[: out.index("\u256d")].splitlines())
    for paragraph in text.strip("\n").split("\n\n")[2:]:  # after the usage and the summary
        lines = paragraph.splitlines()
        for line, after in itertools.pairwise(lines):
            assert len(line) + 1 + len(after.split()[0]) > 78, (line, after)


def test_top_level_help_describes_both_jobs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _, out, _ = run(monkeypatch, capsys, "--help")
    assert "decompose" in out and "MergeDistill" in out and "Example:" in out
    assert "--install-completion" in out


@pytest.mark.parametrize(("flag", "level"), [("-v", logging.DEBUG), ("-q", logging.WARNING)])
def test_verbosity_sets_the_log_level(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str, level: int
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)  # restored after the test
    code, _, _ = run(monkeypatch, capsys, flag, "report", "-h")
    assert code == 0 and root.level == level


def test_verbose_and_quiet_exclude_each_other(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "-v", "-q", "report", "x")
    assert code == 2 and "exclude each other" in err


def test_default_model_names_are_readable() -> None:
    from lmalgebra.sources.models import ModelRef

    assert ModelRef.parse("package:minilm").name == "minilm"
    assert ModelRef.parse("random:package:minilm").name == "minilm-random"
    assert ModelRef.parse("org/bert-base@v1").name == "bert-base"


def test_colliding_model_names_are_refused_with_the_remedy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one two three\n", encoding="utf-8")
    args = ["decompose", "--models", "a/bert", "--models", "b/bert", "--corpus.paths", str(corpus)]
    code, _, err = run(monkeypatch, capsys, *args, "--out", str(tmp_path / "out"))
    assert code == 2 and "repeated: bert" in err and "NAME=REFERENCE" in err


def test_packaged_lists_models_corpora_and_recipes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmalgebra.cli.app import console

    # wide enough for every name on one line, whenever and wherever the console was made (its
    # width is read from COLUMNS or the terminal once, when it is created)
    monkeypatch.setattr(console, "width", 250)
    code, out, _ = run(monkeypatch, capsys, "packaged")
    assert code == 0
    models, corpora = out.index("Packaged models"), out.index("Packaged corpora")
    assert models < out.index("package:minilm-sre") < corpora < out.index("package:wiki-fr")
    assert "recipe:decompose-minilm-wiki" in out[out.index("Shipped recipes") :]


def test_unknown_packaged_name_suggests_the_closest() -> None:
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.sources.packaged import asset_path

    with pytest.raises(UserInputError, match="did you mean 'minilm-sre'"):
        asset_path("minilm-sr")


def test_a_packaged_corpus_given_as_a_model_is_named_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A packaged corpus where a model goes (and the reverse) is named for what it is, by the
    dry run too: it had been refused in transformers' words on a JSON file of the package."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one two three\n", encoding="utf-8")
    args = ["decompose", "--models", "a=package:wiki-en", "--models", "b=package:minilm"]
    code, _, err = run(monkeypatch, capsys, *args, "--corpus.paths", str(corpus), "--dry-run")
    assert code == 2 and "package:wiki-en is a packaged corpus, not a model" in err, err
    code, _, err = run(
        monkeypatch,
        capsys,
        "spans",
        "--models",
        "b=package:minilm",
        "--corpus.paths",
        "package:minilm",
        "--out",
        str(tmp_path / "s.jsonl"),
    )
    assert code == 2 and "package:minilm is a packaged model, not a corpus" in err, err


def test_shipped_recipes_by_name_from_any_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.core.recipe_files import read_yaml
    from lmalgebra.lmd.settings.recipe import load_config

    monkeypatch.chdir(tmp_path)
    config = load_config("recipe:decompose-minilm-wiki", {})  # type: ignore[arg-type]
    assert [m.name for m in config.models][:2] == ["minilm", "minilm-sre"]
    with pytest.raises(UserInputError, match="did you mean 'study-minilm-wiki'"):
        read_yaml("recipe:study-minilm", shipped=True)  # type: ignore[arg-type]


def test_a_table_piped_or_narrow_loses_no_cell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped (rich's 80 columns) or in a narrow terminal, a table had cut its cells with an
    ellipsis: `packaged` its names (`package:minil…`), `merge inspect` every number (`20…`).
    Piped, a table is as wide as its cells; in a terminal, a cell too long folds."""
    import importlib
    import io

    from rich.table import Table

    app = importlib.import_module("lmalgebra.cli.app")

    monkeypatch.setattr(app.console, "width", 80)
    code, out, _ = run(monkeypatch, capsys, "packaged")
    assert code == 0
    assert "package:minilm-l3-onnx" in out and "…" not in out
    path = "o/" + "a" * 50 + "/" + "b" * 50  # a path piped had been split over two lines
    app.console.print(f"outputs in {path}")
    assert capsys.readouterr().out == f"outputs in {path}\n"
    narrow = app.FoldingConsole(file=io.StringIO(), width=8, force_terminal=True, color_system=None)
    table = Table("tokens")
    table.add_row("75812345")
    narrow.print(table)
    shown = narrow.file.getvalue()
    cells = [line.strip("│ ") for line in shown.splitlines() if line.startswith("│")]
    assert "…" not in shown and "".join(cells) == "75812345"


@pytest.mark.parametrize(
    "command",
    [
        *([], ["decompose"], ["spans"], ["merge"], ["merge", "evaluate"], ["merge", "train"]),
        *(["pretrain", "masked"], ["experimental", "select"], ["evaluate-pos"], ["report"]),
    ],
)
def test_help_names_values_as_the_recipe_flags_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """typer showed ``<bool>`` beside every switch (``--help`` too), ``<str>``, ``<path>`` and
    ``<list[str]>`` beside a command's own options, and ``ANNOTATED`` for
    ``--reference_tokenizer``, where the recipe flags read ``INT``, ``TEXT``, ``PATH``."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(monkeypatch, capsys, *command, "--help")
    assert code == 0
    for shown in ("<bool>", "<str>", "<path>", "<int>", "<list", "ANNOTATED"):
        assert shown not in out, (shown, out)
    rows = [line for line in out.splitlines() if "--help" in line]
    assert rows and "Show this message" in rows[0] and "bool" not in rows[0].lower()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["report", "run", "--widht", "3"], "No such option: --widht"),
        (["merge", "bits-per-byte", "run", "--context", "true"], "'--context': Input should be"),
        (["merge", "verify"], "Missing argument"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args, needle: str
) -> None:
    """click's usage errors (a flag no command has, a value of another type) were three lines
    (the usage, where the help is, then the error) where every other refusal is one."""
    code, _, err = run(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and needle in lines[0] and lines[0].endswith(" -h)")


@pytest.mark.parametrize("command", [["decompose"], ["pretrain", "masked"], ["evaluate-pos"]])
def test_help_piped_cuts_no_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """``--help`` piped (rich takes 80 columns where its output is no terminal) cut flags and
    their values with an ellipsis (``--trust-remote-c…``, ``[NAME=][random:…``)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run(monkeypatch, capsys, *command, "-h")
    assert code == 0 and "…" not in out, out
    assert "--trust-remote-code" in out or command != ["decompose"]


def test_merge_init_help_makes_the_teachers_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its example had chained ``merge init`` and ``merge run``, which refuses the starter until
    the teachers its header names are made."""
    monkeypatch.setenv("COLUMNS", "200")
    _, out, _ = run(monkeypatch, capsys, "merge", "init", "--help")
    example = " ".join(out[out.index("Example:") :].split())
    assert example.index("pretrain") < example.index("merge run")
