"""UPOS evaluation: CoNLL-U reading, split discovery, macro-F1 parity, probe and fine-tune runs."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import random
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.evaluate.conllu import Sentence, find_splits, read_conllu, split_by_document
from lmalgebra.evaluate.pos_tagging import (
    PosOptions,
    PosResult,
    evaluate_many,
    evaluate_pos,
    macro_f1,
)
from lmalgebra.sources.models import ModelRef
from tiny import WORDS

ROW = "{id}\t{form}\t_\t{upos}\t_\t_\t_\t_\t_\t_"


def write_conllu(path: Path, sentences: list[Sentence]) -> None:
    """A minimal CoNLL-U file: ID, FORM and UPOS filled, the other columns ``_``."""
    lines = []
    for sentence in sentences:
        lines += [
            ROW.format(id=i, form=form, upos=upos) for i, (form, upos) in enumerate(sentence, 1)
        ]
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


TEXT = "\n".join(
    [
        "# sent_id = 1",
        "# text = Do rio, sim.",
        "1-2\tDo\t_\t_\t_\t_\t_\t_\t_\t_",
        ROW.format(id=1, form="De", upos="ADP"),
        ROW.format(id=2, form="o", upos="DET"),
        ROW.format(id=3, form="rio", upos="NOUN"),
        "3.1\tfoi\tir\tVERB\t_\t_\t_\t_\t_\t_",
        ROW.format(id=4, form=",", upos="PUNCT"),
        "",
        "# sent_id = 2",
        ROW.format(id=1, form="Sim", upos="INTJ"),
        "",
        "",
    ]
)
# tags by word: deterministic, NOUN the most frequent (the majority baseline)
TAGS = ["NOUN", "NOUN", "ADJ", "VERB", "DET", "ADP", "NOUN", "PROPN"]
TAG_OF = {word: TAGS[i % len(TAGS)] for i, word in enumerate(WORDS)}
FAST: dict[str, Any] = {"progress": False, "seed": 0}


def test_reader_skips_comments_multiword_ranges_and_empty_nodes(tmp_path: Path) -> None:
    path = tmp_path / "x.conllu"
    path.write_text("\ufeff" + TEXT, encoding="utf-8")  # a byte-order mark is tolerated
    assert read_conllu(path) == [
        [("De", "ADP"), ("o", "DET"), ("rio", "NOUN"), (",", "PUNCT")],
        [("Sim", "INTJ")],
    ]


def test_reader_round_trips_what_it_writes(tmp_path: Path) -> None:
    sentences = read_conllu(_write(tmp_path / "a.conllu", TEXT))
    write_conllu(tmp_path / "b.conllu", sentences)
    assert read_conllu(tmp_path / "b.conllu") == sentences


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\tDe\t_\tADP\t_\t_\t_\t_\t_", "expected 10 tab-separated fields, found 9"),
        ("1 De _ ADP _ _ _ _ _ _", "expected 10 tab-separated fields, found 1"),
        (ROW.format(id="x", form="De", upos="ADP"), "word id 'x' is not an integer"),
        (ROW.format(id="1a", form="De", upos="ADP"), "word id '1a' is not an integer"),
        (ROW.format(id=1, form="De", upos="_"), "word 1 \\('De'\\) has no UPOS tag"),
        (ROW.format(id=1, form="De", upos=""), "word 1 \\(.De.\\) has no UPOS tag"),
        (ROW.format(id=2, form="De", upos="ADP"), "word id 2 out of sequence \\(expected 1\\)"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path / "bad.conllu", f"# a comment\n{line}\n\n")
    with pytest.raises(UserInputError, match=f"{re.escape(str(path))}:2: {message}"):
        read_conllu(path)


def test_missing_or_empty_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"nope\.conllu does not exist"):
        read_conllu(tmp_path / "nope.conllu")
    with pytest.raises(UserInputError, match=r"empty\.conllu holds no sentences"):
        read_conllu(_write(tmp_path / "empty.conllu", "# only a comment\n\n"))


def test_find_splits_ud_and_plain_names(tmp_path: Path) -> None:
    ud, plain = tmp_path / "ud", tmp_path / "plain"
    for split in ("train", "dev", "test"):
        _write(ud / f"pt_petrogold-ud-{split}.conllu", TEXT)
        _write(plain / (split if split != "dev" else "dev.conllu"), TEXT)
    assert find_splits(ud).dev == ud / "pt_petrogold-ud-dev.conllu"
    found = find_splits(plain)
    assert (found.train, found.dev, found.test) == (
        plain / "train",
        plain / "dev.conllu",
        plain / "test",
    )


def test_missing_or_doubled_split_is_named(tmp_path: Path) -> None:
    for split in ("train", "test"):
        _write(tmp_path / f"xx-ud-{split}.conllu", TEXT)
    with pytest.raises(UserInputError, match=r"no dev split \(looked for \*-ud-dev\.conllu"):
        find_splits(tmp_path)
    _write(tmp_path / "dev.conllu", TEXT)
    _write(tmp_path / "xx-ud-dev.conllu", TEXT)
    with pytest.raises(UserInputError, match=r"several dev files \(dev\.conllu, xx-ud-dev"):
        find_splits(tmp_path)
    with pytest.raises(UserInputError, match="does not exist"):
        find_splits(tmp_path / "absent")


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_sklearn(seed: int) -> None:
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 6, size=300)
    pred = np.where(rng.random(300) < 0.6, gold, rng.integers(0, 8, size=300))  # 6, 7: not gold
    pred[gold == 5] = 0  # a gold tag never predicted scores 0
    expected = f1_score(gold, pred, average="macro", labels=np.unique(gold), zero_division=0)
    assert macro_f1(gold.tolist(), pred.tolist()) == pytest.approx(expected, abs=1e-12)
    tags = np.array(["NOUN", "VERB", "ADJ", "DET", "ADP", "X", "SYM", "NUM"])
    assert macro_f1(tags[gold], tags[pred]) == pytest.approx(expected, abs=1e-12)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _sentences(count: int, seed: int) -> list[list[tuple[str, str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        out.append([(word, TAG_OF[word]) for word in words])
    return out


@pytest.fixture(scope="module")
def treebank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 / 40 / 60 sentences of tiny.WORDS, each word with its one tag."""
    root = tmp_path_factory.mktemp("treebank")
    for split, count, seed in (("train", 200, 1), ("dev", 40, 2), ("test", 60, 3)):
        write_conllu(root / f"tiny-ud-{split}.conllu", _sentences(count, seed))
    return root


