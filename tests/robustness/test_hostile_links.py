"""A symbolic link to nothing, given where a model, tokenizer, corpus or output goes, is named as
such: not "a file", and not taken for a Hugging Face hub id to download."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import require_file
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.tokenizers import resolve_tokenizer
from lmalgebra.storage.output_paths import check_directory

LINKED = "which does not exist"


@pytest.fixture
def link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``models/bert`` (relative: it reads as a hub id too), a link to a path that is gone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    made = Path("models/bert")
    made.symlink_to(tmp_path / "gone")
    return made


def test_a_model_or_tokenizer_behind_a_dangling_link_is_no_hub_id(link: Path) -> None:
    with pytest.raises(UserInputError, match=f"model 'bert': models/bert .*gone, {LINKED}"):
        ModelRef.parse(str(link)).source.resolve()
    with pytest.raises(UserInputError, match=f"tokenizer models/bert .*{LINKED}"):
        resolve_tokenizer(str(link), "student")
    with pytest.raises(UserInputError, match=f"GGUF file models/bert .*{LINKED}"):
        ModelRef.parse(f"gguf:{link}").source.resolve()


def test_a_dangling_link_is_not_called_a_file(link: Path) -> None:
    with pytest.raises(UserInputError, match=f"output directory models/bert .*{LINKED}"):
        check_directory(link)
    with pytest.raises(UserInputError, match=f"corpus models/bert .*{LINKED}"):
        read_documents(CorpusSpec(paths=[str(link)]))
    with pytest.raises(UserInputError, match=f"recipe models/bert .*{LINKED}"):
        require_file(link, "recipe")
    from lmalgebra.distill.layout import RunLayout

    # merge evaluate / verify / inspect of it: had been "not a merge run directory"
    with pytest.raises(UserInputError, match=f"run directory models/bert .*{LINKED}"):
        RunLayout(link).require_recipe()


def test_a_loop_of_links_is_named_as_one(tmp_path: Path) -> None:
    """A link to itself, or two links to each other, are no file that went missing."""
    (tmp_path / "self.txt").symlink_to("self.txt")
    (tmp_path / "a.txt").symlink_to("b.txt")
    (tmp_path / "b.txt").symlink_to("a.txt")
    for name in ("self.txt", "a.txt"):
        with pytest.raises(UserInputError, match=f"corpus .*{name} is a symbolic link .*a loop"):
            read_documents(CorpusSpec(paths=[str(tmp_path / name)]))


@pytest.mark.parametrize("part", ["embeddings", "hashes"])
def test_a_loop_of_links_met_where_a_path_is_resolved_is_one_line(
    part: str,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A cache directory linked to itself, and a run directory given to ``report`` that is
    one, had ended in pathlib's ``RuntimeError: Symlink loop from ...``."""
    from hostile_helpers import assert_one_line, run_cli

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / part).symlink_to(part)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt)]
    args += ["--out", str(tmp_path / "out"), "--no-progress"]
    assert_one_line(*run_cli(args, monkeypatch, capsys), [f"{cache / part} is a symbolic", "loop"])
    (tmp_path / "run").symlink_to("run")
    code, stderr = run_cli(["report", str(tmp_path / "run")], monkeypatch, capsys)
    assert_one_line(code, stderr, [f"{tmp_path / 'run'} is a symbolic link to run", "a loop"])


@pytest.mark.parametrize("below", [False, True])
def test_an_output_directory_behind_a_link_to_nothing_is_not_made_at_its_target(
    below: bool,
    tmp_path: Path,
    teacher_dirs: dict[str, Path],
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    cli,
) -> None:
    """``output_dir`` (``--out``) a link to a path that is gone, or a directory below such a
    link: the run resolved the link and made its target (``merge prepare``, ``pretrain``), or
    made the directories below it (``decompose``, ``evaluate-pos``), writing outside the path
    given, where the dry run had refused the link itself. Each refuses it in one line, by the
    dry run too, and nothing is made."""
    import yaml

    from hostile_helpers import assert_one_line
    from merge_fixtures import write_recipe

    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "target")
    out = link / "sub" if below else link
    recipe = write_recipe(tmp_path, teacher_dirs)
    data = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(out)}))
    commands = [
        ["merge", "prepare", str(recipe)],
        ["merge", "run", str(recipe), "--dry-run"],
        [
            *["pretrain", "head-only", "--language", "xx", "--encoder", str(bert_dir)],
            *["--corpus.paths", str(corpus_txt), "--out", str(out), "--training.steps", "1"],
        ],
        [
            *["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"],
            *["--corpus.paths", str(corpus_txt), "--out", str(out)],
        ],
    ]
    for args in commands:
        code, stderr = cli(args)
        assert_one_line(code, stderr, [str(link), LINKED])
        assert not (tmp_path / "gone").exists(), args


