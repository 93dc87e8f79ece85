"""Every corpus format of ``read_documents``, and every kind of bad input it must refuse clearly."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.sources.corpus import CorpusSpec, read_documents

DOCS = [
    "The river runs north past the old city.",
    "A queen, a king and a tower:\nthe history of a small island.",
    'Music and "film" in the early century; science, too.',
]


def read(*paths: Path, **options: object) -> list[str]:
    return read_documents(CorpusSpec(paths=[str(p) for p in paths], **options))


def refused(*paths: Path, **options: object) -> str:
    """The message of the UserInputError that reading ``paths`` raises."""
    with pytest.raises(UserInputError) as info:
        read(*paths, **options)
    return str(info.value)


def write_stream(path: Path, table: pa.Table) -> None:
    """An Arrow IPC stream file, the format ``datasets.Dataset.save_to_disk`` writes."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def save_dataset(directory: Path, tables: list[pa.Table]) -> Path:
    """A ``save_to_disk`` directory (state.json + data-*.arrow), without the datasets library."""
    directory.mkdir(parents=True)
    files = []
    for index, table in enumerate(tables):
        name = f"data-{index:05d}-of-{len(tables):05d}.arrow"
        write_stream(directory / name, table)
        files.append({"filename": name})
    state = {"_data_files": files, "_fingerprint": "0123456789abcdef", "_split": None}
    (directory / "state.json").write_text(json.dumps(state))
    (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return directory


def text_table(texts: list[object], column: str = "text") -> pa.Table:
    return pa.table({column: texts, "id": list(range(len(texts)))})


# --- .txt -----------------------------------------------------------------------------------


def test_txt_one_document_per_line(tmp_path: Path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("first doc\nsecond doc\nthird doc\n", encoding="utf-8")
    assert read(path) == ["first doc", "second doc", "third doc"]
    assert read(path, doc_sep="line") == ["first doc", "second doc", "third doc"]


def test_txt_blank_line_separated_auto(tmp_path: Path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("a one\na two\n\n\n\nb one\n  \t \nc one\nc two\n", encoding="utf-8")
    # runs of blank (or whitespace-only) lines separate documents; no empty documents appear
    assert read(path) == ["a one\na two", "b one", "c one\nc two"]
    assert read(path, doc_sep="blank") == read(path)


def test_txt_line_mode_ignores_blank_lines_as_separators(tmp_path: Path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("a one\na two\n\nb one\n", encoding="utf-8")
    assert read(path, doc_sep="line") == ["a one", "a two", "b one"]


def test_txt_blank_mode_without_blank_lines_is_one_document(tmp_path: Path) -> None:
    path = tmp_path / "docs.txt"
    path.write_text("x\ny\nz\n", encoding="utf-8")
    assert read(path, doc_sep="blank") == ["x\ny\nz"]


def test_txt_crlf_and_unicode(tmp_path: Path) -> None:
    path = tmp_path / "docs.text"
    path.write_bytes("Ça va?\r\nnaïve café\r\n\r\n日本語の文\r\n".encode())
    assert read(path) == ["Ça va?\nnaïve café", "日本語の文"]


def test_txt_without_suffix_is_text(tmp_path: Path) -> None:
    path = tmp_path / "README"
    path.write_text("only\nlines\n", encoding="utf-8")
    assert read(path) == ["only", "lines"]


def test_several_paths_are_read_in_order(tmp_path: Path) -> None:
    first, second = tmp_path / "b.txt", tmp_path / "a.jsonl"
    first.write_text("one\ntwo\n", encoding="utf-8")
    second.write_text(json.dumps({"text": "three"}) + "\n", encoding="utf-8")
    assert read(first, second) == ["one", "two", "three"]
    assert read(second, first) == ["three", "one", "two"]


# --- .jsonl / .json / .csv / .parquet -------------------------------------------------------


def test_jsonl_named_column(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    rows = [{"body": d, "text": "wrong column"} for d in DOCS]
    rows.insert(1, {"body": "", "text": "empty body is dropped"})
    rows.insert(2, {"body": None, "text": "null body is dropped"})
    lines = [json.dumps(r) for r in rows]
    lines.insert(3, "   ")  # blank lines between records are allowed
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read(path, text_column="body") == DOCS
    assert read(path) == [
        "wrong column",
        "empty body is dropped",
        "null body is dropped",
        "wrong column",
        "wrong column",
    ]


def test_json_list_of_records(tmp_path: Path) -> None:
    path = tmp_path / "docs.json"
    path.write_text(json.dumps([{"content": d, "n": i} for i, d in enumerate(DOCS)]))
    assert read(path, text_column="content") == DOCS


def test_json_mapping_title_to_record(tmp_path: Path) -> None:
    path = tmp_path / "docs.json"
    data = {f"Title {i}": {"text": d, "url": f"u{i}"} for i, d in enumerate(DOCS)}
    path.write_text(json.dumps(data, indent=2))
    assert read(path) == DOCS


def test_csv_named_column(tmp_path: Path) -> None:
    path = tmp_path / "docs.CSV"  # the suffix is matched case-insensitively
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "article", "other"])
        for i, d in enumerate(DOCS):
            writer.writerow([i, d, "x"])
        writer.writerow([99, "", "empty article is dropped"])
    # quoted commas, quotes and newlines survive
    assert read(path, text_column="article") == DOCS


def test_parquet_named_column(tmp_path: Path) -> None:
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"passage": [*DOCS, None, ""], "n": [1, 2, 3, 4, 5]}), path)
    assert read(path, text_column="passage") == DOCS


