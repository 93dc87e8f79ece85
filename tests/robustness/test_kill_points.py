"""Every command that writes more than one file, stopped at each of its write points, resumes.

A command killed between two of its writes (``evaluate-pos`` between its table and its record)
could leave a directory the same command then refused. Here each command that writes more than
one file is stopped at its write points (``kill_helpers``: a Ctrl-C before the write, in this
process, and a ``kill -9`` just after it, in a forked child), run again, and must exit 0 without
a traceback, leaving what an uninterrupted run leaves, file for file (the run directory and the
cache; timings aside: ``kill_helpers.steady``).

Points tried (``kill_helpers.chosen_points``): every one for a command of at most 12 write
points; for more, the first two, the last two and two drawn with the command's name as seed;
``slow`` runs (``make test-slow``) stop each command at every one of its points. Each stage
starts from the state the stages before it leave, built once per module on the tiny fixtures
(two masked teachers, three causal ones, two tiny BERTs), with two shards per shard set.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
from hostile_helpers import one_word_treebank
from kill_helpers import check_resumes, demo_steady
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe
from tiny import documents

CAUSAL_TRAINING = {
    "steps": 4,
    "batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 0,
    "log_every": 1,
    "checkpoint_every": 2,
    "seed": 3,
    "objective_mix": {"mined_kl": 0.5, "uld": 0.5, "alm": 1.0, "sampled": 0.5},
}


@dataclass
class Run:
    """A merge run at ``root / "run"`` (its cache at ``root / "cache"``), with its state after
    each stage kept aside, so that each test starts from the stage before its command."""

    root: Path
    recipe: Path
    stages: tuple[str, ...]

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def outputs(self) -> list[Path]:
        return [self.run, self.cache]

    def after(self, stage: str | None) -> None:
        """The run as it is after ``stage`` (None: before anything ran)."""
        for output in self.outputs:
            shutil.rmtree(output, ignore_errors=True)
        if stage is None:
            return
        kept = self.root / f"after-{stage}"
        if not kept.exists():
            self._build(stage)
            for output in self.outputs:
                if output.exists():
                    shutil.copytree(output, kept / output.name, symlinks=True)
            kept.mkdir(exist_ok=True)
        for output in self.outputs:
            shutil.rmtree(output, ignore_errors=True)
            if (kept / output.name).exists():
                shutil.copytree(kept / output.name, output, symlinks=True)

    def _build(self, stage: str) -> None:
        from lmalgebra.distill import pipeline
        from lmalgebra.distill.recipe import load_recipe

        before = self.stages[self.stages.index(stage) - 1] if stage != self.stages[0] else None
        self.after(before)
        recipe = load_recipe(self.recipe)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("LMALGEBRA_CACHE", str(self.cache))
            if stage == "train":
                pipeline.train_student(recipe, "student", None, progress=False)
            else:
                pipeline.run_stages(recipe, [stage], progress=False)  # type: ignore[list-item]


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Run:
    root = tmp_path_factory.mktemp("kill-masked")
    recipe = write_recipe(
        root, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING, shard_rows=32
    )
    return Run(root, recipe, ("prepare", "teach", "vocab", "train"))


@pytest.fixture(scope="module")
def causal(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs: dict[str, Path]) -> Run:
    root = tmp_path_factory.mktemp("kill-causal")
    recipe = write_causal_recipe(
        root,
        causal_teacher_dirs,
        student=CAUSAL_STUDENT,
        training=CAUSAL_TRAINING,
        shard_rows=24,
        heldout_fraction=0.3,
    )
    return Run(root, recipe, ("prepare", "teach", "train"))


@pytest.fixture(params=["sampled", pytest.param("every", marks=pytest.mark.slow)])
def resumes(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Callable[..., dict[str, Any]]]:
    """``resumes(ARGS, OUTPUTS)``: ``kill_helpers.check_resumes`` of the command, at the points
    it samples (every one of a command of at most six, else the first two, the last two and two
    drawn between), or (``slow``) at every point."""
    depth = {"every_up_to": 10**6} if request.param == "every" else {"every_up_to": 6, "sampled": 2}

    def check(args: list[str], outputs: list[Path], **options: Any) -> dict[str, Any]:
        found = check_resumes(args, outputs, tmp_path, monkeypatch, capsys, **depth, **options)
        print(f"{' '.join(args[:2])}: {found['points']} write points, tried {found['tried']}")
        return found

    yield check


def _use_cache(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(run.cache))


MASKED_COMMANDS = [
    ("prepare", None),
    ("teach", "prepare"),
    ("vocab", "teach"),
    ("train", "vocab"),
]


@pytest.mark.parametrize(("command", "before"), MASKED_COMMANDS)
def test_masked_merge_stage(
    command: str, before: str | None, masked: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    masked.after(before)
    _use_cache(masked, monkeypatch)
    progress = [] if command == "vocab" else ["--no-progress"]  # vocab shows no progress
    resumes(["merge", command, str(masked.recipe), *progress], masked.outputs)


def test_masked_train_keeping_no_checkpoint(
    masked: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``training.keep_checkpoints 0``: the model saved, then its checkpoint removed."""
    masked.after("vocab")
    _use_cache(masked, monkeypatch)
    args = ["merge", "train", str(masked.recipe), "--no-progress"]
    resumes([*args, "--training.keep_checkpoints", "0"], masked.outputs)


