"""Bits per byte: parity with naive per-token loops in plain transformers, a tokenizer-invariance
derived from a uniform byte model, the windows, and the run-level command."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.distill import pipeline
from lmalgebra.distill.causal.bits_per_byte import bits_per_byte, score_texts, windows
from lmalgebra.distill.recipe import load_recipe, run_recipe
from tiny import documents, sentences

TEXTS = [*documents(4, seed=5), "Ça coûte 5 €, señor 😀.", "x"]


@pytest.fixture(scope="module")
def gpt2(gpt2_dir: Path):
    """The tiny GPT-2 of tests/tiny.py (byte-level BPE, an end-of-text token and no bos)."""
    return AutoModelForCausalLM.from_pretrained(gpt2_dir).eval(), AutoTokenizer.from_pretrained(
        gpt2_dir
    )


@torch.no_grad()
def _naive_nats(model, tokenizer, text: str, context: int) -> float:
    """Each token alone: the model run on the (at most ``context``) tokens before it."""
    ids = [tokenizer.eos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
    total = 0.0
    for t in range(1, len(ids)):
        before = torch.tensor([ids[max(0, t - context) : t]])
        total -= float(torch.log_softmax(model(input_ids=before).logits[0, -1], -1)[ids[t]])
    return total


def test_every_token_given_its_full_context_matches_a_naive_loop(gpt2) -> None:
    model, tokenizer = gpt2
    got = score_texts(model, tokenizer, TEXTS, context=12, stride=1, batch_size=5)
    want = sum(_naive_nats(model, tokenizer, t, 12) for t in TEXTS)
    assert got.nats == pytest.approx(want, rel=1e-5)
    data = sum(len(t.encode("utf-8")) for t in TEXTS)
    assert got.bytes == data and got.chars == sum(len(t) for t in TEXTS) < data
    assert got.bits_per_byte == pytest.approx(want / (math.log(2) * data), rel=1e-5)


@torch.no_grad()
def _hugging_face_sliding_window(model, tokenizer, text: str, length: int, stride: int) -> float:
    """The sliding-window perplexity of the transformers documentation, with the model's own
    loss (labels shifted inside the model), as summed NLL."""
    ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer(text)["input_ids"]]])
    total, previous_end = 0.0, 0
    for begin in range(0, ids.shape[1], stride):
        end = min(begin + length, ids.shape[1])
        target_length = end - previous_end
        window = ids[:, begin:end]
        labels = window.clone()
        labels[:, :-target_length] = -100
        scored = int((labels[:, 1:] != -100).sum())
        if scored:
            total += float(model(input_ids=window, labels=labels).loss) * scored
        previous_end = end
        if end == ids.shape[1]:
            break
    return total


def test_sliding_windows_match_the_transformers_recipe(gpt2) -> None:
    model, tokenizer = gpt2
    long = [" ".join(documents(3, seed=s)) for s in (1, 2)]
    got = score_texts(model, tokenizer, long, context=15, stride=6)
    want = sum(_hugging_face_sliding_window(model, tokenizer, t, 16, 6) for t in long)
    assert got.nats == pytest.approx(want, rel=1e-5)
    short = [*sentences(6, seed=3), "Ça coûte 5 €, señor 😀."]
    assert max(len(tokenizer(t)["input_ids"]) for t in short) < 255  # one window per text
    one_window = score_texts(model, tokenizer, short, context=255, batch_size=4)
    assert one_window.nats == pytest.approx(
        sum(_naive_nats(model, tokenizer, t, 255) for t in short), rel=1e-5
    )


@pytest.mark.parametrize("length", [2, 3, 10, 41])
@pytest.mark.parametrize(("context", "stride"), [(4, 1), (4, 2), (4, 4), (7, 3)])
def test_windows_score_every_target_once(length: int, context: int, stride: int) -> None:
    scored: list[int] = []
    for begin, end, first in windows(list(range(length)), context, stride):
        assert end - begin - 1 <= context and first >= 0
        scored += range(begin + 1 + first, end)
        assert first == 0 or first >= context - stride  # later windows: at least that context
    assert scored == list(range(1, length))


class _UniformOver(torch.nn.Module):
    """A model that gives every listed token the same probability, whatever came before: its
    body's states are zeros and its head's bias makes the logits (0 listed, -inf the rest)."""

    def __init__(self, vocab_size: int, allowed: list[int]):
        super().__init__()
        self.config = SimpleNamespace()
        self.head = torch.nn.Linear(1, vocab_size)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.fill_(-math.inf)
            self.head.bias[allowed] = 0.0

    def base_model(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return SimpleNamespace(last_hidden_state=torch.zeros(*input_ids.shape, 1))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return SimpleNamespace(logits=self.head(self.base_model(input_ids).last_hidden_state))


def _fixed_width(alphabet: list[str], width: int) -> PreTrainedTokenizerFast:
    """A tokenizer whose tokens are all the strings of ``width`` characters of ``alphabet``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    pieces = ["".join(p) for p in itertools.product(alphabet, repeat=width)]
    vocab = {"<s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("." * width), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")