def _run(bert_dir: Path, treebank: Path, mode: Any, **options: Any) -> PosResult:
    splits = find_splits(treebank)
    ref = ModelRef(name="tiny", path=str(bert_dir))
    opts = PosOptions(**{**FAST, **options})
    return evaluate_pos(ref, splits.train, splits.dev, splits.test, mode, opts)


@pytest.fixture(scope="module")
def probe(bert_dir: Path, treebank: Path) -> PosResult:
    return _run(bert_dir, treebank, "probe")


def test_probe_beats_majority(probe: PosResult) -> None:
    # measured: accuracy 0.82, majority 0.38; the ceiling is below 1 because words sharing a
    # first subword of the 200-piece vocabulary look alike to a random-weight encoder
    assert probe.majority_accuracy == pytest.approx(0.38, abs=0.02)
    assert probe.accuracy > 0.7
    assert probe.macro_f1 > 0.6
    assert probe.test_words > 400 and probe.words_cut == 0 and probe.train_sentences == 200
    assert 1 <= probe.best_epoch <= 30


def test_probe_is_deterministic(bert_dir: Path, treebank: Path, probe: PosResult) -> None:
    again = _run(bert_dir, treebank, "probe")
    assert dataclasses.replace(again, seconds=0) == dataclasses.replace(probe, seconds=0)


def test_finetune_learns_and_is_deterministic(bert_dir: Path, treebank: Path) -> None:
    options = {"lr": 1e-3, "epochs": 2, "batch_size": 16}
    first = _run(bert_dir, treebank, "finetune", **options)
    # measured: 0.74 after two epochs (majority 0.38)
    assert first.accuracy > first.majority_accuracy + 0.2
    assert first.mode == "finetune" and first.best_epoch in (1, 2)
    again = _run(bert_dir, treebank, "finetune", **options)
    assert dataclasses.replace(again, seconds=0) == dataclasses.replace(first, seconds=0)


def test_truncation_counts_cut_words_and_caps_train(bert_dir: Path, treebank: Path) -> None:
    result = _run(bert_dir, treebank, "probe", max_length=8, epochs=2, max_train_sentences=50)
    assert result.words_cut > 0 and result.train_sentences == 50
    assert result.test_words < 482