def test_masked_train_restarted_with_no_step(
    masked: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--restart --training.steps 0`` over a trained student: its checkpoints and log
    dropped, then the model as it starts saved."""
    masked.after("train")
    _use_cache(masked, monkeypatch)
    args = ["merge", "train", str(masked.recipe), "--no-progress", "--restart"]
    resumes([*args, "--training.steps", "0"], masked.outputs)


def test_masked_merge_evaluate(masked: Run, resumes, monkeypatch: pytest.MonkeyPatch) -> None:
    masked.after("train")
    _use_cache(masked, monkeypatch)
    resumes(["merge", "evaluate", str(masked.run)], masked.outputs)


def test_masked_merge_evaluate_of_one_language(
    masked: Run, resumes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over a finished evaluation, whose rows of the other language it keeps: the record of
    the rows goes first, the tables are made from it."""
    from hostile_helpers import run_cli

    masked.after("train")
    _use_cache(masked, monkeypatch)
    code, stderr = run_cli(["merge", "evaluate", str(masked.run)], monkeypatch, capsys)
    assert code == 0, stderr
    resumes(["merge", "evaluate", str(masked.run), "--languages", "yy"], masked.outputs)


CAUSAL_COMMANDS = [("prepare", None), ("teach", "prepare"), ("train", "teach")]


@pytest.mark.parametrize(("command", "before"), CAUSAL_COMMANDS)
def test_causal_merge_stage(
    command: str, before: str | None, causal: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    causal.after(before)
    _use_cache(causal, monkeypatch)
    resumes(["merge", command, str(causal.recipe), "--no-progress"], causal.outputs)


def test_causal_train_of_the_model_as_it_starts(
    causal: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # steps 0 writes no training log: a save of the untrained model cut short is still known as
    # the student's (it had been refused as a model lmalgebra did not write)
    causal.after("teach")
    _use_cache(causal, monkeypatch)
    args = ["merge", "train", str(causal.recipe), "--name", "untrained", "--training.steps", "0"]
    resumes([*args, "--no-progress"], causal.outputs)


@pytest.mark.slow  # its best weights' writes alone: tests/distill/test_causal_validation.py
def test_causal_train_keeping_its_best_validation_weights(
    causal: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``best/`` replaced by a new best, then the checkpoint recording it: a run stopped in
    between had refused to resume (weights of no record, or a best after its checkpoint)."""
    causal.after("teach")
    _use_cache(causal, monkeypatch)
    args = ["merge", "train", str(causal.recipe), "--no-progress"]
    args += ["--training.validation_fraction", "0.3", "--training.validation_every", "2"]
    resumes(args, causal.outputs)


def test_causal_prepare_writing_teacher_text(
    tmp_path_factory: pytest.TempPathFactory,
    causal_teacher_dirs: dict[str, Path],
    resumes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``merge prepare`` of a recipe whose teacher writes text for a language (``teacher_text``:
    the text's shards and record, then the examples that join it)."""
    root = tmp_path_factory.mktemp("kill-teacher-text")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(documents(8, seed=77)) + "\n", encoding="utf-8")
    text = {"teacher": "bl", "documents": 6, "new_tokens": 4, "batch_size": 4, "prompt_chars": 30}
    text["prompts"] = {"paths": [str(prompts)]}
    recipe = write_causal_recipe(
        root, causal_teacher_dirs, student=CAUSAL_STUDENT, shard_rows=24, teacher_text={"xx": text}
    )
    run = Run(root, recipe, ("prepare",))
    _use_cache(run, monkeypatch)
    resumes(["merge", "prepare", str(recipe), "--no-progress"], run.outputs)


CANDIDATES = ["--training.lambda_schedule", "constant", "--training.validation_every", "2"]
CANDIDATES += ["--training.validation_fraction", "0.3", "--training.objective_mix", "{alm: 1.0}"]


@pytest.mark.slow  # two runs of training, each stopped at its writes
def test_causal_train_of_lambda_candidates(
    causal: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A student trained at two ``lambda_candidates`` (a run each in ``lambda-W/``, then the
    best of them saved as the student)."""
    causal.after("teach")
    _use_cache(causal, monkeypatch)
    args = ["merge", "train", str(causal.recipe), "--no-progress", *CANDIDATES]
    resumes([*args, "--training.lambda_candidates", "0.2,0.8"], causal.outputs)


@pytest.mark.slow  # a run of training stopped at its writes
def test_causal_train_restarted_with_fewer_lambda_candidates(
    causal: Run, resumes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--restart`` with one of two ``lambda_candidates``: the dropped candidate's run removed,
    then the other trained again from step 0."""
    from hostile_helpers import run_cli

    causal.after("teach")
    _use_cache(causal, monkeypatch)
    args = ["merge", "train", str(causal.recipe), "--no-progress", *CANDIDATES]
    code, stderr = run_cli([*args, "--training.lambda_candidates", "0.2,0.8"], monkeypatch, capsys)
    assert code == 0, stderr
    args += ["--restart", "--training.lambda_candidates", "0.8"]
    found = resumes(args, causal.outputs)
    assert not (causal.run / "student" / "lambda-0.2").exists(), found


@pytest.mark.parametrize("command", ["evaluate", "bits-per-byte"])
def test_causal_merge_scores(
    command: str, causal: Run, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scored on one language (``yy``, one teacher): LMD coverage embeds with every model."""
    causal.after("train")
    _use_cache(causal, monkeypatch)
    resumes(["merge", command, str(causal.run), "--languages", "yy"], causal.outputs)


@pytest.mark.slow  # each of its stages is stopped by the default run (test_masked_merge_stage)
def test_merge_run(masked: Run, resumes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage before training in one command."""
    masked.after(None)
    _use_cache(masked, monkeypatch)
    resumes(["merge", "run", str(masked.recipe), "--no-progress"], masked.outputs)


@pytest.mark.slow  # an experimental command: stopped only by the slow run
def test_experimental_select(
    teacher_dirs: dict[str, Path], tmp_path: Path, resumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The teacher sets ranked, the recommended recipe and the figure (``selection/``)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "xx.txt"
    corpus.write_text("\n".join(documents(160, seed=21)) + "\n", encoding="utf-8")
    recipe = write_recipe(tmp_path, teacher_dirs, heldout_fraction=0.5)
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data["languages"] = {"xx": {"corpus": {"paths": [str(corpus)]}, "teachers": ["wp", "sp"]}}
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    args = ["experimental", "select", str(recipe), "--spans.counts", "40,10,10", "-T", "8"]
    resumes([*args, "--no-progress"], [tmp_path / "run", tmp_path / "cache"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kill-corpus") / "xx.txt"
    path.write_text("\n".join(documents(60, seed=21)) + "\n", encoding="utf-8")
    return path


PRETRAIN = {
    "masked": ["--tokenizer.vocab_size", "120", "--model.hidden_size", "16"],
    "causal": ["--tokenizer.vocab_size", "300", "--model.hidden_size", "16"],
    "head-only": [],
}


@pytest.mark.parametrize("kind", list(PRETRAIN))
def test_pretrain(
    kind: str, corpus: Path, bert_dir: Path, tmp_path: Path, resumes, monkeypatch
) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out" / "teacher"
    args = ["pretrain", kind, "--corpus.paths", str(corpus), "--language", "xx", "--out", str(out)]
    args += ["--training.steps", "4", "--training.batch_size", "4", "--example_length", "32"]
    args += ["--training.checkpoint_every", "2", "--training.warmup_steps", "1", "--no-progress"]
    if kind == "head-only":
        args += ["--encoder", str(bert_dir)]
    resumes([*args, *PRETRAIN[kind]], [tmp_path / "out", tmp_path / "cache"])


def _decompose(bert_dir: Path, bert2_dir: Path, corpus: Path) -> list[str]:
    args = ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    return [*args, "--corpus.paths", str(corpus), "-T", "8", "--spans.counts", "20,5,5"]


def test_decompose(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, resumes, monkeypatch
) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["decompose", *_decompose(bert_dir, bert2_dir, corpus_txt)]
    resumes(
        [*args, "--out", str(tmp_path / "out"), "--no-progress"],
        [tmp_path / "out", tmp_path / "cache"],
    )


def test_decompose_overwriting_another_run(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    resumes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--overwrite`` of a finished run of another configuration, its report drawn into it:
    the old run's files removed (what tells its kind last), then the new run written."""
    from hostile_helpers import run_cli

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["decompose", *_decompose(bert_dir, bert2_dir, corpus_txt), "--no-progress"]
    out = ["--out", str(tmp_path / "out")]
    code, stderr = run_cli([*args, *out], monkeypatch, capsys)
    assert code == 0, stderr
    code, stderr = run_cli(["report", str(tmp_path / "out")], monkeypatch, capsys)
    assert code == 0, stderr
    found = resumes(
        [*args, *out, "--alpha", "0.5", "--overwrite"], [tmp_path / "out", tmp_path / "cache"]
    )
    assert not (tmp_path / "out" / "report.html").exists(), found


def test_spans(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, resumes, monkeypatch
) -> None:
    """The span list and its checksum file."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["spans", *_decompose(bert_dir, bert2_dir, corpus_txt)]
    resumes(
        [*args, "--out", str(tmp_path / "out" / "list.jsonl")],
        [tmp_path / "out", tmp_path / "cache"],
    )


def test_report(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, resumes, monkeypatch, capsys
) -> None:
    """The page, and the figures it draws into the run."""
    from hostile_helpers import run_cli

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "out" / "run"
    args = ["decompose", *_decompose(bert_dir, bert2_dir, corpus_txt), "--out", str(run)]
    code, stderr = run_cli([*args, "--no-progress"], monkeypatch, capsys)
    assert code == 0, stderr
    resumes(["report", str(run)], [tmp_path / "out"])


def test_evaluate_pos(
    bert_dir: Path, bert2_dir: Path, tmp_path: Path, resumes, monkeypatch
) -> None:
    """The tables and the record (``pos_config.json``); the tagger's scores stubbed (tested
    elsewhere)."""
    import lmalgebra.evaluate.pos_tagging as pos
    from lmalgebra.evaluate.pos_results import PosResult

    def scored(ref, *args, **kwargs) -> PosResult:
        zeros = dict.fromkeys(PosResult.__dataclass_fields__, 0)
        return PosResult(**zeros | {"model": ref.name, "mode": "probe"})

    monkeypatch.setattr(pos, "_evaluate", scored)
    bank = one_word_treebank(tmp_path / "bank")
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["evaluate-pos", str(bank), "--out", str(tmp_path / "pos"), "--no-progress"]
    args += ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    resumes(args, [tmp_path / "pos", tmp_path / "cache"])


def test_evaluate_pos_overwriting_another(
    bert_dir: Path,
    bert2_dir: Path,
    tmp_path: Path,
    resumes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--overwrite`` of an evaluation of another model: its three files removed, then this
    one's written; the tagger's scores stubbed."""
    import lmalgebra.evaluate.pos_tagging as pos
    from hostile_helpers import run_cli
    from lmalgebra.evaluate.pos_results import PosResult

    def scored(ref, *args, **kwargs) -> PosResult:
        zeros = dict.fromkeys(PosResult.__dataclass_fields__, 0)
        return PosResult(**zeros | {"model": ref.name, "mode": "probe"})

    monkeypatch.setattr(pos, "_evaluate", scored)
    bank = one_word_treebank(tmp_path / "bank")
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["evaluate-pos", str(bank), "--out", str(tmp_path / "pos"), "--no-progress"]
    code, stderr = run_cli([*args, "--models", f"a={bert_dir}"], monkeypatch, capsys)
    assert code == 0, stderr
    args += ["--models", f"a={bert2_dir}", "--overwrite"]
    resumes(args, [tmp_path / "pos", tmp_path / "cache"])


# --- the demos: every step resumes, so a demo stopped anywhere finishes as one never stopped ---

DEMOS = {
    "causal": ["demo", "--causal", "--quick"],
    "masked": ["demo", "--quick"],
    "packaged-lmd": ["demo-lmd", "--quick"],
    "real": ["demo", "--real", "--quick"],
}


@pytest.mark.slow
@pytest.mark.parametrize("demo", list(DEMOS))
def test_demo(demo: str, tmp_path: Path, resumes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each demo at its quick size (its corpora, teachers, runs, tables and page), and the
    cache it fills (packaged models, embeddings). The real demo's cache, which its first run
    fills with the two GGUF models dequantised (minutes), is kept between the trials (an
    interrupted dequantisation is tested in ``tests/sources``). The default run stops the quick
    causal demo at its last write (``tests/demo/test_causal_demo.py``)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = [*DEMOS[demo], "--out", str(tmp_path / "out" / "demo"), "--no-progress"]
    outputs = [tmp_path / "out"] if demo == "real" else [tmp_path / "out", tmp_path / "cache"]
    resumes(args, outputs, normalise=demo_steady)