def test_a_uniform_byte_model_gives_equal_bits_per_byte_under_two_tokenizations() -> None:
    """With A characters of 2 bytes each, a model uniform over the A characters (tokens of one
    character) and one uniform over the A^2 pairs (tokens of two) both give every text
    probability A^-length: log2(A) bits per character, log2(A) / 2 bits per byte."""
    alphabet = ["é", "ü", "ß", "ø"]
    rng = random.Random(0)
    texts = ["".join(rng.choices(alphabet, k=2 * rng.randint(1, 40))) for _ in range(12)]
    scores = []
    for width in (1, 2):
        tokenizer = _fixed_width(alphabet, width)
        model = _UniformOver(len(tokenizer), list(range(2, len(tokenizer))))
        scores.append(score_texts(model, tokenizer, texts, context=7, stride=3, batch_size=4))
    for score in scores:
        assert score.unknown_tokens == 0
        assert score.bits_per_char == pytest.approx(2.0, rel=1e-6)  # float32 log-softmax
        assert score.bits_per_byte == pytest.approx(1.0, rel=1e-6)
    assert scores[0].tokens == 2 * scores[1].tokens


@pytest.fixture(scope="module")
def causal_run(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("bpb-run")
    recipe = load_recipe(write_causal_recipe(root, causal_teacher_dirs, heldout_fraction=0.3))
    pipeline.prepare(recipe, progress=False)
    return recipe.output_dir


def test_bits_per_byte_of_a_model_directory(causal_teacher_dirs, gpt2) -> None:
    scores = bits_per_byte(causal_teacher_dirs["uni"], {"xx": TEXTS[:3], "yy": TEXTS[3:]})
    model = AutoModelForCausalLM.from_pretrained(causal_teacher_dirs["uni"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(causal_teacher_dirs["uni"])
    want = score_texts(model, tokenizer, TEXTS[3:], context=256)
    assert scores["yy"].nats == pytest.approx(want.nats, rel=1e-6)
    assert scores["yy"].bits_per_char > scores["yy"].bits_per_byte > 0


def test_merge_bits_per_byte_scores_the_runs_teachers(causal_run, monkeypatch, capsys) -> None:
    """Written beside the table of ``merge evaluate`` (whose RDT was computed from it), which
    it had replaced."""
    evaluated = causal_run / "evaluation" / "bits_per_byte.csv"
    evaluated.parent.mkdir(exist_ok=True)
    evaluated.write_text("as merge evaluate wrote it\n", encoding="utf-8")
    code, err = run_cli(["merge", "bits-per-byte", str(causal_run)], monkeypatch, capsys)
    assert code == 0, err
    assert evaluated.read_text(encoding="utf-8") == "as merge evaluate wrote it\n"
    evaluated.unlink()
    lines = (causal_run / "evaluation" / "scored_bits_per_byte.csv").read_text().splitlines()
    assert lines[0].startswith("language,model,documents,tokens,unknown_tokens,bytes,chars")
    assert {tuple(ln.split(",")[:2]) for ln in lines[1:]} == {
        (lang, t) for lang in ("xx", "yy") for t in ("bl", "uni", "wp")
    }


def test_a_masked_lm_is_not_scored(causal_run, teacher_dirs, monkeypatch, capsys) -> None:
    args = ["merge", "bits-per-byte", str(causal_run), "--models", f"bert={teacher_dirs['wp']}"]
    code, err = run_cli(args, monkeypatch, capsys)
    assert_one_line(code, err, ["model 'bert'", "holds a masked LM (BertForMaskedLM)"])
    args = ["merge", "bits-per-byte", str(causal_run), "--languages", "zz"]
    assert_one_line(*run_cli(args, monkeypatch, capsys), ["language 'zz' is not in"])


def test_a_model_of_random_weights_is_refused_not_scored_as_the_trained_one(
    causal_run, causal_teacher_dirs, monkeypatch, capsys
) -> None:
    """``--models uni=random:UNI`` had scored UNI's trained weights (the loader never built
    random ones) and written them under the teacher's name: refused, naming the model."""
    table = causal_run / "evaluation" / "scored_bits_per_byte.csv"
    before = table.read_bytes() if table.exists() else None
    args = ["merge", "bits-per-byte", str(causal_run), "--languages", "xx"]
    code, err = run_cli(
        [*args, "--models", f"uni=random:{causal_teacher_dirs['uni']}"], monkeypatch, capsys
    )
    assert_one_line(code, err, ["model 'uni' (random:", "must name a causal LM with weights"])
    assert (table.read_bytes() if table.exists() else None) == before


def test_a_later_call_keeps_the_rows_of_other_models_and_languages(
    causal_run, causal_teacher_dirs, tmp_path: Path, monkeypatch, capsys, caplog
) -> None:
    """A second ``merge bits-per-byte`` of another model had replaced the table, the first
    model's scores gone (exit 0): rows of other (language, model) pairs are kept, those scored
    again replaced, and a row scored on held-out text the run no longer holds is dropped,
    said so."""
    import logging
    import shutil

    run = tmp_path / "run"
    shutil.copytree(causal_run, run, ignore=shutil.ignore_patterns("evaluation"))
    table = run / "evaluation" / "scored_bits_per_byte.csv"

    def score(model: str, language: str) -> set[tuple[str, ...]]:
        args = ["merge", "bits-per-byte", str(run), "--languages", language]
        code, err = run_cli(
            [*args, "--models", f"{model}={causal_teacher_dirs[model]}"], monkeypatch, capsys
        )
        assert code == 0, err
        return {tuple(ln.split(",")[:2]) for ln in table.read_text().splitlines()[1:]}

    assert score("uni", "xx") == {("xx", "uni")}
    assert score("bl", "yy") == {("xx", "uni"), ("yy", "bl")}
    assert score("uni", "xx") == {("xx", "uni"), ("yy", "bl")}
    lines = table.read_text().splitlines()  # the yy row, as if scored on other held-out text
    fields = lines[2].split(",") if lines[2].startswith("yy") else lines[1].split(",")
    column = lines[0].split(",").index("heldout")
    edited = ",".join([*fields[:column], "0" * 64, *fields[column + 1 :]])
    table.write_text(
        "\n".join([lines[0], *(edited if ln.startswith("yy") else ln for ln in lines[1:])]) + "\n"
    )
    with caplog.at_level(logging.WARNING):
        assert score("wp", "xx") == {("xx", "uni"), ("xx", "wp")}
    assert "dropped the rows of bl (yy)" in caplog.text


def test_a_row_scored_on_held_out_text_edited_since_is_dropped(
    causal_teacher_dirs, tmp_path: Path, monkeypatch, capsys, caplog
) -> None:
    """One letter of a held-out document changed (so that it stays held out) and the
    language's examples drawn again: the row of a model scored on the old text had been kept
    beside those of the new (the same documents, bytes and characters). Each row records the
    digest of the held-out texts it was scored on."""
    import logging
    import shutil

    from lmalgebra.distill.examples import example_id, is_heldout

    recipe = load_recipe(write_causal_recipe(tmp_path, causal_teacher_dirs, heldout_fraction=0.3))
    pipeline.prepare(recipe, progress=False)
    table = recipe.output_dir / "evaluation" / "scored_bits_per_byte.csv"

    def score(model: str) -> set[tuple[str, ...]]:
        args = ["merge", "bits-per-byte", str(recipe.output_dir), "--languages", "yy"]
        code, err = run_cli(
            [*args, "--models", f"{model}={causal_teacher_dirs[model]}"], monkeypatch, capsys
        )
        assert code == 0, err
        return {tuple(ln.split(",")[:2]) for ln in table.read_text().splitlines()[1:]}

    assert score("bl") == {("yy", "bl")}
    corpus = tmp_path / "yy.txt"
    lines = corpus.read_text(encoding="utf-8").splitlines()
    held = next(i for i, ln in enumerate(lines) if is_heldout(example_id("yy", ln.strip()), 0.3))
    line = lines[held]
    edits = (line[:k] + c + line[k + 1 :] for k in range(40) for c in "qxz" if line[k] != c)
    lines[held] = next(e for e in edits if is_heldout(example_id("yy", e.strip()), 0.3))
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.rmtree(recipe.output_dir / "examples" / "yy")
    pipeline.prepare(recipe, progress=False)
    with caplog.at_level(logging.WARNING):
        assert score("uni") == {("yy", "uni")}
    assert "dropped the rows of bl (yy), scored on held-out text the run no longer" in caplog.text


def test_each_row_records_the_context_it_was_scored_with(
    causal_run, causal_teacher_dirs, tmp_path: Path, monkeypatch, capsys
) -> None:
    """``--models a=BL --context 8``, then ``--models b=BL`` (its 256 positions): the table
    had held the same model's two scores side by side with nothing saying which window gave
    which. Each row records its ``context``."""
    import csv
    import shutil

    run = tmp_path / "run"
    shutil.copytree(causal_run, run, ignore=shutil.ignore_patterns("evaluation"))
    for name, extra in (("a", ["--context", "8"]), ("b", [])):
        args = ["merge", "bits-per-byte", str(run), "--languages", "xx", *extra]
        code, err = run_cli(
            [*args, "--models", f"{name}={causal_teacher_dirs['bl']}"], monkeypatch, capsys
        )
        assert code == 0, err
    with (run / "evaluation" / "scored_bits_per_byte.csv").open(encoding="utf-8") as table:
        rows = {row["model"]: row for row in csv.DictReader(table)}
    assert {name: row["context"] for name, row in rows.items()} == {"a": "8", "b": "256"}
    assert rows["a"]["bits_per_byte"] != rows["b"]["bits_per_byte"]


def test_a_name_given_to_another_model_drops_its_earlier_rows(
    causal_run, causal_teacher_dirs, tmp_path: Path, monkeypatch, capsys, caplog
) -> None:
    """``--models a=BL`` on both languages, then ``--models a=UNI --languages xx``: the yy row
    of BL had been kept under ``a`` beside the xx row of UNI, one name for two models in one
    table. Each row records the model it scored; one of a name now given to another model is
    dropped, said so, and one of the same model kept."""
    import logging
    import shutil

    run = tmp_path / "run"
    shutil.copytree(causal_run, run, ignore=shutil.ignore_patterns("evaluation"))
    table = run / "evaluation" / "scored_bits_per_byte.csv"

    def score(model: str, *languages: str) -> dict[tuple[str, str], str]:
        args = ["merge", "bits-per-byte", str(run), "--models", f"a={causal_teacher_dirs[model]}"]
        for language in languages:
            args += ["--languages", language]
        code, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
        lines = table.read_text().splitlines()
        column = lines[0].split(",").index("reference")
        return {tuple(ln.split(",")[:2]): ln.split(",")[column].split("#")[0] for ln in lines[1:]}

    bl, uni = (f"transformers:{causal_teacher_dirs[m].resolve()}" for m in ("bl", "uni"))
    assert score("bl") == {("xx", "a"): bl, ("yy", "a"): bl}
    assert score("bl", "xx") == {("xx", "a"): bl, ("yy", "a"): bl}  # the same model: kept
    with caplog.at_level(logging.WARNING):
        assert score("uni", "xx") == {("xx", "a"): uni}
    assert "dropped the rows of a (yy), scored as another model" in caplog.text


def test_a_model_trained_again_at_the_same_path_drops_its_earlier_rows(
    causal_run, causal_teacher_dirs, tmp_path: Path, monkeypatch, capsys, caplog
) -> None:
    """``--models a=M`` on both languages, M trained again (its weights changed at the same
    path), then ``--models a=M --languages xx``: the yy row of the old weights had been kept
    beside the xx row of the new, one name for two models. A row records a digest of the
    model's files; one of a row an older release wrote without it is read by its path."""
    import logging
    import shutil

    from safetensors.torch import load_file, save_file

    run, model = tmp_path / "run", tmp_path / "m"
    shutil.copytree(causal_run, run, ignore=shutil.ignore_patterns("evaluation"))
    shutil.copytree(causal_teacher_dirs["bl"], model)
    table = run / "evaluation" / "scored_bits_per_byte.csv"

    def score(*languages: str) -> set[tuple[str, ...]]:
        args = ["merge", "bits-per-byte", str(run), "--models", f"a={model}"]
        for language in languages:
            args += ["--languages", language]
        code, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
        return {tuple(ln.split(",")[:2]) for ln in table.read_text().splitlines()[1:]}

    assert score() == {("xx", "a"), ("yy", "a")}
    # as the release before digests wrote it: no held-out digest, no digest of the model
    older = [
        ",".join(ln.split(",")[:-2]).split("#sha256=")[0] for ln in table.read_text().splitlines()
    ]
    table.write_text("\n".join(older) + "\n")
    assert score("xx") == {("xx", "a"), ("yy", "a")}  # the same model: kept
    assert score("yy") == {("xx", "a"), ("yy", "a")}  # each row with its digest now
    weights = load_file(str(model / "model.safetensors"))
    save_file(
        {k: v * 1.01 if v.is_floating_point() else v for k, v in weights.items()},
        str(model / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with caplog.at_level(logging.WARNING):
        assert score("xx") == {("xx", "a")}
    assert "dropped the rows of a (yy), scored as another model" in caplog.text


def test_a_gguf_file_is_one_model_however_its_path_is_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--models g=gguf:m.gguf`` for a run's teacher ``g: gguf:/abs/m.gguf`` (the same file)
    had been refused as another model under the teacher's name: the path was resolved with its
    ``gguf:`` prefix, as a relative path. Another file under the name is still another model."""
    from lmalgebra.distill.causal.bits_per_byte import _same_model, reference_of
    from lmalgebra.sources.models import ModelRef

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    relative, absolute = (
        ModelRef.parse("g=gguf:m.gguf"),
        ModelRef.parse(f"g=gguf:{tmp_path}/m.gguf"),
    )
    assert (
        reference_of(relative) == reference_of(absolute) == f"transformers:gguf:{tmp_path}/m.gguf"
    )
    assert _same_model(relative, absolute)
    assert not _same_model(ModelRef.parse("g=gguf:other.gguf"), absolute)


def test_under_a_launcher_the_other_ranks_take_the_main_ranks_bits_per_byte(
    causal_run, causal_teacher_dirs, tmp_path: Path, monkeypatch
) -> None:
    """``MergeRun.bits_per_byte`` in a script under ``torchrun`` had scored every model and
    written the table on every rank: a rank other than the main one returns the main rank's
    rows of this call, read back, scoring nothing."""
    import shutil

    import pandas as pd

    from lmalgebra import distributed
    from lmalgebra.api.merge import MergeRun
    from lmalgebra.distill.causal import bits_per_byte as module

    run = tmp_path / "run"
    shutil.copytree(causal_run, run, ignore=shutil.ignore_patterns("evaluation"))
    models = {name: causal_teacher_dirs[name] for name in ("uni", "bl")}
    MergeRun.load(run).bits_per_byte(models={"wp": causal_teacher_dirs["wp"]})  # kept beside
    first = MergeRun.load(run).bits_per_byte(models=models, languages=["xx"])
    table = (run / "evaluation" / "scored_bits_per_byte.csv").read_bytes()

    def scored(*_: object) -> None:
        raise AssertionError("a rank other than the main one scored")

    monkeypatch.setattr(distributed, "world", lambda: (1, 2))
    monkeypatch.setattr(distributed, "any_rank", lambda flag: flag)
    monkeypatch.setattr(module, "bits_per_byte", scored)
    again = MergeRun.load(run).bits_per_byte(models=models, languages=["xx"])
    pd.testing.assert_frame_equal(again, first)
    assert (run / "evaluation" / "scored_bits_per_byte.csv").read_bytes() == table


def test_a_runs_model_named_bare_is_told_how_to_score_it(
    causal_run, tmp_path, monkeypatch, capsys
) -> None:
    """``--models bl`` (a teacher's name) or ``--models student`` (a student's), meant as the
    run's model, was refused as another model of that name, with no word of how to score the
    run's own: the line names the flag (and the mapping) that does."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(causal_run, run)
    (run / "s1" / "model").mkdir(parents=True)
    (run / "s1" / "model" / "lmalgebra.json").write_text("{}", encoding="utf-8")
    for name, path in (("bl", run_recipe(run).teachers["bl"].path), ("s1", run / "s1" / "model")):
        args = ["merge", "bits-per-byte", str(run), "--models", name]
        line = assert_one_line(*run_cli(args, monkeypatch, capsys), ["name it otherwise"])
        assert f"--models {name}={path} (models={{{name!r}: {str(path)!r}}})" in line, line