def test_other_tokenizer_family_and_results_files(
    gpt2_dir: Path, treebank: Path, tmp_path: Path
) -> None:
    splits = find_splits(treebank)
    refs = [ModelRef(name="gpt2", path=str(gpt2_dir))]
    options = PosOptions(epochs=3, layer=1, progress=False)
    results = evaluate_many(refs, splits.train, splits.dev, splits.test, "probe", options, tmp_path)
    assert results[0].accuracy > results[0].majority_accuracy
    with (tmp_path / "pos_results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["model"] == "gpt2" and float(rows[0]["accuracy"]) == pytest.approx(
        results[0].accuracy, abs=1e-4
    )
    assert (tmp_path / "pos_results.md").read_text().startswith("| model | mode | layer |")
    assert (tmp_path / "pos_config.json").is_file()


def test_several_models_read_the_treebank_once_and_score_as_alone(
    bert_dir: Path, treebank: Path, probe: PosResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmalgebra.evaluate import pos_tagging

    read: list[Path] = []

    def counted(path: Path) -> Any:
        read.append(Path(path))
        return read_conllu(path)

    monkeypatch.setattr(pos_tagging, "read_conllu", counted)
    splits = find_splits(treebank)
    refs = [ModelRef(name="tiny", path=str(bert_dir)), ModelRef(name="again", path=str(bert_dir))]
    options = PosOptions(**FAST)
    results = evaluate_many(refs, splits.train, splits.dev, splits.test, "probe", options)
    assert sorted(read) == sorted([splits.train, splits.dev, splits.test])
    for result, name in zip(results, ("tiny", "again"), strict=True):
        assert dataclasses.replace(result, seconds=0) == dataclasses.replace(
            probe, model=name, seconds=0
        )


def test_an_interrupted_evaluation_resumes_with_the_models_it_finished(
    bert_dir: Path, treebank: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evaluate-pos`` stopped in its second model keeps the first model's result (at full
    precision, from ``pos_config.json``) and a rerun of the same evaluation evaluates only the
    second; other options keep nothing; a finished evaluation is computed again."""
    from lmalgebra.evaluate import pos_tagging
    from lmalgebra.evaluate.pos_results import RESULTS
    from lmalgebra.storage.csv_tables import read_table

    real = pos_tagging._evaluate
    calls: list[str] = []
    stop = {"b"}

    def counted(ref: ModelRef, *args: Any, **kwargs: Any) -> PosResult:
        calls.append(ref.name)
        if ref.name in stop:
            raise RuntimeError(f"stopped in {ref.name}")
        return real(ref, *args, **kwargs)

    monkeypatch.setattr(pos_tagging, "_evaluate", counted)
    refs = [ModelRef(name=name, path=str(bert_dir)) for name in ("a", "b")]
    options = PosOptions(**FAST, epochs=2)
    out = tmp_path / "pos"
    with pytest.raises(RuntimeError, match="stopped in b"):
        pos_tagging.evaluate_treebank(refs, treebank, "probe", options, out)
    assert calls == ["a", "b"]
    assert [r.model for r in read_table(out, RESULTS) or []] == ["a"]

    def kept(opts: PosOptions) -> dict[str, PosResult]:
        identity = pos_tagging.evaluation_identity(refs, find_splits(treebank), "probe", opts)
        return pos_tagging.finished_results(out, identity)

    first = kept(options)["a"]
    assert kept(PosOptions(**FAST, epochs=3)) == {}  # other options: nothing kept
    stop.clear()
    calls.clear()
    results = pos_tagging.evaluate_treebank(refs, treebank, "probe", options, out)
    assert calls == ["b"]
    assert results[0] == first  # the recorded result, seconds included
    assert dataclasses.replace(results[1], model="a", seconds=0) == dataclasses.replace(
        first, seconds=0
    )
    calls.clear()
    pos_tagging.evaluate_treebank(refs, treebank, "probe", options, out)
    assert calls == ["a", "b"]  # finished: computed again


def test_bad_options_layer_and_mode_are_named(bert_dir: Path, treebank: Path) -> None:
    with pytest.raises(UserInputError, match="epochs must be at least 1, got 0"):
        PosOptions(epochs=0)
    with pytest.raises(UserInputError, match="max_train_sentences must be at least 1"):
        PosOptions(max_train_sentences=0)
    with pytest.raises(UserInputError, match="lr must be positive"):
        PosOptions(lr=-1.0)
    with pytest.raises(UserInputError, match="layer 3 does not exist"):
        _run(bert_dir, treebank, "probe", layer=3)
    with pytest.raises(UserInputError, match="mode must be probe or finetune, got 'tune'"):
        _run(bert_dir, treebank, "tune")


def _petrogold_splits(root: Path) -> Path:
    """PetroGold (one file) split by document with the library's splitter."""
    spec = importlib.util.find_spec("dante")  # imported, the package needs pkg_resources
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("dante-corpora is not installed (pip install dante-corpora==2.0.5)")
    source = Path(next(iter(spec.submodule_search_locations))) / "data/petrogold/annotated.conllu"
    split_by_document(source, root, "pt_petrogold")
    return root


@pytest.mark.slow
def test_probe_on_petrogold_with_packaged_minilm(tmp_path: Path) -> None:
    from lmalgebra.sources.packaged import asset_path

    splits = find_splits(_petrogold_splits(tmp_path))
    ref = ModelRef(name="minilm", path=str(asset_path("minilm")))
    options = PosOptions(max_train_sentences=1000, max_eval_sentences=500, progress=False)
    started = time.perf_counter()
    result = evaluate_pos(ref, splits.train, splits.dev, splits.test, "probe", options)
    seconds = time.perf_counter() - started
    # measured: accuracy 0.75, macro-F1 0.63, majority 0.21, about 60 s on two CPU cores
    assert result.majority_accuracy < 0.25
    assert result.accuracy > 0.65 and result.macro_f1 > 0.5
    assert result.test_words > 10_000 and seconds < 600


def test_split_by_document_keeps_documents_whole(tmp_path: Path) -> None:
    blocks = []
    for doc in range(12):
        for sent in range(1, 3):
            blocks.append(
                f"# sent_id = doc{doc:02d}-{sent}\n1\tWord\tword\tNOUN\t_\t_\t0\troot\t_\t_"
            )
    source = tmp_path / "one.conllu"
    source.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    splits = split_by_document(source, tmp_path / "out", "xx")
    seen: dict[str, str] = {}
    for split in ("train", "dev", "test"):
        text = getattr(splits, split).read_text(encoding="utf-8")
        for doc in {
            line.split("= ")[1].rsplit("-", 1)[0]
            for line in text.splitlines()
            if line.startswith("# sent_id")
        }:
            assert seen.setdefault(doc, split) == split
        assert len(read_conllu(getattr(splits, split))) > 0
    assert sorted(seen.values()).count("test") == 2 and sorted(seen.values()).count("dev") == 2
    assert find_splits(tmp_path / "out").test == splits.test
    source.write_text("1\tWord\tword\tNOUN\t_\t_\t0\troot\t_\t_\n\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="sentence 1 has no '# sent_id"):
        split_by_document(source, tmp_path / "bad")


def test_a_model_name_keeps_its_row_of_the_markdown_table(tmp_path: Path) -> None:
    """A model is named as given: ``x|y`` (or a name with a line break) had split its row of
    ``pos_results.md`` into more cells than the table has columns."""
    from dataclasses import fields

    from lmalgebra.evaluate.pos_results import write_results

    zeros = dict.fromkeys((f.name for f in fields(PosResult)), 0)
    results = [PosResult(**zeros | {"model": name, "mode": "probe"}) for name in ("x|y", "a\nb")]
    write_results(results, tmp_path)
    header, _, *rows = (tmp_path / "pos_results.md").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 2
    for row in rows:
        assert row.replace("\\|", "").count("|") == header.count("|")
    assert rows[0].startswith("| x\\|y | probe |") and rows[1].startswith("| a b | probe |")


def test_a_tag_outside_ud_or_unseen_in_train_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tag outside UD's 17 (a typo, ``FOO``) became a class of its own, and a test tag train
    never shows cost macro-F1 an F1 of 0, both without a word: each is named in the log."""
    from lmalgebra.evaluate.pos_tagging import _load_splits

    plain = [[("river", "NOUN"), ("runs", "VERB")]]
    write_conllu(tmp_path / "t-ud-train.conllu", [[("river", "FOO"), ("runs", "VERB")]])
    write_conllu(tmp_path / "t-ud-dev.conllu", plain)
    write_conllu(tmp_path / "t-ud-test.conllu", [[("oh", "INTJ"), ("runs", "VERB")]])
    splits = find_splits(tmp_path)
    with caplog.at_level("WARNING"):
        _load_splits(splits.train, splits.dev, splits.test, PosOptions())
    warned = " | ".join(r.getMessage() for r in caplog.records)
    assert "tags outside UD's 17 UPOS tags, each read as a class of its own: FOO (1 word)" in warned
    assert "test tags that train never shows" in warned and "INTJ (1 word)" in warned
    assert "NOUN" not in warned  # in dev, not in test: nothing to say
