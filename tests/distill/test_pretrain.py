"""`lmalgebra pretrain`: a teacher from scratch that a MergeDistill recipe accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForMaskedLM, AutoTokenizer

from lmalgebra.distill import pipeline
from lmalgebra.distill.examples import example_id, is_heldout
from lmalgebra.distill.recipe import load_recipe
from merge_fixtures import write_recipe
from tiny import documents


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pretrain")
    corpus = root / "fr.txt"
    corpus.write_text("\n".join(documents(80, seed=21)) + "\n", encoding="utf-8")
    out = root / "teacher-fr"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmalgebra",
            "pretrain",
            "masked",
            "--corpus.paths",
            str(corpus),
            "--language",
            "fr",
            "--tokenizer.vocab_size",
            "150",
            "--out",
            str(out),
            "--training.steps",
            "30",
            "--training.batch_size",
            "8",
            "--model.hidden_size",
            "32",
            "--model.num_layers",
            "1",
            "--example_length",
            "48",
            "--heldout_fraction",
            "0.2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return out, corpus


def test_pretrained_teacher_is_a_hugging_face_masked_lm(teacher) -> None:
    out, _ = teacher
    _, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"]
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == 150 and tokenizer.mask_token == "[MASK]"
    log = [json.loads(ln) for ln in (out / "training" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["mlm"] < log[0]["mlm"]  # it learned something
    assert all(r["kd"] == 0 and r["lambda"] == 0 for r in log)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "# fr teacher (lmalgebra pretrain masked)" in card and "WordPiece, 150 pieces" in card


def test_pretraining_holds_out_what_the_recipe_holds_out(teacher) -> None:
    out, corpus = teacher
    meta = json.loads((out / "lmalgebra.json").read_text())
    docs = [d.strip() for d in corpus.read_text().splitlines() if d.strip()]
    assert meta["examples"] == sum(not is_heldout(example_id("fr", d), 0.2) for d in docs)


def test_defaults_not_given_follow_the_steps_and_the_width(teacher) -> None:
    out, _ = teacher
    meta = json.loads((out / "lmalgebra.json").read_text())
    assert meta["training"]["warmup_steps"] == 3 and meta["training"]["checkpoint_every"] == 6
    assert meta["model"]["intermediate_size"] == 4 * 32


def test_the_pretrained_teacher_records_its_language(teacher) -> None:
    """What tells `merge evaluate` which scores against this teacher are comparable."""
    from lmalgebra.distill.masked.comparability import teacher_languages

    out, _ = teacher
    assert teacher_languages({"teacher-fr": str(out)}) == {"teacher-fr": frozenset({"fr"})}


def test_the_pretrained_teacher_passes_its_own_checksums(tmp_path: Path, cli) -> None:
    """Its ``lmalgebra.json`` lists the model's files alone: it had listed the output
    directory's lock file, which the run removes when it ends, so the teacher failed its own
    check (``... .lmalgebra.lock is missing``). Its tokenizer keeps no truncation from the
    examples training encoded."""
    import json

    from lmalgebra.distill.layout import model_damage, read_marker

    corpus = tmp_path / "fr.txt"
    corpus.write_text("\n".join(documents(40, seed=21)) + "\n", encoding="utf-8")
    out = tmp_path / "teacher"
    args = ["pretrain", "masked", "--corpus.paths", str(corpus), "--language", "fr"]
    args += ["--out", str(out), "--tokenizer.vocab_size", "120", "--model.hidden_size", "16"]
    args += ["--training.steps", "2", "--training.batch_size", "4", "--example_length", "32"]
    code, stderr = cli([*args, "--model.max_position_embeddings", "64", "--no-progress"])
    assert code == 0, stderr
    assert model_damage(out) is None
    assert all(not name.startswith(".") for name in read_marker(out)["files"])
    assert json.loads((out / "tokenizer.json").read_text())["truncation"] is None
    # the model's positions, as a causal teacher's and a student's (it had been 512 whatever
    # the positions: max(example_length, 512))
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 64


def test_recipe_accepts_the_pretrained_teacher(teacher, tmp_path: Path, teacher_dirs) -> None:
    out, _ = teacher
    recipe = load_recipe(write_recipe(tmp_path, {"wp": out, "sp": teacher_dirs["sp"]}))
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)  # no refusal: the head is trained and saved
    assert (recipe.output_dir / "topk" / "xx" / "wp" / "manifest.json").is_file()


def test_wordpiece_training_gives_the_same_vocabulary_in_every_process() -> None:
    """The `tokenizers` trainer numbers "##" pieces in hash order (a new order per process), which
    changes merges on ties; the toolkit's trainer must not."""
    code = (
        "import sys, hashlib; sys.path.insert(0, 'tests');"
        "from tiny import sentences;"
        "from lmalgebra.distill.vocab.tokenizer_trainers import train_wordpiece;"
        "t = train_wordpiece(sentences(400), 200, True, 128);"
        "print(hashlib.sha256(t.backend_tokenizer.to_str().encode()).hexdigest())"
    )
    root = Path(__file__).resolve().parents[2]
    digests = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
        ).stdout.split()[-1]
        for _ in range(4)
    }
    assert len(digests) == 1