# --- saved datasets -------------------------------------------------------------------------


def test_saved_dataset_directory(tmp_path: Path) -> None:
    directory = save_dataset(tmp_path / "ds", [text_table(DOCS)])
    assert read(directory) == DOCS


def test_saved_dataset_several_arrow_files_in_order(tmp_path: Path) -> None:
    directory = save_dataset(
        tmp_path / "ds", [text_table(DOCS[:2], "body"), text_table([DOCS[2], None], "body")]
    )
    assert read(directory, text_column="body") == DOCS


def test_saved_dataset_dict_splits(tmp_path: Path) -> None:
    root = tmp_path / "dd"
    save_dataset(root / "train", [text_table(DOCS[:2])])
    save_dataset(root / "test", [text_table(DOCS[2:])])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert read(root) == DOCS[:2]  # default split: train
    assert read(root, split="test") == DOCS[2:]
    message = refused(root, split="validation")
    assert "'validation'" in message
    assert "train" in message
    assert "test" in message


# --- bad input ------------------------------------------------------------------------------


def test_no_paths() -> None:
    with pytest.raises(UserInputError, match="no corpus given"):
        read_documents(CorpusSpec(paths=[]))


def test_missing_file(tmp_path: Path) -> None:
    message = refused(tmp_path / "nowhere.txt")
    assert "nowhere.txt" in message
    assert "does not exist" in message


def test_missing_second_file_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("fine\n", encoding="utf-8")
    message = refused(good, tmp_path / "gone.jsonl")
    assert "gone.jsonl" in message
    assert "good.txt" not in message


