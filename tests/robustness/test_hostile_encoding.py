"""Files that are not UTF-8: one line naming the file and the offset of the first bad byte, on
every command that reads a user's text file (recipes, corpora, a run's CSV, JSON and YAML)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostile_helpers import LATIN1, assert_one_line, digests
from report_fixtures import build_run

OFFSET = "byte 0xe9 at offset 3"
RECIPE_COMMANDS = [
    ["decompose"],
    ["merge", "prepare"],
    ["merge", "teach"],
    ["merge", "vocab"],
    ["merge", "run"],
    ["merge", "train"],
]


@pytest.mark.parametrize("command", RECIPE_COMMANDS, ids=" ".join)
def test_recipe_not_utf8(command: list[str], tmp_path: Path, cli) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(b"# " + LATIN1)
    code, stderr = cli([*command, str(recipe)])
    assert_one_line(code, stderr, [str(recipe), "not UTF-8", "byte 0xe9 at offset 5"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".json", ".csv"])
def test_corpus_not_utf8_decompose(
    suffix: str, tmp_path: Path, bert_dir: Path, bert2_dir: Path, cli
) -> None:
    corpus = tmp_path / f"corpus{suffix}"
    corpus.write_bytes(LATIN1)
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    code, stderr = cli([*args, "--corpus.paths", str(corpus), "--out", str(out)])
    assert_one_line(code, stderr, [f"corpus {corpus}", OFFSET])
    assert not out.exists()


def test_corpus_not_utf8_pretrain(tmp_path: Path, cli) -> None:
    corpus = tmp_path / "fr.txt"
    corpus.write_bytes(LATIN1)
    out = tmp_path / "teacher"
    args = [
        "pretrain",
        "masked",
        "--corpus.paths",
        str(corpus),
        "--language",
        "fr",
        "--tokenizer.vocab_size",
        "100",
    ]
    code, stderr = cli([*args, "--out", str(out)])
    assert_one_line(code, stderr, [f"corpus {corpus}", OFFSET])
    assert not out.exists()


def test_corpus_not_utf8_merge_prepare(tmp_path: Path, teacher_dirs: dict[str, Path], cli) -> None:
    from merge_fixtures import write_recipe

    recipe = write_recipe(tmp_path, teacher_dirs)
    (tmp_path / "yy.txt").write_bytes(LATIN1)
    code, stderr = cli(["merge", "prepare", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, [f"corpus {tmp_path / 'yy.txt'}", OFFSET])
    assert not (tmp_path / "run" / "examples" / "yy").exists()


@pytest.mark.parametrize(
    "name", ["pairwise_r2_test.csv", "fits.csv", "sweeps/length.csv", "summary.json", "config.yaml"]
)
def test_run_file_not_utf8_report(name: str, tmp_path: Path, cli) -> None:
    run = build_run(tmp_path / "run")
    path = run / name
    path.write_bytes(path.read_bytes()[:3] + b"\xe9" + path.read_bytes()[3:])
    before = digests(run)
    code, stderr = cli(["report", str(run)])
    assert_one_line(code, stderr, [str(path), OFFSET])
    after = digests(run)  # earlier files unchanged (figures may have been drawn), no page
    assert {k: after[k] for k in before} == before
    assert "report.html" not in after


def test_run_recipe_not_utf8_merge_evaluate(tmp_path: Path, cli) -> None:
    run = tmp_path / "run"
    (run / "examples").mkdir(parents=True)  # a run's: its copy of the recipe is read
    (run / "recipe.yaml").write_bytes(b"# " + LATIN1)
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert_one_line(code, stderr, [str(run / "recipe.yaml"), "byte 0xe9 at offset 5"])
    assert sorted(p.name for p in run.iterdir()) == ["examples", "recipe.yaml"]


def test_conllu_not_utf8(tmp_path: Path) -> None:
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.evaluate.conllu import read_conllu

    path = tmp_path / "x-ud-train.conllu"
    path.write_bytes(b"1\t" + LATIN1)
    with pytest.raises(UserInputError, match=r"x-ud-train.conllu is not UTF-8 text: byte 0xe9"):
        read_conllu(path)


def test_utf8_files_read_as_before(tmp_path: Path) -> None:
    """Byte-order marks and Windows line ends are read as the text-mode reader did."""
    from lmalgebra.sources.corpus import CorpusSpec, read_documents

    records = [{"text": "first doc"}, {"text": "second\u2028doc"}]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(r) for r in records).encode())
    txt = tmp_path / "c.txt"
    txt.write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n\r\nthree\r\n")
    csv = tmp_path / "c.csv"
    csv.write_bytes(b'text\r\n"multi\r\nline"\r\nplain\r\n')
    assert read_documents(CorpusSpec(paths=[str(jsonl)])) == ["first doc", "second\u2028doc"]
    assert read_documents(CorpusSpec(paths=[str(txt)])) == ["one\ntwo", "three"]
    assert read_documents(CorpusSpec(paths=[str(csv)])) == ["multi\r\nline", "plain"]


SEPARATORS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def test_a_line_is_parted_at_its_line_end_alone(tmp_path: Path) -> None:
    """A form feed, U+0085, U+2028 or another separator Python's ``splitlines`` parts at, inside
    a line of a ``.txt`` corpus or a CoNLL-U file (text copied from the web), had made two lines
    of it: a corpus of two lines read as more documents than it holds, a treebank's ``# text``
    comment as a malformed word line."""
    from lmalgebra.evaluate.conllu import read_conllu
    from lmalgebra.sources.corpus import CorpusSpec, read_documents

    lines = [f"one{sep}more" for sep in SEPARATORS]
    txt = tmp_path / "c.txt"
    txt.write_text("\n".join(lines) + "\r\nlast\n", encoding="utf-8")
    assert read_documents(CorpusSpec(paths=[str(txt)], doc_sep="line")) == [*lines, "last"]
    assert read_documents(CorpusSpec(paths=[str(txt)])) == [*lines, "last"]  # no blank line
    word = "\t".join(["1", "word", "_", "NOUN", *"______"])
    bank = tmp_path / "x-ud-train.conllu"
    bank.write_text(f"# text = {'word'.join(SEPARATORS)}\n{word}\n\n", encoding="utf-8")
    assert read_conllu(bank) == [[("word", "NOUN")]]