def test_an_output_through_a_link_into_another_output_is_refused(tmp_path: Path) -> None:
    """``decompose --out LINK`` where the link leads into a merge run (an empty folder of it):
    the dry run had planned it and the run would have written the decomposition among the
    merge run's files, since only the path as named was looked up. Where it leads is judged
    too, for an output directory below the link and a report file as well."""
    from lmalgebra.lmd.run.decompose import check_output_directory
    from lmalgebra.storage.output_paths import refuse_inside_other_output

    run = tmp_path / "run"
    (run / "examples").mkdir(parents=True)
    (run / "recipe.yaml").write_text("objective: causal\n", encoding="utf-8")
    (run / "empty").mkdir()
    link = tmp_path / "out"
    link.symlink_to(run / "empty")
    wanted = rf"would go inside {run}, which holds a merge run \(recipe\.yaml\)"
    for path in (link, link / "sub"):
        with pytest.raises(UserInputError, match=wanted):
            check_output_directory(path)
    with pytest.raises(UserInputError, match=wanted):
        refuse_inside_other_output(link / "report.html", "report")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link.unlink()
    link.symlink_to(elsewhere)
    check_output_directory(link)  # a link to a directory of no output is followed


def test_a_model_written_again_in_a_hard_link_copy_leaves_the_original(
    gpt2_dir: Path, tmp_path: Path
) -> None:
    """A run copied with hard links (``cp -al``, ``rsync --link-dest``) and its student trained
    again in the copy: ``save_pretrained`` writes in place, and had written the new model's
    ``config.json`` (tokenizer files) into the original's, which then failed its record."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hostile_helpers import digests
    from lmalgebra.distill.layout import write_model_directory
    from lmalgebra.sources.model_files import model_damage

    model = AutoModelForCausalLM.from_pretrained(gpt2_dir)
    tokenizer = AutoTokenizer.from_pretrained(gpt2_dir)
    original, copy = tmp_path / "run" / "model", tmp_path / "copy" / "model"
    write_model_directory(original, model, tokenizer, {"steps": 1})
    copy.mkdir(parents=True)
    for path in original.iterdir():
        os.link(path, copy / path.name)
    before = digests(original)
    model.config.summary_activation = "tanh"  # another model's configuration
    write_model_directory(copy, model, tokenizer, {"steps": 2})
    assert digests(original) == before
    assert model_damage(original) is None and model_damage(copy) is None


# a FIFO where the tokenizers library writes (tokenizer.json) blocks in its own code, which no
# deadline here interrupts: the FIFO is tried where Python opens it, links everywhere
@pytest.mark.parametrize(
    ("blocker", "name"),
    [
        ("fifo", "config.json"),
        ("link", "config.json"),
        ("link", "tokenizer.json"),
        ("link", "tokenizer_config.json"),
    ],
)
def test_a_fifo_or_link_in_a_model_directory_written_again_is_refused(
    name: str, blocker: str, gpt2_dir: Path, tmp_path: Path
) -> None:
    """A student trained again (``merge train`` of a finished student, ``pretrain`` into its
    model) whose ``config.json`` or tokenizer file is a FIFO: ``save_pretrained`` writes them in
    place, and opening the FIFO had waited for a reader forever; a link had been written
    through. Either is named before anything is written."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hostile_helpers import deadline
    from lmalgebra.distill.layout import write_model_directory

    model = AutoModelForCausalLM.from_pretrained(gpt2_dir)
    tokenizer = AutoTokenizer.from_pretrained(gpt2_dir)
    target = tmp_path / "student" / "model"
    write_model_directory(target, model, tokenizer, {"steps": 1})
    (target / name).unlink()
    if blocker == "fifo":
        os.mkfifo(target / name)
    else:
        (target / name).symlink_to(tmp_path / "elsewhere.json")
    listed = sorted(p.name for p in target.iterdir())
    with deadline(60), pytest.raises(UserInputError, match=f"{target / name} is"):
        write_model_directory(target, model, tokenizer, {"steps": 2})
    assert sorted(p.name for p in target.iterdir()) == listed
    assert not (tmp_path / "elsewhere.json").exists()