@pytest.mark.parametrize("name", ["empty.txt", "empty.jsonl", "empty"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"")
    message = refused(path)
    assert str(path) in message
    assert "no text" in message


@pytest.mark.parametrize("doc_sep", ["auto", "line", "blank"])
def test_only_blank_lines(tmp_path: Path, doc_sep: str) -> None:
    path = tmp_path / "blank.txt"
    path.write_text("\n   \n\t\n\n", encoding="utf-8")
    message = refused(path, doc_sep=doc_sep)
    assert str(path) in message
    assert "no text" in message


def test_records_with_only_empty_text(tmp_path: Path) -> None:
    path = tmp_path / "hollow.jsonl"
    path.write_text('{"text": ""}\n{"text": "   "}\n{"text": null}\n', encoding="utf-8")
    message = refused(path)
    assert str(path) in message
    assert "no text" in message


def _write_jsonl(path: Path) -> None:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")


def _write_json(path: Path) -> None:
    path.write_text(json.dumps([{"text": d} for d in DOCS]), encoding="utf-8")


def _write_csv(path: Path) -> None:
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([["text"], *([d] for d in DOCS)])


def _write_parquet(path: Path) -> None:
    pq.write_table(text_table(DOCS), path)


@pytest.mark.parametrize(
    ("name", "writer"),
    [
        ("c.jsonl", _write_jsonl),
        ("c.json", _write_json),
        ("c.csv", _write_csv),
        ("c.parquet", _write_parquet),
        ("ds", lambda p: save_dataset(p, [text_table(DOCS)])),
    ],
)
def test_missing_column_is_named(tmp_path: Path, name: str, writer: object) -> None:
    path = tmp_path / name
    writer(path)  # type: ignore[operator]
    assert read(path) == DOCS
    message = refused(path, text_column="abstract")
    assert "'abstract'" in message
    assert str(path) in message
    assert (
        "text" in message.split("'abstract'", 1)[1]
    )  # the fields that are there, for every format
    assert "corpus.text_column" in message


def test_missing_column_in_a_later_jsonl_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok too"}\n{"body": "no text"}\n', encoding="utf-8")
    message = refused(path)
    assert f"{path}:3" in message
    assert "'text'" in message


def test_invalid_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "fine"}\n\n{"text": "unterminated\n{"text": "x"}\n', encoding="utf-8")
    message = refused(path)
    assert f"{path}:3" in message  # the blank line 2 still counts
    assert "JSON" in message


def test_invalid_json_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": }\n]\n', encoding="utf-8")
    message = refused(path)
    assert str(path) in message
    assert "line 3" in message


def test_json_of_the_wrong_shape(tmp_path: Path) -> None:
    path = tmp_path / "scalar.json"
    path.write_text(json.dumps("just a string"), encoding="utf-8")
    message = refused(path)
    assert str(path) in message
    assert "list of records" in message


@pytest.mark.parametrize("name", ["docs.xml", "docs.tsv", "docs.txt.gz"])
def test_unknown_extension(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("some text\n", encoding="utf-8")
    message = refused(path)
    assert str(path) in message
    assert repr(path.suffix) in message
    assert ".jsonl" in message  # the message lists what is supported


@pytest.mark.parametrize("name", ["latin1.txt", "latin1.jsonl", "latin1.csv", "latin1.json"])
def test_non_utf8_bytes(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name.endswith(".txt"):
        body = "caf\xe9 au lait\nna\xefve\n"
    elif name.endswith(".csv"):
        body = "text\ncaf\xe9 au lait\n"
    elif name.endswith(".json"):
        body = '[{"text": "caf\xe9"}]'
    else:
        body = '{"text": "fine"}\n{"text": "caf\xe9"}\n'
    path.write_bytes(body.encode("latin-1"))
    message = refused(path)
    assert str(path) in message
    assert "UTF-8" in message


def test_unreadable_parquet(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text("this is not parquet\n", encoding="utf-8")
    message = refused(path)
    assert str(path) in message
    assert "Parquet" in message


def test_directory_that_is_not_a_dataset(tmp_path: Path) -> None:
    directory = tmp_path / "just_a_dir"
    directory.mkdir()
    (directory / "notes.txt").write_text("hello\n", encoding="utf-8")
    message = refused(directory)
    assert str(directory) in message
    assert "state.json" in message


# --- bugs -----------------------------------------------------------------------------------


def test_csv_with_utf8_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("text,id\r\nhello world,1\r\nsecond row,2\r\n".encode("utf-8-sig"))
    assert read(path) == ["hello world", "second row"]


@pytest.mark.parametrize("damage", ["missing_arrow_file", "corrupt_state_json", "not_a_stream"])
def test_damaged_saved_dataset(tmp_path: Path, damage: str) -> None:
    directory = save_dataset(tmp_path / "ds", [text_table(DOCS)])
    arrow = directory / "data-00000-of-00001.arrow"
    if damage == "missing_arrow_file":
        arrow.unlink()
    elif damage == "corrupt_state_json":
        (directory / "state.json").write_text('{"_data_files": [', encoding="utf-8")
    else:
        arrow.write_bytes(b"definitely not an arrow stream")
    message = refused(directory)
    assert str(directory) in message


def test_languages_from_entries_and_from_a_field(tmp_path: Path):
    from lmalgebra.sources.corpus import documents_by_language

    (tmp_path / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("trois\n", encoding="utf-8")
    spec = CorpusSpec(paths=[f"en={tmp_path / 'a.txt'}", f"fr={tmp_path / 'b.txt'}"])
    assert documents_by_language(spec) == {"en": ["one", "two"], "fr": ["trois"]}
    assert read_documents(spec) == ["one", "two", "trois"]
    rows = [
        {"text": "hola", "lang": "es"},
        {"text": "", "lang": "es"},
        {"text": "hi", "lang": "en"},
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    field = CorpusSpec(paths=[str(tmp_path / "c.jsonl")], language_column="lang")
    assert documents_by_language(field) == {"es": ["hola"], "en": ["hi"]}
    with pytest.raises(UserInputError, match="LANG=PATH"):
        documents_by_language(CorpusSpec(paths=[str(tmp_path / "a.txt")]))


@pytest.mark.parametrize("code", ["ünï", "a" * 101, ".x"])
def test_a_corpus_of_no_language_code_says_what_one_is(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ünï=corpus.txt`` (its file there) had been refused as "corpus ünï=corpus.txt does not
    exist", the rule that made it a file's name unsaid."""
    from lmalgebra.sources.corpus import corpus_paths

    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text("one\n", encoding="utf-8")
    with pytest.raises(
        UserInputError, match=rf"'{code}' is no language code of LANG=PATH: 1 to 100 ASCII"
    ):
        corpus_paths(CorpusSpec(paths=[f"{code}=corpus.txt"]))
    with pytest.raises(UserInputError, match=r"nofile\.txt does not exist$"):
        corpus_paths(CorpusSpec(paths=["fr=nofile.txt"]))
    # no '=' at all: a missing file alone (it had been told it is no language code)
    with pytest.raises(UserInputError, match=r"corpus /nope/x\.txt does not exist$"):
        corpus_paths(CorpusSpec(paths=["/nope/x.txt"]))


def test_a_language_code_of_a_recipe_is_one_of_lang_path_too(tmp_path: Path) -> None:
    """A recipe's language code may start with a digit or hold a '.' (``1x``, ``zh.hant``);
    ``1x=a.txt`` had been read as a file of that name, and ``zh.hant=b.txt`` refused."""
    from lmalgebra.sources.corpus import documents_by_language

    (tmp_path / "a.txt").write_text("one\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("two\n", encoding="utf-8")
    spec = CorpusSpec(paths=[f"1x={tmp_path / 'a.txt'}", f"zh.hant={tmp_path / 'b.txt'}"])
    assert documents_by_language(spec) == {"1x": ["one"], "zh.hant": ["two"]}


def test_a_corpus_entry_of_another_language_is_refused(tmp_path: Path) -> None:
    """``fr=a.txt`` in the corpus of ``xx`` (a recipe's language, a pretrained teacher's) had
    its label dropped and its text read as xx's."""
    from lmalgebra.distill.pretrain.specs import CausalPretrainSpec

    (tmp_path / "a.txt").write_text("some text\\n", encoding="utf-8")
    entry = f"fr={tmp_path / 'a.txt'}"
    said = rf"language 'xx': corpus entry '{entry}' is labelled 'fr': its text would be read as"
    with pytest.raises(UserInputError, match=said):
        CausalPretrainSpec(
            corpus={"paths": [entry]},
            language="xx",
            out=tmp_path / "t",
            tokenizer={"vocab_size": 300},
        )
    same = CausalPretrainSpec(
        corpus={"paths": [f"xx={tmp_path / 'a.txt'}"]},
        language="xx",
        out=tmp_path / "t",
        tokenizer={"vocab_size": 300},
    )
    assert same.language == "xx"


def test_a_language_code_as_long_as_a_recipes_labels_its_corpus() -> None:
    """``LANG=PATH`` took codes of up to 16 characters where a merge recipe's language codes
    may have 100: a longer code's entry was read as a file's name."""
    from lmalgebra.sources.corpus import split_language

    code = "x" + "y" * 40
    assert split_language(f"{code}=corpus.txt") == (code, "corpus.txt")
    assert split_language(f"{'x' * 101}=corpus.txt") == (None, f"{'x' * 101}=corpus.txt")