def test_a_given_tokenizer_is_kept_as_is(
    tmp_path: Path, bert_dir: Path, teacher: tuple[Path, Path]
) -> None:
    """Teachers that share one tokenizer give students one vocabulary."""
    from lmalgebra.api.pretrain import MaskedPretrainSpec, pretrain
    from lmalgebra.core.errors import UserInputError

    _, corpus = teacher
    size = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    training = {"steps": 3, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 3}

    def spec(out: Path, tokenizer: Path) -> MaskedPretrainSpec:
        return MaskedPretrainSpec.model_validate(
            {
                "corpus": {"paths": [str(corpus)]},
                "language": "fr",
                "out": out,
                "example_length": 48,
                "tokenizer": {"path": str(tokenizer)},
                "model": size,
                "training": training,
            }
        )

    out = pretrain(spec(tmp_path / "t", bert_dir))
    given = AutoTokenizer.from_pretrained(bert_dir)
    made = AutoTokenizer.from_pretrained(out)
    assert made.get_vocab() == given.get_vocab()
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert model.config.vocab_size == len(given)
    with pytest.raises(UserInputError, match=r"tokenizer.path .*missing-dir"):
        pretrain(spec(tmp_path / "u", tmp_path / "missing-dir"))


def test_a_teacher_of_other_text_is_not_replaced_when_no_checkpoint_is_left(
    tmp_path: Path, cli
) -> None:
    """With ``keep_checkpoints 0`` the finished teacher kept no checkpoint whose record names
    an edited corpus: the same command then trained from step 0 on the edited text and replaced
    it, unsaid. It is refused, naming the change; nothing is touched."""
    from hostile_helpers import assert_one_line, digests

    corpus = tmp_path / "fr.txt"
    corpus.write_text("\n".join(documents(30, seed=21)) + "\n", encoding="utf-8")
    out = tmp_path / "teacher"
    args = ["pretrain", "masked", "--corpus.paths", str(corpus), "--language", "fr"]
    args += ["--out", str(out), "--tokenizer.vocab_size", "120", "--model.hidden_size", "16"]
    args += ["--training.steps", "2", "--training.batch_size", "4", "--example_length", "32"]
    args += ["--training.keep_checkpoints", "0", "--no-progress"]
    code, stderr = cli(args)
    assert code == 0, stderr
    before = digests(out)
    corpus.write_text("\n".join(documents(20, seed=21)) + "\n", encoding="utf-8")
    code, stderr = cli(args)
    assert_one_line(code, stderr, [f"{out} was made from other inputs (corpus text", "--restart"])
    assert digests(out) == before


def test_a_given_tokenizer_that_reads_the_text_as_unknown_is_named(
    tmp_path: Path, teacher_dirs, cli, caplog: pytest.LogCaptureFixture
) -> None:
    """``--tokenizer.path`` of a tokenizer that reads the language as its unknown token had a
    teacher trained to predict that token (loss 0.33 on it), unsaid."""
    corpus = tmp_path / "ru.txt"
    corpus.write_text("съешь же ещё этих мягких французских булок\n" * 20, encoding="utf-8")
    args = ["pretrain", "masked", "--corpus.paths", str(corpus), "--language", "ru"]
    args += ["--tokenizer.path", str(teacher_dirs["wp"]), "--out", str(tmp_path / "t")]
    args += ["--model.hidden_size", "16", "--training.steps", "1", "--example_length", "16"]
    caplog.set_level("WARNING", logger="lmalgebra")
    code, stderr = cli([*args, "--no-progress"])
    assert code == 0, stderr
    said = [r.getMessage() for r in caplog.records if "unknown token" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"tokenizer.path {teacher_dirs['wp']} reads 100%")
